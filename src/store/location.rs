//! Where a store is, parsed once: a SQLite file or a PostgreSQL database
//! (its URL a [`PgUrl`], which shows only masked; `store::pgurl` says why).

pub use super::pgurl::{is_postgres, label, mask_given, PgUrl};
use crate::error::About;
use std::fmt;
use std::path::Path;

/// Where a store is, parsed once: a SQLite file, or a PostgreSQL database
/// (its URL parsed by the driver, shown only masked). Adding an engine adds
/// a variant here and an arm in [`super::open::engine`].
#[derive(Debug, Clone)]
pub enum Location {
    /// A SQLite file.
    Sqlite(std::path::PathBuf),
    /// A PostgreSQL database (boxed: a parsed configuration is large).
    Postgres(Box<PgUrl>),
}

impl Location {
    /// Parse a location given on the command line or in the environment.
    pub fn parse(location: &Path) -> crate::error::Result<Location> {
        if !is_postgres(location) {
            return Ok(Location::Sqlite(location.to_path_buf()));
        }
        PgUrl::parse(&location.to_string_lossy())
            .map(|url| Location::Postgres(Box::new(url)))
            .map_err(|e| {
                crate::error::Error::input(
                    About::Option("--registry"),
                    format!(
                        "postgres://…: not a PostgreSQL URL this program can read ({e}); write it \
                     as postgres://USER@HOST:PORT/DATABASE, with the password in PGPASSWORD"
                    ),
                )
            })
    }
}

/// The identity of a store's location, for telling two stores apart: a
/// PostgreSQL database by its URL as shown (user, hosts, ports, database;
/// never a password), a SQLite file by its resolved path and its device and
/// inode, so two spellings of one file are one store and a file put in its
/// place is another.
pub fn identity(location: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    if is_postgres(location) {
        return format!("postgresql {}", label(location));
    }
    let path = std::fs::canonicalize(location).unwrap_or_else(|_| location.to_path_buf());
    match std::fs::metadata(&path) {
        Ok(meta) => format!(
            "sqlite {} (device {}, inode {})",
            path.display(),
            meta.dev(),
            meta.ino()
        ),
        Err(_) => format!("sqlite {}", path.display()),
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Sqlite(path) => write!(f, "{}", path.display()),
            Location::Postgres(url) => url.fmt(f),
        }
    }
}

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

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Sqlite(path) => write!(f, "{}", path.display()),
            Location::Postgres(url) => url.fmt(f),
        }
    }
}

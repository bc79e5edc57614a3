//! A PostgreSQL URL, parsed once and shown only masked; a store location's
//! name for messages. Below every other module, since errors name stores.
//!
//! A PostgreSQL URL may carry a password, and a password may hold any
//! character (`postgres://u:SE/CR?ET@host/db` authenticates: the driver
//! takes the userinfo up to the last `@`). Scanning the text for where the
//! password ends is how one leaked; so the URL is parsed by the driver's own
//! parser ([`postgres::Config`]) into a [`PgUrl`], whose `Display` is built
//! from the parsed parts and has no way to print the password or any
//! option. Every message, report, audit row and written file names a store
//! through [`label`] or a `PgUrl`, never through the text it was given.

use std::fmt;
use std::path::Path;

/// Whether a store location names a PostgreSQL database.
pub fn is_postgres(location: &Path) -> bool {
    location
        .to_str()
        .is_some_and(|s| s.starts_with("postgres://") || s.starts_with("postgresql://"))
}

/// A PostgreSQL URL, parsed; shown only without its password.
#[derive(Clone)]
pub struct PgUrl {
    config: postgres::Config,
    shown: String,
}

impl PgUrl {
    /// Parse a `postgres://` URL with the driver's parser. The error never
    /// holds the URL's text (the driver's message names what is wrong).
    pub fn parse(url: &str) -> Result<PgUrl, String> {
        let config: postgres::Config = url.parse().map_err(|e: postgres::Error| {
            let cause = std::error::Error::source(&e).map_or(String::new(), |c| format!(": {c}"));
            format!("{e}{cause}")
        })?;
        let shown = shown(&config);
        Ok(PgUrl { config, shown })
    }

    /// The parsed configuration, password included, for connecting.
    pub fn config(&self) -> &postgres::Config {
        &self.config
    }
}

impl fmt::Display for PgUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for PgUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PgUrl({})", self.shown)
    }
}

/// `postgres://USER:***@HOST:PORT/DATABASE` from the parsed parts: the
/// password (when there is one) is always `***`, and options are left out.
fn shown(config: &postgres::Config) -> String {
    let mut out = String::from("postgres://");
    if let Some(user) = config.get_user() {
        out.push_str(&escape_part(user));
        if config.get_password().is_some() {
            out.push_str(":***");
        }
        out.push('@');
    }
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let name = match host {
                postgres::config::Host::Tcp(h) => escape_part(h),
                postgres::config::Host::Unix(p) => escape_part(&p.to_string_lossy()),
            };
            match ports.get(i).or(ports.first()) {
                Some(port) => format!("{name}:{port}"),
                None => name,
            }
        })
        .collect();
    out.push_str(&hosts.join(","));
    if let Some(db) = config.get_dbname() {
        out.push('/');
        out.push_str(&escape_part(db));
    }
    out
}

/// A part of the shown URL with the characters that would change how it
/// reads (`@ : / ? # %`, controls, spaces) percent-encoded.
fn escape_part(part: &str) -> String {
    let mut out = String::with_capacity(part.len());
    for c in part.chars() {
        if c.is_control() || c.is_whitespace() || "@:/?#%".contains(c) {
            let mut buf = [0; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A store location for messages, reports and audit rows: a file's path as
/// it is, or a PostgreSQL URL as [`PgUrl`] shows it. A URL the driver
/// cannot parse is not shown at all.
pub fn label(location: &Path) -> String {
    if !is_postgres(location) {
        return location.display().to_string();
    }
    match PgUrl::parse(&location.to_string_lossy()) {
        Ok(url) => url.to_string(),
        Err(_) => "postgres://(a URL that does not parse; not shown)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show_whatever_they_hold() {
        for (url, secret) in [
            (
                "postgres://pwuser:SE/CR?ET@db.example:5433/fleet",
                "SE/CR?ET",
            ),
            ("postgres://u:p@ss@host/db", "p@ss"),
            ("postgresql://u:hunter2@host/db?sslmode=disable", "hunter2"),
            (
                "postgres://u@host/db?password=s3cret&sslmode=disable",
                "s3cret",
            ),
            ("postgres://u:a%2Fb@host/db", "a/b"),
        ] {
            let shown = label(Path::new(url));
            assert!(!shown.contains(secret), "{url} showed as {shown}");
            assert!(!shown.contains(&secret.replace('/', "%2F")), "{shown}");
            assert!(shown.contains("***"), "{shown}");
        }
        assert_eq!(
            label(Path::new(
                "postgres://pwuser:SE/CR?ET@db.example:5433/fleet"
            )),
            "postgres://pwuser:***@db.example:5433/fleet"
        );
    }

    #[test]
    fn urls_without_passwords_and_files_show_as_they_are() {
        assert_eq!(
            label(Path::new("postgres://fleet@127.0.0.1:5432/registry")),
            "postgres://fleet@127.0.0.1:5432/registry"
        );
        assert_eq!(
            label(Path::new("/var/lib/fleet/registry.sqlite")),
            "/var/lib/fleet/registry.sqlite"
        );
        assert!(!label(Path::new("postgres://u:sec ret@h:notaport/db")).contains("sec"));
    }

    #[test]
    fn locations_are_told_apart() {
        assert!(is_postgres(Path::new("postgres://h/db")));
        assert!(is_postgres(Path::new("postgresql://h/db")));
        assert!(!is_postgres(Path::new("/tmp/postgres://x")));
        assert!(!is_postgres(Path::new("registry.sqlite")));
    }
}

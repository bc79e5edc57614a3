//! The one place a store location picks its engine. Adding an engine is a
//! folder under `store/` implementing [`super::seam`] and one arm here.

use super::location::Location;
use super::seam::Engine;
use crate::error::{About, Error, Result};
use std::path::Path;

/// The engine holding the store at `location`: a PostgreSQL database for a
/// `postgres://` (or `postgresql://`) URL, parsed once by the driver's own
/// parser; otherwise a SQLite file.
pub fn engine(location: &Path) -> Result<Box<dyn Engine>> {
    Ok(match Location::parse(location)? {
        Location::Sqlite(path) => Box::new(super::sqlite::Sqlite::at(path)),
        Location::Postgres(url) => Box::new(super::postgres::Postgres::at(*url, location)),
    })
}

/// `registry create`: a new registry at `location`. Only a SQLite file is
/// made this way (a PostgreSQL registry's tables are made by `registry
/// copy` or by its first worker). `Ok(false)` when the path exists already,
/// a symbolic link included, which is never followed.
pub fn create_registry(location: &Path) -> Result<bool> {
    match Location::parse(location)? {
        Location::Sqlite(path) => Ok(super::sqlite::worker::create_new(&path)?.is_some()),
        Location::Postgres(_) => Err(Error::input(
            About::Option("registry create"),
            "a PostgreSQL registry's tables are created by `fleet-retire registry copy` or by \
             its first worker (docs/multi-host.md); `registry create` makes a SQLite file",
        )),
    }
}

/// `registry versions`: the change record installed in an existing
/// PostgreSQL registry (`store::postgres::versions`), and the controller's
/// tables made when its owner runs it; `Ok(false)` when the record was
/// whole already. A SQLite registry gains its row versions from
/// `registry create` or its first apply.
pub fn install_versions(location: &Path) -> Result<bool> {
    match Location::parse(location)? {
        Location::Postgres(url) => {
            let made = super::postgres::versions::install_checked(&url)?;
            // The controller's tables, when the owner runs it.
            super::postgres::controller::make_tables(&url)?;
            Ok(made)
        }
        // A SQLite registry gains its row versions from `registry create`
        // or its first apply; here, the host scope's indexes.
        Location::Sqlite(path) => super::sqlite::scope::install_indexes(&path),
    }
}

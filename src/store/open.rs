//! The one place a store location picks its engine. Adding an engine is a
//! folder under `store/` implementing [`super::seam`] and one arm here.

use super::location::Location;
use super::seam::Engine;
use crate::error::Result;
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

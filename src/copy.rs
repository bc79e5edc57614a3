//! `registry copy`: a SQLite registry moved into PostgreSQL and proved the
//! same registry. The storage work, both engines' sides of it, is
//! `store::copy`; this module gives it the tokens it proves the copy by,
//! which are defined above the store.

use crate::error::Result;
use crate::row::Row;
pub use crate::store::copy::CopyReport;
use crate::store::leases::Lease;
use std::path::Path;

/// The tokens apply and plan use, so a copy is proved by the very values
/// that will be compared with it.
struct Fingerprints;

impl crate::store::copy::Tokens for Fingerprints {
    fn registry(&self, rows: &[Row]) -> String {
        crate::fingerprint::registry_fingerprint(rows)
    }

    fn external_state(&self, active: &[Lease]) -> String {
        crate::fingerprint::external_state_fingerprint(active)
    }

    fn lease_digest(&self, active: &[Lease]) -> String {
        crate::evidence::leases::full_digest(active)
    }
}

/// Copy the SQLite registry `from` (and the SQLite lease store `leases`,
/// when given) into the PostgreSQL database `to`, and prove it.
pub fn copy(from: &Path, leases: Option<&Path>, to: &str) -> Result<CopyReport> {
    crate::store::copy::copy(from, leases, to, &Fingerprints)
}

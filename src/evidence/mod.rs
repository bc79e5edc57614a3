//! Evidence: the only code that touches the world (registry file, lease
//! store, process table, host identity, clock). Every source is behind a
//! parameter (a path, a `/proc` root) so tests use real files, and every
//! probe answers "unknown" rather than guessing.

pub mod leases;
pub mod probe;
pub mod registry;

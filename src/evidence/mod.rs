//! Evidence: what a run reads from the world to judge — the registry and
//! lease store as stored, the process table, this host's identity, the
//! kernel's randomness. Every source is behind a parameter (a path, a
//! `/proc` root) so tests use real files, and every probe answers "unknown"
//! rather than guessing.
//!
//! Not everything that touches the world is here, and that is deliberate:
//! the statements that write the tables live beside their definitions in
//! `crate::store`, called only by `crate::worker` (a worker's own row) and
//! `crate::apply` (the guarded transaction); operator files (`profiles.json`,
//! saved plans, fixtures) are read strictly by `crate::jsonfile`; the clock
//! is `crate::time::now`.

pub mod leases;
pub mod probe;
pub mod registry;

/// `n` random bytes as lower-case hex, from the kernel.
pub fn random_hex(n: usize) -> crate::error::Result<String> {
    use std::io::Read;
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| {
            crate::error::Error::input(
                crate::error::About::Machine,
                format!("cannot read /dev/urandom for a random id: {e}"),
            )
        })?;
    Ok(crate::fingerprint::hex(&buf))
}

//! Evidence: the only code that touches the world (registry file, lease
//! store, process table, host identity, clock). Every source is behind a
//! parameter (a path, a `/proc` root) so tests use real files, and every
//! probe answers "unknown" rather than guessing.

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
            crate::error::Error::Input(format!("cannot read /dev/urandom for a random id: {e}"))
        })?;
    Ok(crate::fingerprint::hex(&buf))
}

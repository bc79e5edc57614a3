//! A PostgreSQL lease store as apply's fence: read through a connection of
//! its own, outside apply's registry transaction, so it sees leases
//! committed meanwhile.

use super::PgUrl;
use crate::error::{Result, Store};
use crate::store::leases::Lease;
use crate::store::seam::FenceSource;

/// The lease store's connection and name.
pub struct Fence {
    /// An autocommit connection: each read sees the latest commit.
    client: postgres::Client,
    /// The URL, password masked.
    label: String,
    /// Set between reads: apply judges for seconds between two fences,
    /// and a connection idle by right is not given up on ([`super::stall`]).
    idle: super::stall::Idle,
}

impl Fence {
    /// Connect, and read the active leases once: a store without the table
    /// fails now, not at the first fence.
    pub fn open(url: &PgUrl) -> Result<Fence> {
        let label = url.to_string();
        let (mut client, idle) = super::connect_watched(url, Store::Leases)?;
        super::read_leases(&mut client, &label, true)?;
        idle.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(Fence {
            client,
            label,
            idle,
        })
    }

    /// `read` with the connection marked in use while it runs.
    fn in_use<T>(&mut self, read: impl FnOnce(&mut postgres::Client, &str) -> T) -> T {
        use std::sync::atomic::Ordering::SeqCst;
        self.idle.store(false, SeqCst);
        let out = read(&mut self.client, &self.label);
        self.idle.store(true, SeqCst);
        out
    }
}

impl FenceSource for Fence {
    fn label(&self) -> String {
        self.label.clone()
    }

    /// The server's digest of every active lease row.
    fn version(&mut self) -> Result<String> {
        self.in_use(super::active_lease_version)
    }

    fn read_active(&mut self) -> Result<Vec<Lease>> {
        let mut leases = self.in_use(|c, label| super::read_leases(c, label, true))?;
        leases.retain(Lease::is_active);
        Ok(leases)
    }
}

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
}

impl Fence {
    /// Connect, and read the active leases once: a store without the table
    /// fails now, not at the first fence.
    pub fn open(url: &PgUrl) -> Result<Fence> {
        let label = url.to_string();
        let mut client = super::connect_to(url, Store::Leases)?;
        super::read_leases(&mut client, &label, true)?;
        Ok(Fence { client, label })
    }
}

impl FenceSource for Fence {
    fn label(&self) -> String {
        self.label.clone()
    }

    /// The server's digest of every active lease row.
    fn version(&mut self) -> Result<String> {
        super::active_lease_version(&mut self.client, &self.label)
    }

    fn read_active(&mut self) -> Result<Vec<Lease>> {
        let mut leases = super::read_leases(&mut self.client, &self.label, true)?;
        leases.retain(Lease::is_active);
        Ok(leases)
    }
}

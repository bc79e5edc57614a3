//! Whether a change of the registry concerns this host's scope: the cheap
//! check a controller makes every retry period between ticks
//! (docs/controller.md, "Ticks").
//!
//! The store says which rows changed since the mark taken before the last
//! tick (`ControllerRows::changes`: SQLite's row versions, PostgreSQL's
//! change record), each read as it is now: only those rows are read. A
//! change concerns the scope when the row is, or was at the last tick, one
//! of the rows that tick read (this host's active rows and their peers),
//! when it is now this host's, or when it shares a key with this host's
//! rows (it may have become a peer). A row gone whose identity the store
//! cannot name, or a change the store cannot list, concerns it too. One
//! change is let pass: an own row that was live at the last tick and
//! whose only difference is its heartbeat (a live worker heartbeating
//! makes nothing a candidate; its expiry moved later). A change let pass
//! by mistake only delays a retirement to the next resync: every tick
//! judges afresh and the apply re-judges under its lock.

use crate::plan::Plan;
use crate::row::{Col, Row};
use crate::store::controller::{Changed, ChangesSince};
use std::collections::{HashMap, HashSet};

/// At most this many changed rows are read by one check; beyond it the
/// check gives up and a tick runs.
pub const LIMIT: usize = 10_000;

/// What the last tick read, to judge changes against.
#[derive(Debug, Default)]
pub struct Interest {
    /// This host's id.
    host: String,
    /// The identities of every row the tick read (own and peers).
    identities: HashSet<String>,
    /// Every key a peer is fetched by (any column: a superset).
    keys: HashSet<String>,
    /// Own rows live at the tick: identity → digest without heartbeat.
    live: HashMap<String, u128>,
}

/// What a check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Nothing changed.
    Quiet,
    /// Rows changed, none of this host's scope.
    Elsewhere,
    /// A change of this host's scope (or any, when the tick read the whole
    /// registry): a tick is due. Why, for the log.
    Here(String),
}

impl Interest {
    /// What a scoped plan read: its own rows (the plan's) and the peers'
    /// identities (`peers`, which the plan dropped).
    pub fn of(plan: &Plan, host: &str, peers: &[Row]) -> Interest {
        let mut i = Interest {
            host: host.to_string(),
            ..Interest::default()
        };
        for row in plan.rows.iter().chain(peers) {
            i.identities.insert(row.get(Col::WorkerIdentity).canon());
        }
        let own_keys = crate::store::scope::PeerKeys::of(&plan.rows);
        for (_, _, set) in own_keys.columns() {
            i.keys.extend(set.iter().cloned());
        }
        for e in &plan.entries {
            let row = &plan.rows[e.index];
            if crate::plan::planned::live_now(&plan.facts, row, plan.observation(e)) {
                let identity = row.get(Col::WorkerIdentity).canon();
                i.live
                    .insert(identity, crate::plan::planned::row_digests(row).1);
            }
        }
        i
    }

    /// Whether `row` (as it is now) concerns the scope.
    fn concerns(&self, row: &Row) -> Option<String> {
        let identity = row.get(Col::WorkerIdentity).canon();
        if let Some(quiet) = self.live.get(&identity) {
            if crate::plan::planned::row_digests(row).1 == *quiet {
                // A live row's heartbeat moved, and nothing else.
                return None;
            }
        }
        let why = |what: &str| Some(format!("{what} {}", crate::text::esc(&identity)));
        if self.identities.contains(&identity) {
            return why("a row the last tick read changed:");
        }
        if row.get(Col::HostId).canon() == self.host {
            return why("a row of this host changed:");
        }
        let mut keys = crate::store::scope::PeerKeys::of(std::slice::from_ref(row));
        // A peer is fetched by its instance whatever its namespace.
        keys.instances
            .insert(row.get(Col::ClientInstanceId).canon());
        let shares = keys
            .columns()
            .iter()
            .any(|(_, _, set)| set.iter().any(|k| !k.is_empty() && self.keys.contains(k)));
        shares.then(|| {
            format!(
                "a row sharing a key with this host's rows changed: {}",
                crate::text::esc(&identity)
            )
        })
    }
}

/// Judge what the store says changed against `interest` (`None`: the last
/// tick read the whole registry, or there was none: any change counts).
pub fn judge(changes: &ChangesSince, interest: Option<&Interest>) -> Found {
    let rows = match changes {
        ChangesSince::Unknown(why) => {
            return Found::Here(format!("the store cannot list the changes: {why}"))
        }
        ChangesSince::Rows(rows) if rows.is_empty() => return Found::Quiet,
        ChangesSince::Rows(rows) => rows,
    };
    let Some(interest) = interest else {
        return Found::Here(format!("{} row(s) changed", rows.len()));
    };
    for changed in rows {
        let why = match changed {
            Changed::Row(row) => interest.concerns(row),
            Changed::Gone(None) => Some("a row was deleted".into()),
            Changed::Gone(Some(identity)) => interest.identities.contains(identity).then(|| {
                format!(
                    "a row the last tick read was deleted: {}",
                    crate::text::esc(identity)
                )
            }),
        };
        if let Some(why) = why {
            return Found::Here(why);
        }
    }
    Found::Elsewhere
}

/// The rows a check read.
pub fn rows_read(changes: &ChangesSince) -> usize {
    match changes {
        ChangesSince::Rows(rows) => rows.iter().filter(|c| matches!(c, Changed::Row(_))).count(),
        ChangesSince::Unknown(_) => 0,
    }
}

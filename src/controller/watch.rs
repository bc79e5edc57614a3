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
use crate::store::scope::Scope;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

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

    /// Why `row` (as it is now) concerns the scope, if it does; `None`
    /// with `heartbeat` set when only a live own row's heartbeat moved.
    fn concerns(&self, row: &Row, heartbeat: &mut bool) -> Option<String> {
        let identity = row.get(Col::WorkerIdentity).canon();
        if let Some(quiet) = self.live.get(&identity) {
            if crate::plan::planned::row_digests(row).1 == *quiet {
                // A live row's heartbeat moved, and nothing else.
                *heartbeat = true;
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

/// What a check made of the changes.
pub struct Judgement {
    /// Whether a tick is due.
    pub found: Found,
    /// The own live rows whose heartbeat alone moved, as they are now (to
    /// keep the scope read last exact, [`Cache::patch`]).
    pub heartbeats: Vec<Row>,
    /// The changed rows that concern the scope, as they are now, when
    /// every change that does is such a row (`None`: a row deleted, a
    /// change the store cannot list, no interest): [`Cache::absorb`].
    pub here: Option<Vec<Row>>,
}

/// Judge what the store says changed against `interest` (`None`: the last
/// tick read the whole registry, or there was none: any change counts).
pub fn judge(changes: &ChangesSince, interest: Option<&Interest>) -> Judgement {
    let done = |found, here| Judgement {
        found,
        heartbeats: Vec::new(),
        here,
    };
    let rows = match changes {
        ChangesSince::Unknown(why) => {
            return done(
                Found::Here(format!("the store cannot list the changes: {why}")),
                None,
            )
        }
        ChangesSince::Rows(rows) if rows.is_empty() => return done(Found::Quiet, None),
        ChangesSince::Rows(rows) => rows,
    };
    let Some(interest) = interest else {
        return done(Found::Here(format!("{} row(s) changed", rows.len())), None);
    };
    let mut heartbeats = Vec::new();
    let mut first: Option<String> = None;
    let mut here = Some(Vec::new());
    for changed in rows {
        let mut heartbeat = false;
        let why = match changed {
            Changed::Row(row) => interest.concerns(row, &mut heartbeat),
            Changed::Gone(None) => Some("a row was deleted".into()),
            Changed::Gone(Some(identity)) => interest.identities.contains(identity).then(|| {
                format!(
                    "a row the last tick read was deleted: {}",
                    crate::text::esc(identity)
                )
            }),
        };
        if let Some(why) = why {
            first.get_or_insert(why);
            match (changed, &mut here) {
                (Changed::Row(row), Some(rows)) => rows.push(row.clone()),
                _ => here = None,
            }
        } else if let (true, Changed::Row(row)) = (heartbeat, changed) {
            heartbeats.push(row.clone());
        }
    }
    match first {
        Some(why) => Judgement {
            found: Found::Here(why),
            heartbeats,
            here,
        },
        None => Judgement {
            found: Found::Elsewhere,
            heartbeats,
            here: None,
        },
    }
}

/// The scope the last tick read, kept while the change record shows that
/// nothing of it changed but live rows' heartbeats (patched in): a tick
/// then plans it again without reading it (a resync, a heartbeat's
/// expiry), probing this host's processes afresh. Read again after any
/// change that concerns it, when the store keeps no change record or
/// cannot be read, and at least every [`Cache::MAX_AGE_INTERVALS`]
/// intervals (a backstop for a write no trigger stamped).
#[derive(Default)]
pub struct Cache {
    kept: Option<(Scope, Instant)>,
    /// The identities of the changed rows patched in since the last tick
    /// ([`Cache::absorb`]): rows a check read in place of the tick.
    absorbed: HashSet<String>,
}

impl Cache {
    /// How many resync intervals a kept scope serves at most.
    pub const MAX_AGE_INTERVALS: u32 = 10;

    /// The kept scope, if it still stands and is younger than `max_age`.
    pub fn fresh(&self, max_age: Duration) -> Option<(Scope, Instant)> {
        self.kept
            .as_ref()
            .filter(|(_, at)| at.elapsed() < max_age)
            .map(|(s, at)| (s.clone(), *at))
    }

    /// Whether a scope is kept, younger than `max_age`.
    pub fn holds(&self, max_age: Duration) -> bool {
        self.kept
            .as_ref()
            .is_some_and(|(_, at)| at.elapsed() < max_age)
    }

    /// Keep `scope`, read at `at`.
    pub fn keep(&mut self, scope: Scope, at: Instant) {
        self.kept = Some((scope, at));
        self.absorbed.clear();
    }

    /// Read it again at the next tick.
    pub fn forget(&mut self) {
        self.kept = None;
        self.absorbed.clear();
    }

    /// How many changed rows were patched in since the last tick (the
    /// rows the checks read for it); counted once.
    pub fn take_absorbed(&mut self) -> usize {
        let n = self.absorbed.len();
        self.absorbed.clear();
        n
    }

    /// Changed rows that concern the scope, as they are now, patched into
    /// the kept scope when that leaves it exactly what a read would return
    /// now; otherwise it is forgotten (read again at the next tick).
    ///
    /// Exact when every row is one the scope holds under its identity (one
    /// row of that identity), and it stays what it was to the scoped read:
    /// an own row keeps its `host_id` and `status` (still this host's and
    /// active) and the own rows' keys ([`PeerKeys`]) stay the same set, so
    /// the peers fetched by them are the same rows; a peer keeps every
    /// column the read selects it by. Any other row the read would now
    /// return differently changed too and is in the same check's changes:
    /// it is not one the scope holds, so nothing is patched. A write that
    /// renames a row onto the identity of another row of the scope is
    /// patched in that row's place: the plan is then wrong until the scope
    /// is read again (an apply's refusal forgets it, `tick.rs`); it never
    /// retires by it, since the apply reads and judges the scope again
    /// under its lock.
    ///
    /// [`PeerKeys`]: crate::store::scope::PeerKeys
    pub fn absorb(&mut self, rows: &[Row]) {
        if !self.try_absorb(rows) {
            self.forget();
        }
    }

    fn try_absorb(&mut self, rows: &[Row]) -> bool {
        use crate::store::scope::PeerKeys;
        let Some((scope, _)) = &mut self.kept else {
            return false;
        };
        // Identity → (own, index), for identities one row of the scope holds.
        let mut at: HashMap<String, Option<(bool, usize)>> = HashMap::new();
        for (own, list) in [(true, &scope.own), (false, &scope.peers)] {
            for (i, r) in list.iter().enumerate() {
                at.entry(r.get(Col::WorkerIdentity).canon())
                    .and_modify(|e| *e = None)
                    .or_insert(Some((own, i)));
            }
        }
        let selects_peer = [
            Col::WorkerIdentity,
            Col::HostId,
            Col::Status,
            Col::SessionId,
            Col::GenerationId,
            Col::ProcessIdentity,
            Col::Pid,
            Col::ClientInstanceId,
            Col::Namespace,
        ];
        let mut patched = HashSet::new();
        let mut own_moved = false;
        let keys_were = PeerKeys::of(&scope.own);
        for row in rows {
            let identity = row.get(Col::WorkerIdentity).canon();
            let Some(Some((own, i))) = at.get(&identity).copied() else {
                return false;
            };
            if !patched.insert(identity) {
                return false;
            }
            let old = if own { &scope.own[i] } else { &scope.peers[i] };
            let same = |cols: &[Col]| cols.iter().all(|c| row.get(*c) == old.get(*c));
            if own && !same(&[Col::HostId, Col::Status]) || !own && !same(&selects_peer) {
                return false;
            }
            own_moved |= own;
            if own {
                scope.own[i] = row.clone();
            } else {
                scope.peers[i] = row.clone();
            }
        }
        if own_moved && PeerKeys::of(&scope.own) != keys_were {
            return false;
        }
        self.absorbed.extend(patched);
        true
    }

    /// Own rows whose heartbeat alone moved, as they are now.
    pub fn patch(&mut self, rows: &[Row]) {
        let Some((scope, _)) = &mut self.kept else {
            return;
        };
        if rows.is_empty() {
            return;
        }
        let at: HashMap<String, usize> = scope
            .own
            .iter()
            .enumerate()
            .map(|(i, r)| (r.get(Col::WorkerIdentity).canon(), i))
            .collect();
        for row in rows {
            match at.get(&row.get(Col::WorkerIdentity).canon()) {
                Some(i) => scope.own[*i] = row.clone(),
                None => {
                    // Not found where it was: read the scope again.
                    self.forget();
                    return;
                }
            }
        }
    }
}

/// The rows a check read.
pub fn rows_read(changes: &ChangesSince) -> usize {
    match changes {
        ChangesSince::Rows(rows) => rows.iter().filter(|c| matches!(c, Changed::Row(_))).count(),
        ChangesSince::Unknown(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Value;

    fn row(identity: &str, host: &str, session: &str, run: &str) -> Row {
        let mut r = Row::default();
        r.set(Col::WorkerIdentity, Value::Text(identity.into()));
        r.set(Col::HostId, Value::Text(host.into()));
        r.set(Col::Status, Value::Text("active".into()));
        r.set(Col::SessionId, Value::Text(session.into()));
        r.set(Col::FleetRunId, Value::Text(run.into()));
        r
    }

    fn kept() -> Cache {
        let mut c = Cache::default();
        let scope = Scope {
            host_id: "h".into(),
            own: vec![row("a", "h", "s-a", "r"), row("b", "h", "s-b", "r")],
            peers: vec![row("p", "other", "s-a", "r")],
            terminal: 0,
        };
        c.keep(scope, Instant::now());
        c
    }

    #[test]
    fn a_change_outside_the_keys_is_patched_and_a_key_change_is_not() {
        let mut c = kept();
        c.absorb(&[row("b", "h", "s-b", "moved"), row("p", "other", "s-a", "x")]);
        let (scope, _) = c.fresh(Duration::from_secs(60)).expect("kept");
        assert_eq!(scope.own[1].get(Col::FleetRunId).canon(), "moved");
        assert_eq!(scope.peers[0].get(Col::FleetRunId).canon(), "x");
        assert_eq!(c.take_absorbed(), 2);
        // An own row's new session: a key the read fetches peers by.
        c.absorb(&[row("b", "h", "s-new", "r")]);
        assert!(c.fresh(Duration::from_secs(60)).is_none());
        // A peer's session moved: it may no longer be a peer.
        let mut c = kept();
        c.absorb(&[row("p", "other", "s-b", "r")]);
        assert!(c.fresh(Duration::from_secs(60)).is_none());
        // A row the scope does not hold, or an own row moved to another host.
        for changed in [row("z", "h", "s-z", "r"), row("a", "other", "s-a", "r")] {
            let mut c = kept();
            c.absorb(&[changed]);
            assert!(c.fresh(Duration::from_secs(60)).is_none());
        }
    }
}

//! The rows a plan judged, kept so that apply can tell a registry that only
//! heartbeated from one that changed (docs/apply.md, "Heartbeats between plan
//! and apply").
//!
//! `registry_fingerprint` covers every row's `last_heartbeat_at`, so in a
//! fleet whose live workers heartbeat every few seconds an exact comparison
//! refuses nearly every apply made a minute after its plan. With the plan's
//! rows at hand (a saved plan file carries them; `serve` keeps those of the
//! plans it issued), apply compares row by row and tolerates exactly one kind
//! of difference: `last_heartbeat_at` moved on a row that was live at the
//! plan's clock and is live at apply's. Anything else is still
//! `registry_revision_moved`. The re-plan, the candidate token, the re-probe,
//! the fence and the guarded `UPDATE` stay the authority.

use crate::fingerprint::{serialize_row_into, serialize_row_marking, serialize_row_masking};
use crate::plan::Plan;
use crate::row::Col;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Arc;

/// One judged row, as digests. Its on-disk form (a saved plan's
/// `planned_rows`, a kept plan of `serve`) is `crate::plan::saved`'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedRow {
    /// The row's identity (canonical text), for reports.
    pub worker_identity: String,
    /// The first 128 bits of the sha256 of the row's canonical fingerprint
    /// fields.
    pub row_digest: u128,
    /// The same with `last_heartbeat_at` left out.
    pub digest_without_heartbeat: u128,
    /// Live (semantics of `live`: active, heartbeat fresh, pid not known
    /// dead) at the plan's clock.
    pub live: bool,
    /// The row's reason codes in the plan, primary first
    /// (`eligible_stale_orphan` alone for a candidate), so an apply can say
    /// which verdicts moved and which moved only because time passed.
    /// Absent in plans saved before they were recorded. Rows in one
    /// situation share one list.
    pub reason_codes: Option<Arc<[String]>>,
    /// A candidate's peer facts in the plan ([`peer_text`]): what its
    /// verdict read of other rows, so an apply can tell that a row moving
    /// beside it left its verdict's inputs alone (semantics §13). Absent
    /// for rows kept, and in plans saved before it was recorded.
    pub peers: Option<String>,
}

/// A row's peer facts as one line: the active claimants of its instance
/// slot, the occupants among them, and the identity evidence it shares.
pub fn peer_text(peers: &crate::observe::PeerFacts) -> String {
    format!(
        "slot_active_claimants={} slot_occupants={} shared_identity_evidence=[{}]",
        peers.slot_active_claimants,
        peers.slot_occupants,
        peers.shared_identity_evidence.join(",")
    )
}

/// [`VerdictMoved::then`] of a row the plan did not judge (added since, or
/// its identity changed).
pub const ADDED_SINCE_PLAN: &str = "added_since_plan";

/// A row whose verdict differs between the plan and the apply's re-plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerdictMoved {
    /// The row's identity.
    pub worker_identity: String,
    /// Its primary reason code in the plan (`eligible_stale_orphan`: a
    /// candidate), or [`ADDED_SINCE_PLAN`] for a row the plan did not judge.
    pub then: String,
    /// Its primary reason code now.
    pub now: String,
    /// Its entry in the re-derived plan.
    #[serde(skip)]
    pub entry: usize,
}

/// Every row a plan judged, with the token they make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedRows {
    /// The plan's `registry_fingerprint` (these rows are what it covers).
    pub registry_fingerprint: String,
    /// The rows, in registry order.
    pub rows: Vec<PlannedRow>,
}

/// The first 128 bits of a sha256: a row's digest. A second preimage of
/// 128 bits is out of reach, and the digest stands only for rows the
/// registry holds (docs/apply.md, "Heartbeats between plan and apply").
fn first_128(digest: &[u8]) -> u128 {
    u128::from_be_bytes(digest[..16].try_into().expect("sha256 has 32 bytes"))
}

/// The first 128 bits of the sha256 of `text` ([`first_128`]).
pub fn digest128(text: &str) -> u128 {
    first_128(&Sha256::digest(text.as_bytes()))
}

/// The two digests of one row: all fingerprint fields, and all but the
/// heartbeat. The row is serialized once: the text before the heartbeat's
/// value is hashed once for both, and the digest without it continues
/// after it (the same text as `serialize_row_masking`'s).
pub fn row_digests(row: &crate::row::Row) -> (u128, u128) {
    let mut text = String::with_capacity(1024);
    let heartbeat = serialize_row_marking(row, Col::LastHeartbeatAt, &mut text);
    let mut full = Sha256::new();
    full.update(&text.as_bytes()[..heartbeat.start]);
    let mut quiet = full.clone();
    full.update(&text.as_bytes()[heartbeat.start..]);
    quiet.update(&text.as_bytes()[heartbeat.end..]);
    (first_128(&full.finalize()), first_128(&quiet.finalize()))
}

/// Live as §13 reads it. A row of another host is live by its heartbeat
/// alone: this host's process table cannot speak for its pid (the same rule
/// as the snapshot's, docs/semantics.md §15), and a foreign pid that
/// happens to be free here must not make every heartbeat of that host's
/// workers refuse the apply. Such rows are never candidates here.
fn live_here(plan: &Plan, e: &crate::plan::Entry) -> bool {
    live_now(&plan.facts, &plan.rows[e.index], plan.observation(e))
}

/// [`live_here`] of a row and its observation under a run's facts.
pub fn live_now(
    facts: &crate::observe::RunFacts,
    row: &crate::row::Row,
    obs: &crate::observe::Observation,
) -> bool {
    match facts.host.host_id.as_deref() {
        Some(mine) if crate::observe::of_another_host(row, mine) => {
            !obs.historical && obs.liveness.heartbeat_fresh == Some(true)
        }
        _ => obs.liveness.live,
    }
}

/// A row's reason codes, primary first; a candidate's is its one code.
fn codes_of(e: &crate::plan::Entry) -> Arc<[String]> {
    if e.is_candidate() {
        return Arc::from(vec![e.reason().code().to_string()]);
    }
    let codes: Vec<String> = e
        .reason_codes()
        .iter()
        .map(|r| r.code().to_string())
        .collect();
    if codes.is_empty() {
        Arc::from(vec![e.reason().code().to_string()])
    } else {
        Arc::from(codes)
    }
}

/// Whether two rows serialize alike in every fingerprint field: the same
/// storage class and the same value, a real by its bits (0.0 and -0.0 are
/// equal numbers written two ways), so their digests are the same.
pub fn same_fingerprint_fields(a: &crate::row::Row, b: &crate::row::Row) -> bool {
    use crate::value::Val;
    crate::fingerprint::FINGERPRINT_FIELDS
        .iter()
        .all(|c| match (a.get(*c), b.get(*c)) {
            (Val::Real(x), Val::Real(y)) => x.to_bits() == y.to_bits(),
            (x, y) => x == y,
        })
}

/// The digests of the row at `index` of `rows`: those an earlier plan
/// recorded for its row at the same place when the two rows serialize
/// alike ([`same_fingerprint_fields`]), else computed. A server plans the
/// same registry again and again, and most rows (historical ones above all)
/// have not changed since: comparing them is a tenth of hashing them.
fn digests_at(
    rows: &[crate::row::Row],
    index: usize,
    earlier: Option<(&[crate::row::Row], &PlannedRows)>,
) -> (u128, u128) {
    let row = &rows[index];
    let kept = earlier.and_then(|(then_rows, then)| {
        let planned = then.rows.get(index)?;
        let same = then.rows.len() == then_rows.len()
            && same_fingerprint_fields(then_rows.get(index)?, row);
        same.then_some((planned.row_digest, planned.digest_without_heartbeat))
    });
    kept.unwrap_or_else(|| row_digests(row))
}

impl PlannedRows {
    /// The rows of a plan. Rows in one situation share their verdict, and
    /// so one list of reason codes.
    pub fn of(plan: &Plan) -> PlannedRows {
        PlannedRows::of_after(plan, None)
    }

    /// The rows of a plan, taking each unchanged row's digests from the
    /// plan made before it on the same registry (its rows, and what this
    /// function made of them), when there is one.
    pub fn of_after(plan: &Plan, earlier: Option<(&Plan, &PlannedRows)>) -> PlannedRows {
        let earlier = earlier.map(|(p, r)| (p.rows.as_slice(), r));
        // Keyed by the verdict's address (as a number, which threads share).
        let mut codes: HashMap<usize, Arc<[String]>> = HashMap::new();
        for e in &plan.entries {
            codes
                .entry(Arc::as_ptr(&e.verdict) as usize)
                .or_insert_with(|| codes_of(e));
        }
        let rows = crate::pool::par_map(&plan.entries, |e| {
            let (row_digest, digest_without_heartbeat) = digests_at(&plan.rows, e.index, earlier);
            PlannedRow {
                worker_identity: plan.identity(e),
                row_digest,
                digest_without_heartbeat,
                live: live_here(plan, e),
                reason_codes: Some(codes[&(Arc::as_ptr(&e.verdict) as usize)].clone()),
                peers: e
                    .is_candidate()
                    .then(|| peer_text(&plan.observation(e).peers)),
            }
        });
        PlannedRows {
            registry_fingerprint: plan.registry_fingerprint.clone(),
            rows,
        }
    }

    /// The plan's candidates, in registry order (empty for a plan saved
    /// without its verdicts).
    pub fn candidates(&self) -> Vec<String> {
        let eligible = crate::reasons::Reason::Eligible.code();
        self.rows
            .iter()
            .filter(|r| r.reason_codes.as_deref().is_some_and(|c| c == [eligible]))
            .map(|r| r.worker_identity.clone())
            .collect()
    }

    /// The rows that were candidates then and are not now, or the other
    /// way round, matched by identity; `None` when this plan was saved
    /// without its verdicts.
    pub fn verdicts_moved(&self, now: &Plan) -> Option<Vec<VerdictMoved>> {
        // Most identities are on one row: the list holds more only then.
        let mut then: rustc_hash::FxHashMap<&str, Vec<&[String]>> = Default::default();
        then.reserve(self.rows.len());
        for r in &self.rows {
            let codes = r.reason_codes.as_deref().filter(|c| !c.is_empty())?;
            then.entry(r.worker_identity.as_str())
                .or_insert_with(|| Vec::with_capacity(1))
                .push(codes);
        }
        let eligible = crate::reasons::Reason::Eligible.code();
        let mut moved = Vec::new();
        for (entry, e) in now.entries.iter().enumerate() {
            let shown = now.rows[e.index].get(Col::WorkerIdentity);
            let named = shown.canon_cow();
            let identity = || named.clone().into_owned();
            let Some(codes) = then.get_mut(named.as_ref()).filter(|c| !c.is_empty()) else {
                // A row added since the plan (or whose identity changed)
                // that is a candidate now: it moved from nowhere.
                if e.is_candidate() {
                    moved.push(VerdictMoved {
                        worker_identity: identity(),
                        then: ADDED_SINCE_PLAN.into(),
                        now: e.reason().code().to_string(),
                        entry,
                    });
                }
                continue;
            };
            let was = codes.remove(0);
            if (was[0] == eligible) != e.is_candidate() {
                moved.push(VerdictMoved {
                    worker_identity: identity(),
                    then: was[0].clone(),
                    now: e.reason().code().to_string(),
                    entry,
                });
            }
        }
        Some(moved)
    }

    /// Per digest without the heartbeat, whether every
    /// planned row of that digest was live when planned: looked up for
    /// each row that heartbeated since (apply's confirmation under its
    /// lock, built before it).
    pub fn live_index(&self) -> HashMap<u128, bool> {
        let mut index: HashMap<u128, bool> = HashMap::with_capacity(self.rows.len());
        for r in &self.rows {
            let live = index.entry(r.digest_without_heartbeat).or_insert(true);
            *live &= r.live;
        }
        index
    }

    /// Compare with a plan re-derived now. `Ok` lists the workers whose
    /// heartbeat alone moved, on rows live then and now; the candidates of
    /// the plan that have been retired since (an earlier batch of it:
    /// `status` is `retired` and nothing else of the row moved); and the
    /// rows added or changed otherwise, none of which was a candidate of
    /// the plan (they refuse nothing by themselves: semantics §13, "Rows
    /// added or changed beside the targets"). `Err` says what cannot be
    /// vouched for: a row deleted, or a candidate of the plan (or any row,
    /// for a plan saved without its verdicts) changed beyond its heartbeat.
    pub fn tolerated(&self, now: &Plan) -> Result<Tolerance, String> {
        if now.rows.len() < self.rows.len() {
            return Err(format!(
                "the registry had {} rows at plan time and has {} now (rows were deleted)",
                self.rows.len(),
                now.rows.len()
            ));
        }
        let mut planned = Unmatched::new(&self.rows);
        let mut tolerated = Tolerance::default();
        for e in &now.entries {
            let row = &now.rows[e.index];
            // Most rows are as planned: one digest finds them.
            let full = digest_of(row, None);
            if planned.take_full(full).is_some() {
                continue;
            }
            let stable = digest_of(row, Some(Col::LastHeartbeatAt));
            let identity = now.identity(e);
            if !planned.has(stable) && retired_candidate(row, &mut planned) {
                tolerated.retired_since_plan.push(identity);
                continue;
            }
            let Some(then) = planned.take_stable(stable) else {
                // Added, or changed beyond its heartbeat: its planned
                // version (if any) is among those left over below.
                tolerated.changed.push(identity);
                continue;
            };
            // Not identical (that was taken above): the heartbeat moved.
            if then.live && live_here(now, e) {
                tolerated.heartbeats.push(identity);
                continue;
            }
            // A heartbeat on a row not live then, or not live now: a change
            // like any other.
            vouch_for_change(then)?;
            tolerated.changed.push(identity);
        }
        let left: Vec<&PlannedRow> = planned.left().collect();
        if left.is_empty() {
            return Ok(tolerated);
        }
        let now_named: std::collections::HashSet<String> =
            now.entries.iter().map(|e| now.identity(e)).collect();
        for left in left {
            vouch_for_change(left)?;
            // Its row is gone, or no longer carries its identity: nothing
            // deletes a registration, so this is not churn (found by the
            // independent review: a deletion hidden by an insertion).
            if !now_named.contains(&left.worker_identity) {
                return Err(format!(
                    "worker {:?}'s row was deleted, or its identity changed, since the plan",
                    left.worker_identity
                ));
            }
        }
        Ok(tolerated)
    }
}

/// The digest of a row's fingerprint fields, all of them or all but one.
fn digest_of(row: &crate::row::Row, masked: Option<Col>) -> u128 {
    let mut text = String::with_capacity(1024);
    match masked {
        None => serialize_row_into(row, &mut text),
        Some(col) => serialize_row_masking(row, col, &mut text),
    }
    digest128(&text)
}

/// The plan's rows not yet matched with a row now, found by either digest;
/// each is matched at most once.
struct Unmatched<'p> {
    rows: &'p [PlannedRow],
    by_full: rustc_hash::FxHashMap<u128, Vec<usize>>,
    by_stable: rustc_hash::FxHashMap<u128, Vec<usize>>,
    taken: Vec<bool>,
}

impl<'p> Unmatched<'p> {
    fn new(rows: &'p [PlannedRow]) -> Unmatched<'p> {
        let mut by_full = rustc_hash::FxHashMap::default();
        let mut by_stable = rustc_hash::FxHashMap::default();
        by_full.reserve(rows.len());
        by_stable.reserve(rows.len());
        for (at, r) in rows.iter().enumerate() {
            by_full
                .entry(r.row_digest)
                .or_insert_with(Vec::new)
                .push(at);
            by_stable
                .entry(r.digest_without_heartbeat)
                .or_insert_with(Vec::new)
                .push(at);
        }
        Unmatched {
            rows,
            by_full,
            by_stable,
            taken: vec![false; rows.len()],
        }
    }

    /// Whether a row of this digest without the heartbeat is unmatched.
    fn has(&self, stable: u128) -> bool {
        self.by_stable
            .get(&stable)
            .is_some_and(|at| at.iter().any(|&i| !self.taken[i]))
    }

    /// Match the first unmatched row of this digest without the heartbeat
    /// that `fits`.
    fn take_stable_where(
        &mut self,
        stable: u128,
        fits: impl Fn(&PlannedRow) -> bool,
    ) -> Option<&'p PlannedRow> {
        let at = *self
            .by_stable
            .get(&stable)?
            .iter()
            .find(|&&i| !self.taken[i] && fits(&self.rows[i]))?;
        self.taken[at] = true;
        Some(&self.rows[at])
    }

    /// Match the first unmatched row of this digest without the heartbeat.
    fn take_stable(&mut self, stable: u128) -> Option<&'p PlannedRow> {
        self.take_stable_where(stable, |_| true)
    }

    /// Match an unmatched row of this full digest: a row identical to one
    /// planned.
    fn take_full(&mut self, full: u128) -> Option<&'p PlannedRow> {
        let at = *self.by_full.get(&full)?.iter().find(|&&i| !self.taken[i])?;
        self.taken[at] = true;
        Some(&self.rows[at])
    }

    /// The planned rows no row now matched.
    fn left(&self) -> impl Iterator<Item = &'p PlannedRow> + '_ {
        let rows = self.rows;
        self.taken
            .iter()
            .enumerate()
            .filter(|(_, t)| !**t)
            .map(move |(i, _)| &rows[i])
    }
}

/// A planned row that changed since may be passed over only when the plan
/// recorded its verdict and it was not a candidate: a candidate's old
/// content is part of the plan's candidate token, which cannot then be
/// checked, and a plan without verdicts cannot say which rows moved.
fn vouch_for_change(planned: &PlannedRow) -> Result<(), String> {
    let eligible = crate::reasons::Reason::Eligible.code();
    match planned.reason_codes.as_deref() {
        Some(codes) if !codes.is_empty() && codes != [eligible] => Ok(()),
        Some(_) => Err(format!(
            "worker {:?}, a candidate of the plan, changed beyond its heartbeat since the plan",
            planned.worker_identity
        )),
        None => Err(format!(
            "worker {:?} changed beyond its heartbeat since the plan (a plan saved without its \
             verdicts tolerates heartbeats only)",
            planned.worker_identity
        )),
    }
}

/// What [`PlannedRows::tolerated`] let pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tolerance {
    /// Workers whose heartbeat alone moved, live then and now.
    pub heartbeats: Vec<String>,
    /// Candidates of the plan retired since (`status` `retired`, every other
    /// fingerprint field as planned).
    pub retired_since_plan: Vec<String>,
    /// Rows added since the plan, or changed beyond a tolerated heartbeat,
    /// none of them a candidate of the plan: they refuse the apply only
    /// through what they move for its targets (their verdicts, their peer
    /// facts), which apply then checks.
    pub changed: Vec<String>,
}

/// The row as it was planned had its status been `active`: a candidate of
/// the plan that is `retired` now and otherwise unchanged. Its planned row
/// is matched when it is.
fn retired_candidate(row: &crate::row::Row, planned: &mut Unmatched) -> bool {
    if row.get(Col::Status).as_text() != Some("retired") {
        return false;
    }
    let mut before = row.clone();
    before.set(Col::Status, crate::value::Value::Text("active".into()));
    let (full, stable) = row_digests(&before);
    let eligible = crate::reasons::Reason::Eligible.code();
    planned
        .take_stable_where(stable, |r| {
            r.row_digest == full && r.reason_codes.as_deref().is_some_and(|c| c == [eligible])
        })
        .is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Value;

    /// A row's digests taken from an earlier plan are those it would
    /// have computed: only rows that serialize alike share them, a real
    /// compared by its bits.
    #[test]
    fn digests_are_reused_only_for_rows_that_serialize_alike() {
        let row = |pid: Value, beat: &str| {
            let mut r = crate::row::Row::default();
            r.set(Col::WorkerIdentity, Value::Text("w-1".into()));
            r.set(Col::LastHeartbeatAt, Value::Text(beat.into()));
            r.set(Col::Pid, pid);
            r
        };
        let then = vec![
            row(Value::Int(1), "2026-12-01T00:00:00Z"),
            row(Value::Real(0.0), "2026-12-01T00:00:00Z"),
            row(Value::Int(3), "2026-12-01T00:00:00Z"),
            row(Value::Text("4".into()), "2026-12-01T00:00:00Z"),
        ];
        let planned = PlannedRows {
            registry_fingerprint: "registryfp-0".into(),
            rows: then
                .iter()
                .map(|r| {
                    let (row_digest, digest_without_heartbeat) = row_digests(r);
                    PlannedRow {
                        worker_identity: "w-1".into(),
                        row_digest,
                        digest_without_heartbeat,
                        live: false,
                        reason_codes: None,
                        peers: None,
                    }
                })
                .collect(),
        };
        let now = vec![
            row(Value::Int(1), "2026-12-01T00:00:00Z"),
            row(Value::Real(-0.0), "2026-12-01T00:00:00Z"),
            row(Value::Int(3), "2026-12-01T00:01:00Z"),
            row(Value::Int(4), "2026-12-01T00:00:00Z"),
        ];
        assert!(same_fingerprint_fields(&then[0], &now[0]));
        assert!(!same_fingerprint_fields(&then[1], &now[1]), "0.0 and -0.0");
        assert!(
            !same_fingerprint_fields(&then[3], &now[3]),
            "text 4 and integer 4"
        );
        for i in 0..now.len() {
            let reused = digests_at(&now, i, Some((&then, &planned)));
            assert_eq!(reused, row_digests(&now[i]), "row {i}");
        }
        // What was reused is the earlier plan's record (marked here), and
        // only from an earlier plan whose rows and record agree in length.
        let mut marked = planned.clone();
        marked.rows[0].row_digest = 0x5eed;
        assert_eq!(digests_at(&now, 0, Some((&then, &marked))).0, 0x5eed);
        let longer = vec![then[0].clone(); 5];
        assert_eq!(
            digests_at(&now, 0, Some((&longer, &marked))),
            row_digests(&now[0])
        );
    }

    /// The digest without the heartbeat is that of the row with its
    /// heartbeat set to null, made without copying the row.
    #[test]
    fn the_quiet_digest_is_the_digest_of_the_row_without_its_heartbeat() {
        let mut row = crate::row::Row::default();
        row.set(Col::WorkerIdentity, Value::Text("w-author-1".into()));
        row.set(
            Col::LastHeartbeatAt,
            Value::Text("2026-12-01T00:00:00Z".into()),
        );
        row.set(Col::Pid, Value::Int(4242));
        let (full, quiet) = row_digests(&row);
        assert_eq!(full, digest128(&crate::fingerprint::serialize_row(&row)));
        let mut masked = String::new();
        crate::fingerprint::serialize_row_masking(&row, Col::LastHeartbeatAt, &mut masked);
        assert_eq!(quiet, digest128(&masked));
        row.set(Col::LastHeartbeatAt, Value::Null);
        assert_eq!(quiet, digest128(&crate::fingerprint::serialize_row(&row)));
        assert_ne!(full, quiet);
    }
}

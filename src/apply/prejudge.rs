//! Judging outside the write lock, confirming under it (docs/apply.md,
//! "The write lock held for what changed").
//!
//! Before `BEGIN IMMEDIATE`, apply reads the registry with its row-version
//! marker and the lease fence, and runs every step the lock would run on
//! them: the plan's tokens, the re-plan, the targets. Under the lock it then
//! asks the registry which rows changed since (their versions moved) and
//! shows, row by row, that none of those changes moves a verdict or a
//! token check; the rows that did not change are the rows judged. When it
//! cannot show that (the versions cannot vouch, the fence moved, a row
//! changed beyond its heartbeat, a target changed, a verdict or a
//! first-stage answer differs, the tokens were given without the plan's
//! rows), apply does what it always did: read the whole registry again
//! under the lock and re-plan.

use super::{
    refuse_if_all_retired, replan, select_targets, Abort, Context, Outcome, Report, Request, Txn,
};
use crate::evidence::leases;
use crate::plan::planned::{live_now, row_digests};
use crate::plan::Plan;
use crate::row::{Col, Row};
use crate::store::seam::{FenceSource, RowVersions};
use std::collections::HashSet;

/// What was judged outside the lock.
pub struct Prejudged {
    /// The re-plan of the rows read.
    pub fresh: Plan,
    /// Where the registry stood when they were read.
    pub versions: RowVersions,
    /// The lease fence read just before them.
    pub fence: leases::Fence,
    /// The targets, as indices of `fresh.entries`.
    pub targets: Vec<usize>,
    /// The report as the steps left it.
    pub report: Report,
    /// Whether the planned rows of each digest without the heartbeat were
    /// live (`PlannedRows::live_index`), when apply holds them.
    pub live_when_planned: Option<std::collections::HashMap<u128, bool>>,
}

/// Why apply did not judge outside the lock, or what it found there.
pub enum NotJudged {
    /// It could not (no row versions, a read that failed): the lock reads
    /// the whole registry and judges there.
    Unread(String),
    /// A step refused: the lock answers the refusal without reading the
    /// registry again (it checks the shape and takes the fence first, so
    /// refusals keep their order), once it knows the refusal was read from
    /// the file it holds ([`Refusal`]).
    Refused(Box<Refusal>),
}

/// A refusal found outside the lock, with what the lock needs to answer it.
pub struct Refusal {
    /// The outcome and its words.
    pub outcome: Outcome,
    /// Why.
    pub why: String,
    /// The report as the steps left it.
    pub report: Report,
    /// Where the registry stood when it was read (its file among it).
    pub versions: RowVersions,
    /// For `already_retired` (a success, not a refusal): the positions of
    /// the requested workers' rows, which must not have changed since for
    /// the answer to stand.
    pub requested: Vec<usize>,
}

impl From<String> for NotJudged {
    fn from(why: String) -> NotJudged {
        NotJudged::Unread(why)
    }
}

impl From<&str> for NotJudged {
    fn from(why: &str) -> NotJudged {
        NotJudged::Unread(why.into())
    }
}

/// A judgement confirmed under the lock: the plan with the changed rows in
/// place, its targets, the report as the steps left it, the rows read.
pub type Confirmed = (Plan, Vec<usize>, Report, usize);

/// How apply read the registry under its lock, for the report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReadUnderLock {
    /// `changed_rows` (judged outside the lock, the changed rows confirmed
    /// under it), `whole_registry` (read and judged under the lock; for a
    /// host-scoped plan, its scope taken from that read), `host_scope` (a
    /// host-scoped plan's scope read through its indexes) or `nothing`
    /// (refused on the judgement made outside it).
    pub scope: &'static str,
    /// Rows read under the lock.
    pub rows: usize,
    /// Why the whole registry was read, when it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// Judge outside the lock, when the registry keeps row versions.
/// `Unread` when it does not or reading fails (apply then takes the lock
/// and runs every step there); `Refused` when a step refuses (apply
/// answers it with the lock held only to check the file and the fence:
/// an apply refused for what moved since its plan never holds the lock for
/// a whole read, issue 44 §2).
pub fn prejudge(
    req: &Request,
    ctx: &Context,
    fence_source: &mut dyn FenceSource,
) -> std::result::Result<Prejudged, NotJudged> {
    if req.scope.is_some() {
        // Its scope is small and read under the lock (`scoped.rs`).
        return Err("a host-scoped plan is judged on its scope, under the lock".into());
    }
    let engine = crate::store::open::engine(ctx.registry).map_err(|e| e.to_string())?;
    let (fence, active_leases) = leases::Fence::read(fence_source).map_err(|e| e.to_string())?;
    let (rows, versions) = engine
        .read_registry_versioned()
        .ok_or(
            "the registry keeps no row versions (a registry gains them at its first apply; \
             PostgreSQL before 13 and a role that may not create triggers keep none)",
        )?
        .map_err(|e| e.to_string())?;
    let mut report = Report::new(req, Outcome::Applied, "");
    let refused = |outcome, why, report, versions, requested| {
        NotJudged::Refused(Box::new(Refusal {
            outcome,
            why,
            report,
            versions,
            requested,
        }))
    };
    let by_identity = match refuse_if_all_retired(req, &rows) {
        Ok(map) => map,
        Err(Abort::Refuse(outcome, why)) => {
            let requested = requested_positions(req, &rows);
            return Err(refused(outcome, why, report, versions, requested));
        }
        Err(Abort::Fail(why) | Abort::Raced(why)) => return Err(NotJudged::Unread(why)),
    };
    let (fresh, targets) =
        match judge_read(req, ctx, rows, by_identity, &active_leases, &mut report) {
            Ok(judged) => judged,
            Err(Abort::Refuse(outcome, why)) => {
                return Err(refused(outcome, why, report, versions, Vec::new()))
            }
            Err(Abort::Fail(why) | Abort::Raced(why)) => {
                return Err(NotJudged::Unread(format!(
                    "judging outside the lock failed ({why}), so the lock judges again"
                )))
            }
        };
    let live_when_planned = req
        .planned
        .as_deref()
        .filter(|p| p.registry_fingerprint == req.registry_fingerprint)
        .map(|p| p.live_index());
    Ok(Prejudged {
        fresh,
        versions,
        fence,
        targets,
        report,
        live_when_planned,
    })
}

/// The steps after the read, as the lock runs them: every requested
/// worker already retired, the tokens (re-plan), the targets.
pub(super) fn judge(
    req: &Request,
    ctx: &Context,
    rows: Vec<Row>,
    active_leases: &[leases::Lease],
    report: &mut Report,
) -> std::result::Result<(Plan, Vec<usize>), Abort> {
    let by_identity = refuse_if_all_retired(req, &rows)?;
    judge_read(req, ctx, rows, by_identity, active_leases, report)
}

/// The positions of the rows that carry a requested identity.
fn requested_positions(req: &Request, rows: &[Row]) -> Vec<usize> {
    let wanted: HashSet<&str> = req.workers.iter().map(String::as_str).collect();
    rows.iter()
        .enumerate()
        .filter(|(_, r)| wanted.contains(r.get(Col::WorkerIdentity).canon_cow().as_ref()))
        .map(|(i, _)| i)
        .collect()
}

/// [`judge`] after its first step: the re-plan held to the tokens, and the
/// targets.
fn judge_read(
    req: &Request,
    ctx: &Context,
    rows: Vec<Row>,
    by_identity: std::collections::HashMap<String, Vec<usize>>,
    active_leases: &[leases::Lease],
    report: &mut Report,
) -> std::result::Result<(Plan, Vec<usize>), Abort> {
    let fresh = replan(req, ctx, rows, active_leases, report)?;
    let targets = select_targets(req, &fresh, &by_identity, report)?
        .into_iter()
        .map(|e| e.index)
        .collect();
    Ok((fresh, targets))
}

impl Prejudged {
    /// Under the lock: the plan judged outside it still stands, with the
    /// rows changed since put in. `Err` says why it does not (apply then
    /// reads the whole registry).
    pub(super) fn confirm(
        mut self,
        t: &mut Txn,
        fence: &leases::Fence,
    ) -> std::result::Result<std::result::Result<Confirmed, String>, Abort> {
        if fence.token != self.fence.token || fence.digest != self.fence.digest {
            return Ok(Err(
                "the active leases changed since the registry was judged".into(),
            ));
        }
        let changes = match t.tx.changed_since(&self.versions)? {
            Ok(changes) => changes,
            Err(why) => return Ok(Err(why)),
        };
        let read = changes.len();
        let targets: HashSet<usize> = self.targets.iter().copied().collect();
        for (at, row) in changes {
            let Some(row) = row else {
                return Ok(Err("a row was deleted since the registry was judged".into()));
            };
            if let Err(why) = self.take_change(t, &targets, at, row) {
                return Ok(Err(why));
            }
        }
        Ok(Ok((self.fresh, self.targets, self.report, read)))
    }

    /// Put one changed row in place of the version judged, when the change
    /// moves nothing: only its heartbeat, not a target, the same
    /// first-stage answers and verdict, and a heartbeat the plan's rows
    /// tolerate (live when planned, live now).
    fn take_change(
        &mut self,
        t: &Txn,
        targets: &HashSet<usize>,
        at: usize,
        row: Row,
    ) -> std::result::Result<(), String> {
        let fresh = &self.fresh;
        let identity = fresh.identity(&fresh.entries[at]);
        // Every column the program reads, not the token's fields: a change
        // to a column the token leaves out (`instance_id_source`,
        // `pid_namespace`, a revision) moves verdicts all the same.
        let moved: Vec<Col> = fresh.rows[at].columns_differing(&row).collect();
        match moved.as_slice() {
            [] => return Ok(()),
            [Col::LastHeartbeatAt] => {}
            _ => {
                let names: Vec<&str> = moved.iter().map(|c| c.name()).collect();
                return Err(format!(
                    "{identity:?} changed beyond its heartbeat ({})",
                    names.join(", ")
                ));
            }
        }
        let (_, new_stable) = row_digests(&row);
        if targets.contains(&at) {
            return Err(format!("{identity:?}, a target, heartbeated"));
        }
        let planned = self
            .live_when_planned
            .as_ref()
            .ok_or("the tokens were given without the plan's rows, so they are compared exactly")?;
        if planned.get(&new_stable) != Some(&true) {
            return Err(format!(
                "{identity:?} heartbeated but was not live when planned"
            ));
        }
        let again = fresh.rejudge_changed(at, &row, t.ctx.probe, t.ctx.policies);
        if !again.leaves_plan_as_it_was(fresh, at) {
            return Err(format!(
                "{identity:?}'s verdict or first-stage answers moved"
            ));
        }
        if !live_now(&fresh.facts, &row, &again.observation) {
            return Err(format!("{identity:?} heartbeated but is not live now"));
        }
        if !self.report.heartbeats_tolerated_workers.contains(&identity) {
            self.report.heartbeats_tolerated_workers.push(identity);
            self.report.heartbeats_tolerated += 1;
        }
        self.fresh.rows[at] = row;
        self.fresh.observations[at] = again.observation;
        Ok(())
    }
}

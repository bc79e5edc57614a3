//! The plans a server keeps, and the one plan computation at a time.
//!
//! Calls that arrive together on the same registry share a computation:
//! plans are computed one at a time, and a call that waited while another
//! call's plan was computed, a plan that started after the waiting call
//! arrived, takes that plan; it is as fresh as its own would be. So eight
//! concurrent plans cost one plan's memory and about one plan's time, not
//! eight.
//!
//! The last [`KEEP_WHOLE`] plans are kept whole (their pages and their
//! resource are served from them); the rows' digests of the last
//! [`super::KEEP_PLANS`] are kept for the apply that follows a plan.

use super::pages::KeptPlan;
use super::plan_dir::Found;
use super::KEEP_PLANS;
use crate::error::Result;
use crate::plan::planned::PlannedRows;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// How many issued plans are kept whole for paging.
pub const KEEP_WHOLE: usize = 2;

/// The plans a server issued.
#[derive(Default)]
pub(super) struct Kept {
    /// Held while a plan is computed.
    gate: Mutex<()>,
    /// The newest plan and when its computation started.
    newest: Mutex<Option<(Instant, Arc<KeptPlan>)>>,
    /// The last plans, whole (newest last).
    whole: Mutex<VecDeque<Arc<KeptPlan>>>,
    /// The last plans' row digests, with their candidate tokens (newest
    /// last). Two plans may share a registry token and differ in their
    /// candidates (time passed between them: a heartbeat expired), so a
    /// plan's rows are found by both tokens.
    rows: Mutex<VecDeque<(String, Arc<PlannedRows>)>>,
    /// Where the rows of every plan issued are also written, for the
    /// servers after this one ([`super::plan_dir`]).
    dir: Option<super::plan_dir::PlanDir>,
}

/// A lock whose holder panicked still guards consistent data here: every
/// update is a single push or replace.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Kept {
    /// Plans kept in memory and, given a folder, on disk.
    pub(super) fn new(dir: Option<super::plan_dir::PlanDir>) -> Kept {
        Kept {
            dir,
            ..Kept::default()
        }
    }

    /// A plan at least as fresh as a call that `arrived` then: one computed
    /// since, or a new one computed by `compute`.
    /// A plan of one scope never serves a call that asked for the other
    /// (`scoped`: a host-scoped plan).
    pub(super) fn fresh(
        &self,
        arrived: Instant,
        scoped: bool,
        compute: impl FnOnce() -> Result<KeptPlan>,
    ) -> Result<Arc<KeptPlan>> {
        let _one_at_a_time = lock(&self.gate);
        if let Some((started, plan)) = lock(&self.newest).as_ref() {
            if *started >= arrived && plan.plan.scope.is_some() == scoped {
                return Ok(plan.clone());
            }
        }
        let started = Instant::now();
        let plan = Arc::new(compute()?);
        self.keep(&plan);
        *lock(&self.newest) = Some((started, plan.clone()));
        Ok(plan)
    }

    /// Keep a plan whole and its rows' digests; what falls out is dropped
    /// on a thread of its own, so no call waits for a large plan's memory
    /// to be returned.
    fn keep(&self, plan: &Arc<KeptPlan>) {
        let token = &plan.plan.registry_fingerprint;
        let key = plan.key();
        let dropped = {
            let mut whole = lock(&self.whole);
            whole.retain(|k| k.key() != key);
            whole.push_back(plan.clone());
            let over = whole.len().saturating_sub(KEEP_WHOLE);
            whole.drain(..over).collect::<Vec<_>>()
        };
        {
            let candidates = &plan.plan.candidate_fingerprint;
            let mut rows = lock(&self.rows);
            rows.retain(|(c, r)| !(&r.registry_fingerprint == token && c == candidates));
            if rows.len() == KEEP_PLANS {
                rows.pop_front();
            }
            rows.push_back((candidates.clone(), plan.rows.clone()));
        }
        if let Some(dir) = &self.dir {
            let started = Instant::now();
            dir.save(&plan.plan.candidate_fingerprint, &plan.rows);
            tracing::debug!("plan's rows kept in the folder in {:?}", started.elapsed());
        }
        if !dropped.is_empty() {
            std::thread::spawn(move || {
                drop(dropped);
                crate::pool::give_back_memory();
            });
        }
    }

    /// The whole plan of a key ([`KeptPlan::key`]: both its tokens), if
    /// still kept.
    pub(super) fn whole(&self, key: &str) -> Option<Arc<KeptPlan>> {
        lock(&self.whole)
            .iter()
            .rev()
            .find(|k| k.key() == key)
            .cloned()
    }

    /// The newest plan kept whole of a scope (`scoped`: host-scoped), if
    /// any.
    pub(super) fn newest_whole(&self, scoped: bool) -> Option<Arc<KeptPlan>> {
        lock(&self.whole)
            .iter()
            .rev()
            .find(|k| k.plan.scope.is_some() == scoped)
            .cloned()
    }

    /// Every plan kept whole, newest last.
    pub(super) fn all_whole(&self) -> Vec<Arc<KeptPlan>> {
        lock(&self.whole).iter().cloned().collect()
    }

    /// The rows' digests of a plan issued under these tokens: by this
    /// server (kept in memory), or by another of the same binding that
    /// wrote them to the folder; or, when only a server bound otherwise
    /// kept a plan of these tokens, how it differs ([`Found::Elsewhere`]).
    pub(super) fn rows(&self, registry_fingerprint: &str, candidate_fingerprint: &str) -> Found {
        let mine = lock(&self.rows)
            .iter()
            .rev()
            .find(|(c, r)| {
                r.registry_fingerprint == registry_fingerprint && c == candidate_fingerprint
            })
            .map(|(_, r)| r.clone());
        match (mine, &self.dir) {
            (Some(rows), _) => Found::Ours(rows),
            (None, Some(dir)) => dir.load(registry_fingerprint, candidate_fingerprint),
            (None, None) => Found::Nothing,
        }
    }
}

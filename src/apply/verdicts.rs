//! The steps after the read under the lock (and outside it): every
//! requested worker already retired, the re-plan held to the plan's tokens
//! (with the tolerances of docs/semantics.md §13 and the verdicts that
//! moved), and the targets picked from the fresh plan.

use super::*;

/// Rows by canonical identity, built once (requests can name thousands);
/// refused when every requested worker is retired already.
pub(super) fn refuse_if_all_retired(
    req: &Request,
    rows: &[crate::row::Row],
) -> std::result::Result<HashMap<String, Vec<usize>>, Abort> {
    let mut by_identity: HashMap<String, Vec<usize>> = HashMap::with_capacity(rows.len());
    for (i, r) in rows.iter().enumerate() {
        by_identity
            .entry(r.get(Col::WorkerIdentity).canon())
            .or_default()
            .push(i);
    }
    let all_retired = req.workers.iter().all(|w| {
        by_identity.get(w).is_some_and(|mine| {
            mine.iter()
                .all(|&i| rows[i].get(Col::Status).as_text() == Some("retired"))
        })
    });
    if all_retired {
        return Err(Abort::Refuse(
            Outcome::AlreadyRetired,
            "every requested worker is already retired; nothing to do".into(),
        ));
    }
    Ok(by_identity)
}

/// Re-plan from what is read under the lock, and hold it to the plan's
/// tokens: the registry's (heartbeats of live workers tolerated when the
/// plan's rows are at hand) and the candidates'.
pub(super) fn replan(
    req: &Request,
    ctx: &Context,
    rows: Vec<crate::row::Row>,
    active_leases: &[leases::Lease],
    report: &mut Report,
) -> std::result::Result<crate::plan::Plan, Abort> {
    let facts = RunFacts::of_this_host(
        ctx.proc_root,
        req.canonical_repository.clone(),
        active_leases,
    );
    let fresh = plan(rows, facts, ctx.probe, ctx.policies)?;
    if fresh.registry_fingerprint != req.registry_fingerprint {
        let moved = |why: String| {
            Abort::Refuse(
                Outcome::RegistryRevisionMoved,
                format!(
                    "the registry changed since the plan (now {}){why}; plan again",
                    fresh.registry_fingerprint
                ),
            )
        };
        match req
            .planned
            .as_deref()
            .filter(|p| p.registry_fingerprint == req.registry_fingerprint)
        {
            None => return Err(moved(String::new())),
            Some(planned) => match planned.tolerated(&fresh) {
                Ok(tolerance) => {
                    report.heartbeats_tolerated = tolerance.heartbeats.len();
                    report.heartbeats_tolerated_workers = tolerance.heartbeats;
                    report.retired_since_plan = tolerance.retired_since_plan;
                }
                Err(why) => return Err(moved(format!(": {why}"))),
            },
        }
    }
    if fresh.candidate_fingerprint != req.candidate_fingerprint {
        let moved = planned_verdicts_moved(req, &fresh);
        if let Some(added) = moved
            .as_deref()
            .and_then(|m| moved_as_planned(req, &fresh, m, &report.retired_since_plan))
        {
            report.candidates_added_since_plan = added;
            return Ok(fresh);
        }
        let which = verdicts_moved_words(moved, report);
        return Err(Abort::Refuse(
            Outcome::CandidateSetMoved,
            format!(
                "the eligibility verdict changed since the plan (now {}){which}; plan again",
                fresh.candidate_fingerprint
            ),
        ));
    }
    Ok(fresh)
}

/// The rows whose verdicts moved since the plan, when apply holds the
/// plan's rows with their verdicts.
pub(super) fn planned_verdicts_moved(
    req: &Request,
    fresh: &crate::plan::Plan,
) -> Option<Vec<crate::plan::planned::VerdictMoved>> {
    req.planned
        .as_deref()
        .filter(|p| p.registry_fingerprint == req.registry_fingerprint)
        .and_then(|p| p.verdicts_moved(fresh))
}

/// Semantics §13: the candidate set moved only as time and this plan's own
/// batches move it. Every moved row either was kept at plan time only for
/// an unexpired heartbeat and is a candidate now (time passed), or was a
/// candidate and has been retired since (an earlier batch of this plan,
/// `retired`); and the plan's candidates, rebuilt from the rows now (the
/// retired ones as they were, `active`), make exactly the plan's token.
/// Then the apply goes on: the rows that became candidates are named and
/// left alone. `None` when any other change is in the set.
pub(super) fn moved_as_planned(
    req: &Request,
    fresh: &crate::plan::Plan,
    moved: &[crate::plan::planned::VerdictMoved],
    retired: &[String],
) -> Option<Vec<String>> {
    let retired: std::collections::HashSet<&str> = retired.iter().map(String::as_str).collect();
    let explained = |m: &&crate::plan::planned::VerdictMoved| {
        m.expired_since || retired.contains(m.worker_identity.as_str())
    };
    if moved.is_empty() || !moved.iter().all(|m| explained(&m)) {
        return None;
    }
    let added: std::collections::HashSet<usize> = moved
        .iter()
        .filter(|m| m.expired_since)
        .map(|m| m.entry)
        .collect();
    let planned: Vec<Row> = fresh
        .entries
        .iter()
        .enumerate()
        .filter_map(|(i, e)| {
            let row = &fresh.rows[e.index];
            if e.is_candidate() && !added.contains(&i) {
                Some(row.clone())
            } else if retired.contains(fresh.identity(e).as_str()) {
                let mut before = row.clone();
                before.set(Col::Status, Value::Text("active".into()));
                Some(before)
            } else {
                None
            }
        })
        .collect();
    (crate::fingerprint::candidate_fingerprint(&planned) == req.candidate_fingerprint).then(|| {
        moved
            .iter()
            .filter(|m| m.expired_since)
            .map(|m| m.worker_identity.clone())
            .collect()
    })
}

/// The refusal's words for the rows whose verdict moved, and those rows
/// into the report (the first five in the words, and how many more).
pub(super) fn verdicts_moved_words(
    moved: Option<Vec<crate::plan::planned::VerdictMoved>>,
    report: &mut Report,
) -> String {
    let Some(moved) = moved else {
        return ": which rows moved is known only to an apply of a plan saved with its rows \
                (plan --out, or through serve)"
            .into();
    };
    let shown: Vec<String> = moved
        .iter()
        .take(5)
        .map(|m| {
            format!(
                "{} {} -> {}",
                crate::text::esc(&m.worker_identity),
                m.then,
                m.now
            )
        })
        .collect();
    let more = moved.len().saturating_sub(shown.len());
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    report.verdicts_moved = moved;
    if shown.is_empty() {
        String::new()
    } else {
        format!(": {}{more}", shown.join(", "))
    }
}

/// Every requested identity revalidated against the fresh plan: one row,
/// a candidate of it. The others are kept with their reason; more targets
/// than the limit refuse the whole apply.
pub(super) fn select_targets<'p>(
    req: &Request,
    fresh: &'p crate::plan::Plan,
    by_identity: &HashMap<String, Vec<usize>>,
    report: &mut Report,
) -> std::result::Result<Vec<&'p crate::plan::Entry>, Abort> {
    let mut targets = Vec::new();
    // Sets, not lists: a large plan's later batches pass over tens of
    // thousands of retired rows, inside the write lock.
    let retired: std::collections::HashSet<String> =
        report.retired_since_plan.iter().cloned().collect();
    let added: std::collections::HashSet<String> =
        report.candidates_added_since_plan.iter().cloned().collect();
    for w in &req.workers {
        if req.first.is_some_and(|n| targets.len() >= n) {
            break;
        }
        if retired.contains(w) {
            continue;
        }
        let entries: Vec<_> = by_identity
            .get(w)
            .map(|ix| ix.iter().map(|&i| &fresh.entries[i]).collect())
            .unwrap_or_default();
        match entries.as_slice() {
            [] => report.preserved.push(Kept {
                worker_identity: w.clone(),
                reason_code: Reason::RegistrationMissing.code(),
                detail: "no registry row carries this identity".into(),
            }),
            [_] if added.contains(w) => report.preserved.push(Kept {
                worker_identity: w.clone(),
                reason_code: Reason::NotInPlan.code(),
                detail: "not a candidate when planned (its heartbeat had not expired); \
                             plan again to retire it"
                    .into(),
            }),
            [e] if e.is_candidate() => targets.push(*e),
            [e, ..] => report.preserved.push(Kept {
                worker_identity: w.clone(),
                reason_code: Reason::NotInPlan.code(),
                detail: format!(
                    "not a candidate of the current plan ({})",
                    e.reason().code()
                ),
            }),
        }
    }
    if targets.len() > req.max_retire {
        return Err(Abort::Refuse(
            Outcome::BlastRadiusExceeded,
            format!(
                "{} workers would be retired, more than the limit of {}; nothing was retired. \
                 Raise --max-retire deliberately, or request fewer workers",
                targets.len(),
                req.max_retire
            ),
        ));
    }
    Ok(targets)
}

//! The steps after the read under the lock (and outside it): every
//! requested worker already retired, the re-plan held to the plan's tokens
//! (with the tolerances of docs/semantics.md §13 and the verdicts that
//! moved), and the targets picked from the fresh plan.

use super::*;

/// The requested workers' rows by canonical identity, built once
/// (requests can name thousands); refused when every requested worker is
/// retired already.
pub(super) fn refuse_if_all_retired(
    req: &Request,
    rows: &[crate::row::Row],
) -> std::result::Result<HashMap<String, Vec<usize>>, Abort> {
    // Only the requested identities: a batch of a large plan asks for a
    // tenth of the registry, and this runs for every batch.
    let wanted: std::collections::HashSet<&str> = req.workers.iter().map(String::as_str).collect();
    let mut by_identity: HashMap<String, Vec<usize>> = HashMap::with_capacity(wanted.len());
    for (i, r) in rows.iter().enumerate() {
        let named = r.get(Col::WorkerIdentity).canon_cow();
        if wanted.contains(named.as_ref()) {
            by_identity.entry(named.into_owned()).or_default().push(i);
        }
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
                    report.rows_changed_since_plan = tolerance.changed;
                }
                Err(why) => return Err(moved(format!(": {why}"))),
            },
        }
    }
    // Rows added or changed beside the targets: what they move for the
    // targets (verdicts, peer facts) is checked as when verdicts moved,
    // even if the candidate token did not.
    if fresh.candidate_fingerprint != req.candidate_fingerprint
        || !report.rows_changed_since_plan.is_empty()
    {
        return candidates_moved(req, fresh, report);
    }
    Ok(fresh)
}

/// The candidate token moved. With the plan's verdicts at hand, rows that
/// are neither targets nor their peers moving refuse nothing (semantics
/// §13, "Churn beside the targets"): they are reported, and the apply goes
/// on. A target's verdict moving, or a peer's, still refuses; so does a plan
/// whose recorded verdicts do not make its own token, and a plan given
/// without its rows (which rows moved is then unknown).
fn candidates_moved(
    req: &Request,
    fresh: crate::plan::Plan,
    report: &mut Report,
) -> std::result::Result<crate::plan::Plan, Abort> {
    let what = if fresh.candidate_fingerprint == req.candidate_fingerprint {
        changed_words(&report.rows_changed_since_plan)
    } else {
        format!(
            "the eligibility verdict changed since the plan (now {})",
            fresh.candidate_fingerprint
        )
    };
    let refuse = |which: String| {
        Abort::Refuse(
            Outcome::CandidateSetMoved,
            format!("{what}{which}; plan again"),
        )
    };
    let Some(moved) = planned_verdicts_moved(req, &fresh) else {
        return Err(refuse(verdicts_moved_words(None, report)));
    };
    let retired = &report.retired_since_plan;
    if !super::moved::plan_token_holds(&fresh, &moved, retired, &req.candidate_fingerprint) {
        let words = verdicts_moved_words(Some(moved), report);
        return Err(refuse(format!(
            "{words}; the plan's recorded verdicts do not make its candidate token"
        )));
    }
    let planned = req
        .planned
        .as_deref()
        .expect("verdicts moved come from the plan's rows");
    let sorted = super::moved::sort(&fresh, planned, moved, req, retired);
    if !sorted.peers_known && !report.rows_changed_since_plan.is_empty() {
        return Err(refuse(
            ": the plan was saved without its candidates' peer facts, so what the added or \
             changed rows move for the targets cannot be told"
                .into(),
        ));
    }
    if !sorted.concerning.is_empty() {
        let words = verdicts_moved_words(Some(sorted.concerning), report);
        return Err(refuse(format!(
            "{words} (a target's own verdict, or, for a plan saved without its candidates' \
             peer facts, that of a row sharing identity evidence or an instance slot with a \
             target)"
        )));
    }
    if !sorted.peers_moved.is_empty() {
        let shown: Vec<&str> = sorted
            .peers_moved
            .iter()
            .take(5)
            .map(String::as_str)
            .collect();
        let more = if sorted.peers_moved.len() > 5 {
            "; …"
        } else {
            ""
        };
        let words = format!(
            ": what a target's verdict reads of other rows moved ({}{more})",
            shown.join("; ")
        );
        // The rows that moved it are among those whose verdict moved.
        report.verdicts_moved = sorted.left.into_iter().chain(sorted.added).collect();
        return Err(refuse(words));
    }
    report.candidates_added_since_plan = sorted
        .added
        .into_iter()
        .map(|m| m.worker_identity)
        .collect();
    report.verdicts_moved = sorted.left;
    Ok(fresh)
}

/// The refusal's opening words when rows were added or changed since the
/// plan but the candidate token did not move.
fn changed_words(changed: &[String]) -> String {
    let named = first_five(changed, |w| crate::text::esc(w).into_owned());
    format!("rows were added or changed since the plan ({named})")
}

/// The first five of `items` as words, and how many more.
fn first_five<T>(items: &[T], words: impl Fn(&T) -> String) -> String {
    let shown: Vec<String> = items.iter().take(5).map(words).collect();
    match items.len().saturating_sub(shown.len()) {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    }
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
    let named = first_five(&moved, |m| {
        format!(
            "{} {} -> {}",
            crate::text::esc(&m.worker_identity),
            m.then,
            m.now
        )
    });
    let empty = moved.is_empty();
    report.verdicts_moved = moved;
    if empty {
        String::new()
    } else {
        format!(": {named}")
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
        if req.first.is_some() {
            report.requested.push(w.clone());
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
                "{} workers would be retired, more than the blast-radius limit of {}; nothing \
                 was retired. Request fewer workers (or a batch of the first N), or raise the \
                 limit deliberately (--max-retire; a server's is set when it is launched)",
                targets.len(),
                req.max_retire
            ),
        ));
    }
    Ok(targets)
}

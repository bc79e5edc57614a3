//! The host-scoped plan (`plan --scope host`, issue 54): this host's active
//! rows judged exactly as a plan of the whole registry judges them, from
//! its scope alone (`store/scope.rs`: its rows, the peer rows their
//! verdicts depend on, a count of its other rows).
//!
//! The peers are observed and asked the first stage with the host's own
//! rows, so every peer fact of an own row is counted over the same rows as
//! in the whole registry; their own verdicts would not be (their peers were
//! not read), so they are dropped, and only the own rows are entries. The
//! tokens are the scope's (`fingerprint::scoped_tokens`), never the seed's.

use super::head::ScopeHead;
use super::{plan, Plan};
use crate::error::{About, Error, Result};
use crate::evidence::probe::ProcessProbe;
use crate::observe::RunFacts;
use crate::policy::Policies;
use crate::store::scope::Scope;

/// Judge this host's scope. Refused (before anything is judged) when the
/// run does not know its host, or the policies do not show what the scoped
/// read assumes of them (`policy::scope_check`).
pub fn plan_scope(
    scope: Scope,
    facts: RunFacts,
    probe: &dyn ProcessProbe,
    policies: &Policies,
) -> Result<Plan> {
    check_scope(&facts, policies, &scope.host_id)?;
    let own = scope.own.len();
    let peers = scope.peers.len();
    let mut rows = scope.own;
    rows.extend(scope.peers);
    let mut plan = plan(rows, facts, probe, policies)?;
    let (registry, candidate) =
        crate::fingerprint::scoped_tokens(&plan.rows, &scope.host_id, scope.terminal, |i| {
            i < own && plan.entries[i].is_candidate()
        });
    plan.rows.truncate(own);
    plan.observations.truncate(own);
    plan.first_stage.truncate(own);
    plan.entries.truncate(own);
    plan.registry_fingerprint = registry;
    plan.candidate_fingerprint = candidate;
    // Every row judged is this host's.
    plan.other_host_rows = 0;
    plan.scope = Some(ScopeHead {
        kind: "host".into(),
        host_id: scope.host_id,
        own_rows: own,
        peer_rows: peers,
        terminal_rows: scope.terminal,
    });
    Ok(plan)
}

/// The host whose scope a run on this machine reads: the kernel's node
/// name, never one given (a host that could name another's scope could
/// probe its own pids for that host's rows).
pub fn this_host(facts: &RunFacts) -> Result<String> {
    facts
        .host
        .host_id
        .clone()
        .filter(|h| !h.trim().is_empty())
        .ok_or_else(|| {
            Error::input(
                About::Option("--scope host"),
                "this host's id (the kernel's node name) cannot be read, so there is no \
                 scope of its own to read; plan without --scope",
            )
        })
}

fn check_scope(facts: &RunFacts, policies: &Policies, host: &str) -> Result<()> {
    if this_host(facts)? != host {
        return Err(Error::input(
            About::Option("--scope host"),
            format!(
                "the scope read is host {host:?}'s, and this run is on {:?}; a host plans \
                 only its own scope",
                facts.host.host_id.as_deref().unwrap_or_default()
            ),
        ));
    }
    crate::policy::scope_check::scope_assumptions(policies).map_err(|why| {
        Error::input(
            About::Option("--scope host"),
            format!(
                "the policy set ({}) does not keep a host's scope exact: {why}. Plan \
                 without --scope (the whole registry is read and judged)",
                policies.origin
            ),
        )
    })
}

/// Read this host's scope at `registry`, the lease store, probe this host,
/// and plan the scope: `plan --scope host`.
pub fn plan_scope_from_files(
    registry: &std::path::Path,
    leases: &std::path::Path,
    proc_root: &std::path::Path,
    canonical_repository: String,
    policies: &Policies,
) -> Result<Plan> {
    let started = std::time::Instant::now();
    let host = this_host(&RunFacts::of_this_host(proc_root, None, &[]))?;
    let scope = crate::evidence::registry::load_scope(registry, &host)?;
    let lease_rows = crate::evidence::leases::load(leases)?;
    let read = started.elapsed();
    tracing::debug!(
        own = scope.own.len(),
        peers = scope.peers.len(),
        terminal = scope.terminal,
        elapsed = ?read,
        "scope read"
    );
    let facts = RunFacts::of_this_host(proc_root, Some(canonical_repository), &lease_rows);
    let probe = crate::evidence::probe::SystemProbe::new(proc_root);
    let mut plan = plan_scope(scope, facts, &probe, policies)?;
    plan.stats.read = read;
    Ok(plan)
}

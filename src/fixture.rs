//! Policy regression fixtures (docs/semantics.md §9): one JSON file per case, with
//! process probes given rather than taken, so a case means the same on every
//! machine.

use crate::error::{About, Error, Result};
use crate::evidence::leases::{Lease, Protections};
use crate::evidence::probe::{GivenProbe, HostFacts, PidObservation};
use crate::observe::RunFacts;
use crate::plan::{plan, Plan};
use crate::policy::Policies;
use crate::row::Row;
use crate::time::{parse_ts, Micros};
use serde::Deserialize;
use serde_json::{Map, Value as Json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;

pub use crate::difference::Difference;
pub use decided::{decided, Decided};

mod decided;
mod defaults;

/// What a plan case expects; absent members are not checked.
#[derive(Debug, Clone, Default)]
pub struct Expect {
    /// Expected registry token.
    pub registry_fingerprint: Option<String>,
    /// Expected candidate token.
    pub candidate_fingerprint: Option<String>,
    /// Expected candidates, in registry order.
    pub candidates: Option<Vec<String>>,
    /// Expected preserved workers → primary reason code.
    pub preserved: Option<BTreeMap<String, String>>,
}

/// One plan case.
#[derive(Debug, Clone)]
pub struct PlanCase {
    /// The case's name.
    pub name: String,
    /// The planning clock.
    pub now: Micros,
    /// Host facts and canonical repository.
    pub host: HostFacts,
    /// Canonical repository (`null` reproduces the seed: any binding).
    pub canonical_repository: Option<String>,
    /// Given probe answers.
    pub probe: GivenProbe,
    /// Registry rows.
    pub rows: Vec<Row>,
    /// Lease rows.
    pub leases: Vec<Lease>,
    /// Expectations.
    pub expect: Expect,
}

/// A parsed fixture file.
#[derive(Debug, Clone)]
pub enum Case {
    /// A plan case (`rows` / `expect`).
    Plan(Box<PlanCase>),
    /// A capability case (`profiles` / `requests`).
    Capability(crate::capability::CapabilityCase),
    /// A snapshot case (`rows` / `snapshot`).
    Snapshot(Box<SnapshotCase>),
    /// A Cedar-level case (`request` / `entities`): one request over given
    /// entities, as `policy diff` prints its counterexamples.
    Entity(Box<EntityCase>),
}

impl Case {
    /// The case's name, whatever its kind.
    pub fn name(&self) -> &str {
        match self {
            Case::Plan(c) => &c.name,
            Case::Capability(c) => &c.name,
            Case::Entity(c) => &c.name,
            Case::Snapshot(c) => &c.name,
        }
    }
}

/// One request over entities given as Cedar's entity JSON: the level at
/// which `policy diff` finds its counterexamples (a Worker's measured
/// attributes, not the registry row behind them).
#[derive(Debug, Clone)]
pub struct EntityCase {
    /// The case's name.
    pub name: String,
    /// The request's principal.
    pub principal: cedar_policy::EntityUid,
    /// The request's action.
    pub action: cedar_policy::EntityUid,
    /// The request's resource.
    pub resource: cedar_policy::EntityUid,
    /// The entities, in Cedar's entity JSON format.
    pub entities: Json,
    /// `expect.decision`: true for allow.
    pub allow: Option<bool>,
    /// `expect.reasons`: the reason codes of a deny, in order.
    pub reasons: Option<Vec<String>>,
}

/// One finding as a snapshot case expects it (and as a snapshot's finding
/// is compared with it).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ExpectedFinding {
    /// Its class's code.
    pub classification: String,
    /// The workers it names, as JSON text (`null` for a NULL identity),
    /// sorted.
    pub worker_identities: Vec<String>,
    /// Its instances, sorted.
    pub client_instance_ids: Vec<String>,
}

impl ExpectedFinding {
    /// A finding of `classification` naming these workers and instances
    /// (sorted here).
    pub fn new(
        classification: String,
        mut worker_identities: Vec<String>,
        mut client_instance_ids: Vec<String>,
    ) -> ExpectedFinding {
        worker_identities.sort();
        client_instance_ids.sort();
        ExpectedFinding {
            classification,
            worker_identities,
            client_instance_ids,
        }
    }
}

/// Shown as `(class, [workers], [instances])`, as a failing case reports it.
impl std::fmt::Debug for ExpectedFinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "({:?}, {:?}, {:?})",
            self.classification, self.worker_identities, self.client_instance_ids
        )
    }
}

/// What a snapshot case expects; absent members are not checked.
#[derive(Debug, Clone, Default)]
pub struct SnapshotExpect {
    /// `live_fleet_safe`.
    pub live_fleet_safe: Option<bool>,
    /// `live`, `stale`, `historical` and `instances` counts.
    pub counts: Option<BTreeMap<String, usize>>,
    /// Every finding, compared as a multiset.
    pub findings: Option<Vec<ExpectedFinding>>,
    /// The classes of the active blockers, as a multiset.
    pub active_blockers: Option<Vec<String>>,
    /// The consistency token (time-seeded by `now`, so fixed in a case).
    pub consistency_token: Option<String>,
}

/// One snapshot case: the rows and probes of a plan case, plus the
/// snapshot's own inputs.
#[derive(Debug, Clone)]
pub struct SnapshotCase {
    /// The case's name.
    pub name: String,
    /// The snapshot clock.
    pub now: Micros,
    /// `context.canonical_repository`.
    pub canonical_repository: Option<String>,
    /// `snapshot.expected_revision`.
    pub expected_revision: Option<String>,
    /// `snapshot.manifest`: the approved instances.
    pub manifest: Option<Vec<Json>>,
    /// Given probe answers.
    pub probe: GivenProbe,
    /// Registry rows.
    pub rows: Vec<Row>,
    /// Expectations.
    pub expect: SnapshotExpect,
}

/// A fixture file as serde reads it, before any check: the shape of
/// docs/fixtures.md, every member optional so that a missing one is named
/// by the check, never by a generic "missing field".
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UncheckedCase {
    name: Option<Json>,
    /// Free text for the reader; not checked.
    #[serde(default)]
    #[allow(dead_code)]
    description: Option<String>,
    now: Option<Json>,
    context: Option<UncheckedContext>,
    processes: Option<BTreeMap<String, UncheckedProcess>>,
    rows: Option<Vec<Map<String, Json>>>,
    /// Registry columns every row shares, its own keys winning
    /// (`defaults.rs`); an explicit null is kept apart to be refused.
    #[serde(default, deserialize_with = "present")]
    defaults: Option<Option<Json>>,
    leases: Option<Vec<Map<String, Json>>>,
    expect: Option<UncheckedExpect>,
    snapshot: Option<UncheckedSnapshot>,
    // A capability case: a profiles document and the requests to judge.
    profiles: Option<Json>,
    requests: Option<Vec<crate::capability::CaseRequest>>,
    // A Cedar-level case: one request over given entities.
    request: Option<UncheckedRequest>,
    entities: Option<Json>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UncheckedRequest {
    principal: UncheckedUid,
    action: UncheckedUid,
    resource: UncheckedUid,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UncheckedUid {
    #[serde(rename = "type")]
    type_name: String,
    id: String,
}

/// Present-and-null apart from absent: `Some(None)` is an explicit null.
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> std::result::Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UncheckedContext {
    #[serde(default)]
    host_id: Option<String>,
    #[serde(default)]
    boot_id: Option<String>,
    #[serde(default)]
    canonical_repository: Option<String>,
    #[serde(default, deserialize_with = "present")]
    pid_namespace: Option<Option<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UncheckedProcess {
    #[serde(default, deserialize_with = "present")]
    alive: Option<Option<bool>>,
    #[serde(default)]
    start_time: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UncheckedExpect {
    registry_fingerprint: Option<String>,
    candidate_fingerprint: Option<String>,
    candidates: Option<Vec<String>>,
    preserved: Option<BTreeMap<String, String>>,
    // Cedar-level cases only.
    decision: Option<String>,
    reasons: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UncheckedSnapshot {
    #[serde(default)]
    manifest: Option<Vec<Json>>,
    #[serde(default)]
    expected_revision: Option<String>,
    expect: Option<UncheckedSnapshotExpect>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UncheckedSnapshotExpect {
    live_fleet_safe: Option<bool>,
    counts: Option<BTreeMap<String, usize>>,
    findings: Option<Vec<UncheckedFinding>>,
    active_blockers: Option<Vec<String>>,
    consistency_token: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UncheckedFinding {
    classification: String,
    worker_identities: Vec<Json>,
    client_instance_ids: Vec<Json>,
}

/// A finding class a case names must exist: a typo would otherwise expect
/// a finding no snapshot can make.
fn finding_class(ctx: &Ctx, code: &str, field: &str) -> Result<String> {
    match crate::snapshot::FindingClass::from_code(code) {
        Some(_) => Ok(code.to_string()),
        None => Err(ctx.err(
            field,
            format!("{code:?} is not a finding class (see docs/snapshot-findings.md)"),
        )),
    }
}

impl UncheckedSnapshot {
    fn checked(self, ctx: &Ctx) -> Result<(Option<Vec<Json>>, Option<String>, SnapshotExpect)> {
        let exp = self
            .expect
            .ok_or_else(|| ctx.err("snapshot.expect", "missing; add it (see docs/fixtures.md)"))?;
        if let Some(k) = exp
            .counts
            .iter()
            .flat_map(|c| c.keys())
            .find(|k| !["live", "stale", "historical", "instances"].contains(&k.as_str()))
        {
            return Err(ctx.err(
                &format!("snapshot.expect.counts.{k}"),
                "use live, stale, historical or instances",
            ));
        }
        let findings = match exp.findings {
            None => None,
            Some(list) => {
                let mut keys = Vec::new();
                for (i, f) in list.into_iter().enumerate() {
                    let field = format!("snapshot.expect.findings[{i}].classification");
                    let class = finding_class(ctx, &f.classification, &field)?;
                    let workers = f.worker_identities.iter().map(Json::to_string).collect();
                    let instances = f
                        .client_instance_ids
                        .iter()
                        .map(|i| {
                            i.as_str()
                                .map(str::to_string)
                                .unwrap_or_else(|| i.to_string())
                        })
                        .collect();
                    keys.push(ExpectedFinding::new(class, workers, instances));
                }
                keys.sort();
                Some(keys)
            }
        };
        let active_blockers = match exp.active_blockers {
            None => None,
            Some(list) => {
                let mut classes = list
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        finding_class(ctx, c, &format!("snapshot.expect.active_blockers[{i}]"))
                    })
                    .collect::<Result<Vec<_>>>()?;
                classes.sort();
                Some(classes)
            }
        };
        Ok((
            self.manifest,
            self.expected_revision,
            SnapshotExpect {
                live_fleet_safe: exp.live_fleet_safe,
                counts: exp.counts,
                findings,
                active_blockers,
                consistency_token: exp.consistency_token,
            },
        ))
    }
}

impl SnapshotCase {
    /// Take the case's snapshot and compare it with the expectations; each
    /// difference is one line.
    pub fn differences(&self) -> Vec<Difference> {
        let opts = crate::snapshot::Options {
            now: self.now,
            canonical_repository: self.canonical_repository.clone(),
            expected_live_revision: self.expected_revision.clone(),
            manifest: self.manifest.clone(),
            host_id: None,
        };
        let snap = crate::snapshot::Snapshot::take(&self.rows, &opts, &self.probe);
        let mut diffs = Vec::new();
        let e = &self.expect;
        if let Some(want) = e.live_fleet_safe {
            if want != snap.live_fleet_safe() {
                diffs.push(Difference::new(
                    "live_fleet_safe",
                    want,
                    snap.live_fleet_safe(),
                ));
            }
        }
        if let Some(want) = &e.counts {
            let got: BTreeMap<String, usize> = [
                ("live", snap.live_worker_count()),
                ("stale", snap.stale_worker_count()),
                ("historical", snap.historical_worker_count()),
                ("instances", snap.instance_count()),
            ]
            .into_iter()
            .filter(|(k, _)| want.contains_key(*k))
            .map(|(k, v)| (k.to_string(), v))
            .collect();
            if *want != got {
                diffs.push(Difference::new(
                    "counts",
                    format!("{want:?}"),
                    format!("{got:?}"),
                ));
            }
        }
        let key = |f: &crate::snapshot::Finding| -> ExpectedFinding {
            ExpectedFinding::new(
                f.classification.to_string(),
                f.worker_identities.iter().map(Json::to_string).collect(),
                f.client_instance_ids.clone(),
            )
        };
        if let Some(want) = &e.findings {
            let mut got: Vec<ExpectedFinding> = snap.findings().map(|f| key(&f)).collect();
            got.sort();
            if *want != got {
                for missing in want.iter().filter(|w| !got.contains(w)) {
                    diffs.push(Difference::new(
                        "finding",
                        format!("{missing:?}"),
                        "(not found)",
                    ));
                }
                for extra in got.iter().filter(|g| !want.contains(g)) {
                    diffs.push(Difference::new("finding", "(none)", format!("{extra:?}")));
                }
                if diffs.is_empty() {
                    diffs.push(Difference::new(
                        "findings (in number)",
                        format!("{want:?}"),
                        format!("{got:?}"),
                    ));
                }
            }
        }
        if let Some(want) = &e.active_blockers {
            let mut got: Vec<String> = snap
                .active_blockers()
                .map(|f| f.classification.to_string())
                .collect();
            got.sort();
            if *want != got {
                diffs.push(Difference::new(
                    "active_blockers",
                    format!("{want:?}"),
                    format!("{got:?}"),
                ));
            }
        }
        if let Some(want) = &e.consistency_token {
            if want != snap.consistency_token() {
                diffs.push(Difference::new(
                    "consistency_token",
                    want,
                    snap.consistency_token(),
                ));
            }
        }
        diffs
    }
}

struct Ctx<'a> {
    path: &'a Path,
}

impl Ctx<'_> {
    fn err(&self, field: &str, message: impl std::fmt::Display) -> Error {
        Error::Fixture {
            path: self.path.to_path_buf(),
            message: format!("field `{field}`: {message}"),
        }
    }
}

/// Parse one fixture file: serde reads it as [`UncheckedCase`], then each
/// member is checked, and every error names the file and the member.
pub fn load(path: &Path) -> Result<Case> {
    let fixture_err = |message: String| Error::Fixture {
        path: path.to_path_buf(),
        message,
    };
    let (doc, _) = crate::jsonfile::read_json(path).map_err(fixture_err)?;
    parse(path, doc)
}

/// Check a fixture document already read (`path` names it in errors).
pub fn parse(path: &Path, doc: Json) -> Result<Case> {
    let ctx = Ctx { path };
    let fixture_err = |message: String| Error::Fixture {
        path: path.to_path_buf(),
        message,
    };
    if !doc.is_object() {
        return Err(ctx.err("(top level)", format!("expected an object, found {doc}")));
    }
    let case: UncheckedCase = crate::jsonfile::typed(doc)
        .map_err(|e| fixture_err(format!("{e} (see docs/fixtures.md)")))?;
    let name = match &case.name {
        Some(Json::String(s)) if !s.trim().is_empty() => s.clone(),
        _ => {
            return Err(ctx.err(
                "name",
                "missing or not a non-empty string; give the case a one-line name",
            ))
        }
    };
    if case.defaults.is_some() && (case.requests.is_some() || case.request.is_some()) {
        return Err(ctx.err(
            "defaults",
            "gives the columns shared by `rows`; a capability or Cedar-level case has none",
        ));
    }
    if let Some(requests) = case.requests {
        return crate::capability::parse_case(path, name, case.profiles.as_ref(), requests)
            .map(Case::Capability);
    }
    if let Some(request) = case.request {
        return entity_case(&ctx, name, request, case.entities, case.expect).map(Case::Entity);
    }
    let now = planning_clock(&ctx, case.now.as_ref())?;
    let (host, canonical_repository) = run_context(
        case.context
            .ok_or_else(|| ctx.err("context", "missing; add it (see docs/fixtures.md)"))?,
    );
    let probe = given_probe(
        &ctx,
        case.processes
            .ok_or_else(|| ctx.err("processes", "missing; add it (see docs/fixtures.md)"))?,
    )?;
    let rows = defaults::apply(&ctx, case.defaults, case.rows)?;
    let rows = each(&ctx, rows, "rows", Row::from_json)?;
    if let Some(spec) = case.snapshot {
        let (manifest, expected_revision, expect) = spec.checked(&ctx)?;
        return Ok(Case::Snapshot(Box::new(SnapshotCase {
            name,
            now,
            canonical_repository,
            expected_revision,
            manifest,
            probe,
            rows,
            expect,
        })));
    }
    let leases = each(&ctx, case.leases, "leases", Lease::from_json)?;
    Ok(Case::Plan(Box::new(PlanCase {
        name,
        now,
        host,
        canonical_repository,
        probe,
        rows,
        leases,
        expect: plan_expect(&ctx, case.expect)?,
    })))
}

/// `now`: a strict UTC stamp.
fn planning_clock(ctx: &Ctx, now: Option<&Json>) -> Result<Micros> {
    let Some(Json::String(text)) = now else {
        return Err(ctx.err(
            "now",
            "missing or not a string; give the planning clock as YYYY-MM-DDTHH:MM:SSZ",
        ));
    };
    parse_ts(text).ok_or_else(|| {
        ctx.err(
            "now",
            format!("{text:?} is not a strict UTC stamp (YYYY-MM-DDTHH:MM:SSZ)"),
        )
    })
}

/// A plan case's `expect`: required, without a Cedar-level case's members,
/// every expected reason a known code.
fn plan_expect(ctx: &Ctx, expect: Option<UncheckedExpect>) -> Result<Expect> {
    let exp = expect.ok_or_else(|| ctx.err("expect", "missing; add it (see docs/fixtures.md)"))?;
    if exp.decision.is_some() || exp.reasons.is_some() {
        return Err(ctx.err(
            "expect.decision",
            "belongs to a Cedar-level case (one with `request` and `entities`); a plan case \
             expects `candidates` and `preserved`",
        ));
    }
    for (worker, code) in exp.preserved.iter().flatten() {
        if crate::reasons::Reason::from_code(code).is_none() {
            return Err(ctx.err(
                &format!("expect.preserved.{worker}"),
                format!("{code:?} is not a known reason code (see docs/reason-codes.md)"),
            ));
        }
    }
    Ok(Expect {
        registry_fingerprint: exp.registry_fingerprint,
        candidate_fingerprint: exp.candidate_fingerprint,
        candidates: exp.candidates,
        preserved: exp.preserved,
    })
}

fn entity_case(
    ctx: &Ctx,
    name: String,
    request: UncheckedRequest,
    entities: Option<Json>,
    expect: Option<UncheckedExpect>,
) -> Result<Box<EntityCase>> {
    let uid = |field: &str, u: UncheckedUid| -> Result<cedar_policy::EntityUid> {
        let type_name = cedar_policy::EntityTypeName::from_str(&u.type_name).map_err(|e| {
            ctx.err(
                field,
                format!("{:?} is not an entity type name: {e}", u.type_name),
            )
        })?;
        Ok(cedar_policy::EntityUid::from_type_name_and_id(
            type_name,
            cedar_policy::EntityId::new(&u.id),
        ))
    };
    let entities = match entities {
        Some(e @ Json::Array(_)) => e,
        Some(other) => {
            return Err(ctx.err(
                "entities",
                format!("must be a list of Cedar entities, not {other}"),
            ))
        }
        None => {
            return Err(ctx.err(
                "entities",
                "missing; a case with `request` gives the entities as Cedar entity JSON",
            ))
        }
    };
    let exp = expect.ok_or_else(|| {
        ctx.err(
            "expect",
            "missing; add {\"decision\": \"allow\"} or {\"decision\": \"deny\"}",
        )
    })?;
    if exp.candidates.is_some()
        || exp.preserved.is_some()
        || exp.registry_fingerprint.is_some()
        || exp.candidate_fingerprint.is_some()
    {
        return Err(ctx.err(
            "expect",
            "a Cedar-level case expects only `decision` and `reasons`",
        ));
    }
    let allow = match exp.decision.as_deref() {
        None => None,
        Some("allow") => Some(true),
        Some("deny") => Some(false),
        Some(other) => {
            return Err(ctx.err(
                "expect.decision",
                format!("{other:?} is neither \"allow\" nor \"deny\""),
            ))
        }
    };
    for code in exp.reasons.iter().flatten() {
        if crate::reasons::Reason::from_code(code).is_none() {
            return Err(ctx.err(
                "expect.reasons",
                format!("{code:?} is not a known reason code (see docs/reason-codes.md)"),
            ));
        }
    }
    Ok(Box::new(EntityCase {
        name,
        principal: uid("request.principal", request.principal)?,
        action: uid("request.action", request.action)?,
        resource: uid("request.resource", request.resource)?,
        entities,
        allow,
        reasons: exp.reasons,
    }))
}

impl EntityCase {
    /// Cedar's verdict on the case's request under `policies`; entities
    /// that do not conform to the schema are an error naming the file.
    pub fn verdict(
        &self,
        policies: &Policies,
        path: &Path,
    ) -> Result<crate::policy::eval::Verdict> {
        let entities =
            cedar_policy::Entities::from_json_value(self.entities.clone(), Some(&policies.schema))
                .map_err(|e| Error::Fixture {
                    path: path.to_path_buf(),
                    message: format!("field `entities`: {e}"),
                })?;
        Ok(crate::policy::eval::judge(
            policies,
            &cedar_policy::Authorizer::new(),
            &entities,
            &self.principal,
            &self.action,
            &self.resource,
        ))
    }

    /// Compare Cedar's verdict with the expectations; one line per difference.
    pub fn differences(&self, policies: &Policies, path: &Path) -> Result<Vec<Difference>> {
        let verdict = self.verdict(policies, path)?;
        let word = |allow: bool| if allow { "allow" } else { "deny" };
        let mut diffs = Vec::new();
        if let Some(want) = self.allow {
            if want != verdict.allowed {
                diffs.push(Difference::new(
                    "decision",
                    word(want),
                    word(verdict.allowed),
                ));
            }
        }
        if let Some(want) = &self.reasons {
            let got: Vec<&str> = verdict.reason_codes().iter().map(|r| r.code()).collect();
            if *want != got {
                diffs.push(Difference::new(
                    "reasons",
                    format!("{want:?}"),
                    format!("{got:?}"),
                ));
            }
        }
        Ok(diffs)
    }
}

/// The run's facts as a case gives them: this host's ids, the pid
/// namespace (absent: the initial one, where every pid is visible, so rows
/// without the column are judged as before; `null`: unreadable), and the
/// canonical repository. A fixture gives its start times.
fn run_context(context: UncheckedContext) -> (HostFacts, Option<String>) {
    let host = HostFacts {
        host_id: context.host_id,
        boot_id: context.boot_id,
        pid_namespace: context
            .pid_namespace
            .unwrap_or_else(|| Some(crate::evidence::probe::INITIAL_PID_NAMESPACE.to_string())),
        start_time_probe_available: true,
    };
    (host, context.canonical_repository)
}

/// Every element of a required list, converted, an error naming its index.
fn each<T>(
    ctx: &Ctx,
    list: Option<Vec<Map<String, Json>>>,
    field: &str,
    convert: impl Fn(&Map<String, Json>) -> std::result::Result<T, String>,
) -> Result<Vec<T>> {
    list.ok_or_else(|| ctx.err(field, "missing; add it (see docs/fixtures.md)"))?
        .iter()
        .enumerate()
        .map(|(i, x)| convert(x).map_err(|e| ctx.err(&format!("{field}[{i}]"), e)))
        .collect()
}

/// The given probe answers. Keys are pid text matched exactly against the
/// pid as printed: "04242" or "+4242" names no pid (as in the reference),
/// so a row with pid 4242 is probed dead.
fn given_probe(ctx: &Ctx, processes: BTreeMap<String, UncheckedProcess>) -> Result<GivenProbe> {
    let mut probe = GivenProbe::default();
    for (pid_text, entry) in processes {
        let field = format!("processes.{pid_text}");
        let pid: i64 = pid_text
            .parse()
            .map_err(|_| ctx.err(&field, "process keys must be integer pids"))?;
        let alive = entry.alive.ok_or_else(|| {
            ctx.err(
                &format!("{field}.alive"),
                "required: true, false or null (unknown)",
            )
        })?;
        if pid.to_string() == pid_text {
            probe.processes.insert(
                pid,
                PidObservation {
                    alive,
                    start_time: entry.start_time,
                },
            );
        }
    }
    Ok(probe)
}

impl PlanCase {
    /// Run the case's plan.
    pub fn plan(&self, policies: &Policies) -> Result<Plan> {
        let facts = RunFacts {
            now: self.now,
            host: self.host.clone(),
            canonical_repository: self.canonical_repository.clone(),
            protections: Protections::from_leases(&self.leases),
            active_leases: self
                .leases
                .iter()
                .filter(|l| l.is_active())
                .cloned()
                .collect(),
        };
        plan(self.rows.clone(), facts, &self.probe, policies)
    }

    /// Compare a plan with the expectations; each difference is one line.
    pub fn differences(&self, plan: &Plan) -> Vec<Difference> {
        let mut diffs = Vec::new();
        let e = &self.expect;
        if let Some(want) = &e.registry_fingerprint {
            if *want != plan.registry_fingerprint {
                diffs.push(Difference::new(
                    "registry_fingerprint",
                    want,
                    &plan.registry_fingerprint,
                ));
            }
        }
        if let Some(want) = &e.candidate_fingerprint {
            if *want != plan.candidate_fingerprint {
                diffs.push(Difference::new(
                    "candidate_fingerprint",
                    want,
                    &plan.candidate_fingerprint,
                ));
            }
        }
        if let Some(want) = &e.candidates {
            let got: Vec<String> = plan.candidates().map(|c| plan.identity(c)).collect();
            if *want != got {
                diffs.push(Difference::new(
                    "candidates",
                    format!("{want:?}"),
                    format!("{got:?}"),
                ));
            }
        }
        if let Some(want) = &e.preserved {
            let got: BTreeMap<String, String> = plan
                .preserved()
                .map(|p| (plan.identity(p), p.reason().code().to_string()))
                .collect();
            for (worker, code) in want {
                match got.get(worker) {
                    Some(g) if g == code => {}
                    Some(g) => {
                        diffs.push(Difference::new(format!("preserved {worker:?}"), code, g))
                    }
                    None => diffs.push(Difference::new(
                        format!("preserved {worker:?}"),
                        code,
                        not_preserved(plan, worker),
                    )),
                }
            }
            for (worker, code) in &got {
                if !want.contains_key(worker) {
                    diffs.push(Difference::new(
                        format!("preserved {worker:?}"),
                        "not preserved",
                        code,
                    ));
                }
            }
        }
        diffs
    }
}

/// What became of an expected-preserved worker that was not preserved.
fn not_preserved(plan: &Plan, worker: &str) -> &'static str {
    if plan.entries.iter().any(|e| plan.identity(e) == worker) {
        "a candidate (not preserved)"
    } else {
        "no row has this worker_identity"
    }
}

/// Expand paths into fixture files: a folder means every `*.json` below it,
/// sorted; a file means itself.
pub fn collect(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut found = Vec::new();
            walk(p, &mut found)?;
            found.sort();
            out.extend(found);
        } else if p.is_file() {
            out.push(p.clone());
        } else {
            return Err(Error::input(
                About::File(p.to_path_buf()),
                format!("{}: no such fixture file or folder", p.display()),
            ));
        }
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries =
        std::fs::read_dir(dir).map_err(Error::io(dir, "cannot list the fixture folder"))?;
    for entry in entries {
        let path = entry
            .map_err(Error::io(dir, "cannot list the fixture folder"))?
            .path();
        if path.is_dir() {
            walk(&path, out)?;
        } else if path.extension().is_some_and(|x| x == "json") {
            out.push(path);
        }
    }
    Ok(())
}

//! Policy regression fixtures (semantics §9): one JSON file per case, with
//! process probes given rather than taken, so a case means the same on every
//! machine.

use crate::error::{Error, Result};
use crate::evidence::leases::{Lease, Protections};
use crate::evidence::probe::{GivenProbe, HostFacts, PidObservation};
use crate::observe::RunFacts;
use crate::plan::{plan, Plan};
use crate::policy::Policies;
use crate::row::Row;
use crate::time::{parse_ts, Micros};
use serde_json::{Map, Value as Json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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
}

/// One finding as a snapshot case expects it: its class, the workers it
/// names (as JSON text: `null` for a NULL identity) and its instances, each
/// list sorted.
pub type ExpectedFinding = (String, Vec<String>, Vec<String>);

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

fn finding_key(ctx: &Ctx, f: &Json, field: &str) -> Result<ExpectedFinding> {
    let obj = object(ctx, Some(f), field)?;
    let class = obj
        .get("classification")
        .and_then(Json::as_str)
        .ok_or_else(|| ctx.err(field, "needs a string `classification`"))?;
    let mut workers: Vec<String> = array(
        ctx,
        obj.get("worker_identities"),
        &format!("{field}.worker_identities"),
    )?
    .iter()
    .map(Json::to_string)
    .collect();
    workers.sort();
    let mut instances: Vec<String> = array(
        ctx,
        obj.get("client_instance_ids"),
        &format!("{field}.client_instance_ids"),
    )?
    .iter()
    .map(|i| {
        i.as_str()
            .map(str::to_string)
            .unwrap_or_else(|| i.to_string())
    })
    .collect();
    instances.sort();
    Ok((class.to_string(), workers, instances))
}

fn snapshot_case(
    ctx: &Ctx,
    name: String,
    now: Micros,
    canonical_repository: Option<String>,
    probe: GivenProbe,
    rows: Vec<Row>,
    spec: &Map<String, Json>,
) -> Result<Case> {
    let manifest = match spec.get("manifest") {
        None | Some(Json::Null) => None,
        Some(Json::Array(items)) => Some(items.clone()),
        Some(other) => {
            return Err(ctx.err(
                "snapshot.manifest",
                format!(
                    "expected a list of {{\"client_instance_id\": ...}} or null, found {other}"
                ),
            ))
        }
    };
    let expected_revision =
        opt_string(ctx, spec, "expected_revision", "snapshot.expected_revision")?;
    let exp = object(ctx, spec.get("expect"), "snapshot.expect")?;
    let mut expect = SnapshotExpect {
        consistency_token: opt_string(
            ctx,
            exp,
            "consistency_token",
            "snapshot.expect.consistency_token",
        )?,
        ..SnapshotExpect::default()
    };
    match exp.get("live_fleet_safe") {
        None => {}
        Some(Json::Bool(b)) => expect.live_fleet_safe = Some(*b),
        Some(_) => return Err(ctx.err("snapshot.expect.live_fleet_safe", "must be true or false")),
    }
    if let Some(c) = exp.get("counts") {
        let mut counts = BTreeMap::new();
        for (k, v) in object(ctx, Some(c), "snapshot.expect.counts")? {
            if !["live", "stale", "historical", "instances"].contains(&k.as_str()) {
                return Err(ctx.err(
                    &format!("snapshot.expect.counts.{k}"),
                    "use live, stale, historical or instances",
                ));
            }
            let n = v.as_u64().ok_or_else(|| {
                ctx.err(
                    &format!("snapshot.expect.counts.{k}"),
                    "must be a whole number",
                )
            })?;
            counts.insert(k.clone(), n as usize);
        }
        expect.counts = Some(counts);
    }
    if let Some(f) = exp.get("findings") {
        let mut list = array(ctx, Some(f), "snapshot.expect.findings")?
            .iter()
            .enumerate()
            .map(|(i, x)| finding_key(ctx, x, &format!("snapshot.expect.findings[{i}]")))
            .collect::<Result<Vec<_>>>()?;
        list.sort();
        expect.findings = Some(list);
    }
    if let Some(b) = exp.get("active_blockers") {
        let mut list = array(ctx, Some(b), "snapshot.expect.active_blockers")?
            .iter()
            .map(|x| {
                x.as_str().map(str::to_string).ok_or_else(|| {
                    ctx.err(
                        "snapshot.expect.active_blockers",
                        "entries are finding classes (strings)",
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?;
        list.sort();
        expect.active_blockers = Some(list);
    }
    Ok(Case::Snapshot(Box::new(SnapshotCase {
        name,
        now,
        canonical_repository,
        expected_revision,
        manifest,
        probe,
        rows,
        expect,
    })))
}

impl SnapshotCase {
    /// Take the case's snapshot and compare it with the expectations; each
    /// difference is one line.
    pub fn differences(&self) -> Vec<String> {
        let opts = crate::snapshot::Options {
            now: self.now,
            canonical_repository: self.canonical_repository.clone(),
            expected_live_revision: self.expected_revision.clone(),
            manifest: self.manifest.clone(),
        };
        let snap = crate::snapshot::Snapshot::take(&self.rows, &opts, &self.probe);
        let mut diffs = Vec::new();
        let e = &self.expect;
        if let Some(want) = e.live_fleet_safe {
            if want != snap.live_fleet_safe() {
                diffs.push(format!(
                    "live_fleet_safe: want {want}, got {}",
                    snap.live_fleet_safe()
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
                diffs.push(format!("counts: want {want:?}, got {got:?}"));
            }
        }
        let key = |f: &crate::snapshot::Finding| -> ExpectedFinding {
            let mut w: Vec<String> = f.worker_identities.iter().map(Json::to_string).collect();
            w.sort();
            let mut i = f.client_instance_ids.clone();
            i.sort();
            (f.classification.to_string(), w, i)
        };
        if let Some(want) = &e.findings {
            let mut got: Vec<ExpectedFinding> = snap.findings().map(|f| key(&f)).collect();
            got.sort();
            if *want != got {
                for missing in want.iter().filter(|w| !got.contains(w)) {
                    diffs.push(format!("finding expected but not found: {missing:?}"));
                }
                for extra in got.iter().filter(|g| !want.contains(g)) {
                    diffs.push(format!("finding not expected: {extra:?}"));
                }
                if diffs.is_empty() {
                    diffs.push(format!(
                        "findings differ in number: want {want:?}, got {got:?}"
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
                diffs.push(format!("active_blockers: want {want:?}, got {got:?}"));
            }
        }
        if let Some(want) = &e.consistency_token {
            if want != snap.consistency_token() {
                diffs.push(format!(
                    "consistency_token: want {want}, got {}",
                    snap.consistency_token()
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

fn opt_string(
    ctx: &Ctx,
    obj: &Map<String, Json>,
    key: &str,
    field: &str,
) -> Result<Option<String>> {
    match obj.get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(ctx.err(field, format!("expected a string or null, found {other}"))),
    }
}

fn object<'a>(ctx: &Ctx, v: Option<&'a Json>, field: &str) -> Result<&'a Map<String, Json>> {
    match v {
        Some(Json::Object(m)) => Ok(m),
        Some(other) => Err(ctx.err(field, format!("expected an object, found {other}"))),
        None => Err(ctx.err(field, "missing; add it (see docs/fixtures.md)")),
    }
}

fn array<'a>(ctx: &Ctx, v: Option<&'a Json>, field: &str) -> Result<&'a Vec<Json>> {
    match v {
        Some(Json::Array(a)) => Ok(a),
        Some(other) => Err(ctx.err(field, format!("expected an array, found {other}"))),
        None => Err(ctx.err(field, "missing; add it (see docs/fixtures.md)")),
    }
}

/// Parse one fixture file.
pub fn load(path: &Path) -> Result<Case> {
    let ctx = Ctx { path };
    let (doc, _) = crate::jsonfile::read_json(path).map_err(|message| Error::Fixture {
        path: path.to_path_buf(),
        message,
    })?;
    let top = object(&ctx, Some(&doc), "(top level)")?;
    let name = match top.get("name") {
        Some(Json::String(s)) if !s.trim().is_empty() => s.clone(),
        _ => {
            return Err(ctx.err(
                "name",
                "missing or not a non-empty string; give the case a one-line name",
            ))
        }
    };
    if top.contains_key("requests") {
        return crate::capability::parse_case(path, name, top).map(Case::Capability);
    }
    let now_text = match top.get("now") {
        Some(Json::String(s)) => s,
        _ => {
            return Err(ctx.err(
                "now",
                "missing or not a string; give the planning clock as YYYY-MM-DDTHH:MM:SSZ",
            ))
        }
    };
    let now = parse_ts(now_text).ok_or_else(|| {
        ctx.err(
            "now",
            format!("{now_text:?} is not a strict UTC stamp (YYYY-MM-DDTHH:MM:SSZ)"),
        )
    })?;
    let context = object(&ctx, top.get("context"), "context")?;
    let host = HostFacts {
        host_id: opt_string(&ctx, context, "host_id", "context.host_id")?,
        boot_id: opt_string(&ctx, context, "boot_id", "context.boot_id")?,
        // Absent: the run is in the initial namespace, where every pid is
        // visible, so rows without the column are judged as before.
        pid_namespace: if context.contains_key("pid_namespace") {
            opt_string(&ctx, context, "pid_namespace", "context.pid_namespace")?
        } else {
            Some(crate::evidence::probe::INITIAL_PID_NAMESPACE.to_string())
        },
        // A fixture gives its start times.
        start_time_probe_available: true,
    };
    let canonical_repository = opt_string(
        &ctx,
        context,
        "canonical_repository",
        "context.canonical_repository",
    )?;

    let mut probe = GivenProbe::default();
    for (pid_text, entry) in object(&ctx, top.get("processes"), "processes")? {
        let field = format!("processes.{pid_text}");
        let pid: i64 = pid_text
            .parse()
            .map_err(|_| ctx.err(&field, "process keys must be integer pids"))?;
        let entry = object(&ctx, Some(entry), &field)?;
        // Keys are pid text, matched exactly against the pid as printed:
        // "04242" or "+4242" names no pid (as in the reference), so a row
        // with pid 4242 is probed dead.
        let exact = pid.to_string() == *pid_text;
        let alive = match entry.get("alive") {
            Some(Json::Bool(b)) => Some(*b),
            Some(Json::Null) => None,
            _ => {
                return Err(ctx.err(
                    &format!("{field}.alive"),
                    "required: true, false or null (unknown)",
                ))
            }
        };
        let start_time = opt_string(&ctx, entry, "start_time", &format!("{field}.start_time"))?;
        if exact {
            probe
                .processes
                .insert(pid, PidObservation { alive, start_time });
        }
    }

    let mut rows = Vec::new();
    for (i, r) in array(&ctx, top.get("rows"), "rows")?.iter().enumerate() {
        let field = format!("rows[{i}]");
        let obj = object(&ctx, Some(r), &field)?;
        rows.push(Row::from_json(obj).map_err(|e| ctx.err(&field, e))?);
    }
    if let Some(spec) = top.get("snapshot") {
        let spec = object(&ctx, Some(spec), "snapshot")?;
        return snapshot_case(&ctx, name, now, canonical_repository, probe, rows, spec);
    }
    let mut leases = Vec::new();
    for (i, l) in array(&ctx, top.get("leases"), "leases")?.iter().enumerate() {
        let field = format!("leases[{i}]");
        let obj = object(&ctx, Some(l), &field)?;
        leases.push(Lease::from_json(obj).map_err(|e| ctx.err(&field, e))?);
    }

    let exp = object(&ctx, top.get("expect"), "expect")?;
    let mut expect = Expect {
        registry_fingerprint: opt_string(
            &ctx,
            exp,
            "registry_fingerprint",
            "expect.registry_fingerprint",
        )?,
        candidate_fingerprint: opt_string(
            &ctx,
            exp,
            "candidate_fingerprint",
            "expect.candidate_fingerprint",
        )?,
        ..Expect::default()
    };
    if let Some(c) = exp.get("candidates") {
        let list = array(&ctx, Some(c), "expect.candidates")?;
        expect.candidates = Some(
            list.iter()
                .map(|x| {
                    x.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| ctx.err("expect.candidates", "entries must be strings"))
                })
                .collect::<Result<_>>()?,
        );
    }
    if let Some(p) = exp.get("preserved") {
        let map = object(&ctx, Some(p), "expect.preserved")?;
        let mut out = BTreeMap::new();
        for (k, v) in map {
            let code = v.as_str().ok_or_else(|| {
                ctx.err(
                    &format!("expect.preserved.{k}"),
                    "must be a reason code string",
                )
            })?;
            if crate::reasons::Reason::from_code(code).is_none() {
                return Err(ctx.err(
                    &format!("expect.preserved.{k}"),
                    format!("{code:?} is not a known reason code"),
                ));
            }
            out.insert(k.clone(), code.to_string());
        }
        expect.preserved = Some(out);
    }
    Ok(Case::Plan(Box::new(PlanCase {
        name,
        now,
        host,
        canonical_repository,
        probe,
        rows,
        leases,
        expect,
    })))
}

impl PlanCase {
    /// Run the case's plan.
    pub fn plan(&self, policies: &Policies) -> Result<Plan> {
        let facts = RunFacts {
            now: self.now,
            host: self.host.clone(),
            canonical_repository: self.canonical_repository.clone(),
            protections: Protections::from_leases(&self.leases),
        };
        plan(self.rows.clone(), facts, &self.probe, policies)
    }

    /// Compare a plan with the expectations; each difference is one line.
    pub fn differences(&self, plan: &Plan) -> Vec<String> {
        let mut diffs = Vec::new();
        let e = &self.expect;
        if let Some(want) = &e.registry_fingerprint {
            if *want != plan.registry_fingerprint {
                diffs.push(format!(
                    "registry_fingerprint: want {want}, got {}",
                    plan.registry_fingerprint
                ));
            }
        }
        if let Some(want) = &e.candidate_fingerprint {
            if *want != plan.candidate_fingerprint {
                diffs.push(format!(
                    "candidate_fingerprint: want {want}, got {}",
                    plan.candidate_fingerprint
                ));
            }
        }
        if let Some(want) = &e.candidates {
            let got: Vec<String> = plan.candidates().map(|c| plan.identity(c)).collect();
            if *want != got {
                diffs.push(format!("candidates: want {want:?}, got {got:?}"));
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
                    Some(g) => diffs.push(format!("preserved {worker:?}: want {code}, got {g}")),
                    None => diffs.push(format!(
                        "preserved {worker:?}: want {code}, but it was not preserved"
                    )),
                }
            }
            for (worker, code) in &got {
                if !want.contains_key(worker) {
                    diffs.push(format!("preserved {worker:?}: not expected, got {code}"));
                }
            }
        }
        diffs
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
            return Err(Error::Input(format!(
                "{}: no such fixture file or folder",
                p.display()
            )));
        }
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| Error::Input(format!("{}: cannot list: {e}", dir.display())))?;
    for entry in entries {
        let path = entry
            .map_err(|e| Error::Input(format!("{}: cannot list: {e}", dir.display())))?
            .path();
        if path.is_dir() {
            walk(&path, out)?;
        } else if path.extension().is_some_and(|x| x == "json") {
            out.push(path);
        }
    }
    Ok(())
}

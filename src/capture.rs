//! `fixture capture`: turn rows of a real registry into a fixture case
//! (docs/fixtures.md) that reproduces today's verdict on them.
//!
//! The case holds each chosen row and every row that bears on its verdict:
//! rows with the same worker identity, rows sharing any identity evidence
//! value (session, generation, process identity, pid), and the other
//! active claimants of its (instance, namespace) slot. The first-stage
//! answers a peer contributes are judged on the peer alone, so these rows
//! are enough to reproduce the chosen rows' verdicts. It also holds the
//! active leases that protect any captured row, the probe answers observed
//! now for every captured pid, this host's facts and the planning clock.
//!
//! Secrets are replaced by stable placeholders: a column named for a secret
//! (`token_fingerprint`) whole, and in every other text value whatever the
//! one scanner of [`scrub`] finds (URL credentials, authorization
//! credentials, known token prefixes, private keys); the capture reports
//! what it replaced. Before the case is handed out it is planned on its own, and
//! every chosen row must get the verdict it has in the registry: a capture
//! that cannot reproduce its rows is refused rather than written.

use crate::error::{About, Error, Result};
use crate::evidence::leases::Protections;
use crate::evidence::probe::{RecordingProbe, SystemProbe};
use crate::observe::{conflict_keys, RunFacts};
use crate::plan::{Entry, Plan};
use crate::policy::Policies;
use crate::row::{Col, COLUMNS};
use crate::value::Val;
use serde_json::{json, Map, Value as Json};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

pub mod scrub;

use scrub::Scrubber;

/// Which rows to capture.
#[derive(Debug, Clone)]
pub enum Selection {
    /// These worker identities (canonical text, exact).
    Workers(Vec<String>),
    /// Every preserved row whose primary reason is this code.
    PreservedBy(String),
    /// Every candidate.
    Candidates,
}

/// A captured case and what was done to make it.
#[derive(Debug, Clone)]
pub struct Captured {
    /// The fixture document.
    pub case: Json,
    /// The chosen rows' identities.
    pub chosen: Vec<String>,
    /// How many rows the case holds.
    pub rows: usize,
    /// How many values were replaced by placeholders, by column.
    pub redacted: BTreeMap<String, usize>,
}

fn verdict_of(entry: &Entry) -> String {
    if entry.is_candidate() {
        "candidate".into()
    } else {
        entry.reason().code().into()
    }
}

/// Read the registry and leases, probe this host, plan, and capture the
/// selected rows as a fixture case.
pub fn capture_from_files(
    registry: &Path,
    leases: &Path,
    proc_root: &Path,
    canonical_repository: String,
    policies: &Policies,
    selection: &Selection,
) -> Result<Captured> {
    let rows = crate::evidence::registry::load(registry)?;
    let lease_rows = crate::evidence::leases::load(leases)?;
    let facts = RunFacts::of_this_host(proc_root, Some(canonical_repository), &lease_rows);
    let system = SystemProbe::new(proc_root);
    let recording = RecordingProbe::new(&system);
    let plan = crate::plan::plan(rows, facts, &recording, policies)?;
    capture(
        &plan,
        &lease_rows,
        &recording,
        policies,
        selection,
        registry,
    )
}

/// Capture from a plan made with `probe` (whose answers go into the case).
pub fn capture(
    plan: &Plan,
    leases: &[crate::evidence::leases::Lease],
    probe: &RecordingProbe<'_>,
    policies: &Policies,
    selection: &Selection,
    source: &Path,
) -> Result<Captured> {
    let chosen = chosen_rows(plan, selection, source)?;
    let included = bearing_rows(plan, &chosen);
    let relevant = protecting_leases(plan, leases, &included);
    // The redactor numbers its placeholders in the order it meets secrets:
    // rows, then leases, then the context, then the chosen names.
    let mut redactor = Redactor::default();
    let rows_json = rows_json(plan, &included, &mut redactor);
    let leases_json = leases_json(&relevant, &mut redactor);
    let processes = processes_json(plan, probe, &included);
    let context = context_json(plan, &mut redactor);
    let chosen = Chosen::of(plan, chosen, &mut redactor);
    let mut case = json!({
        "name": headline(selection, &chosen),
        "description": description(plan, policies, source, &chosen, &redactor),
        "now": crate::time::format_ts(plan.facts.now),
        "context": context,
        "processes": processes,
        "rows": rows_json,
        "leases": leases_json,
        "expect": {},
    });
    let replay = replay(&case, policies, &chosen, &included)?;
    case["expect"] = expectation(&replay);
    Ok(Captured {
        case,
        chosen: chosen.names,
        rows: included.len(),
        redacted: redactor.counts,
    })
}

/// The chosen rows, with the names and verdicts the case reports for them.
struct Chosen {
    /// Their indexes in the plan, in selection order.
    indexes: Vec<usize>,
    /// Their worker identities, with the placeholders the rows got.
    names: Vec<String>,
    /// Their verdicts in the registry (`candidate` or a reason code).
    verdicts: Vec<String>,
}

impl Chosen {
    /// Name and judge the rows at `indexes`.
    fn of(plan: &Plan, indexes: Vec<usize>, redactor: &mut Redactor) -> Chosen {
        let names = indexes
            .iter()
            .map(|&i| redactor.text(&plan.rows[i].get(Col::WorkerIdentity).canon()))
            .collect();
        let verdicts = indexes
            .iter()
            .map(|&i| verdict_of(&plan.entries[i]))
            .collect();
        Chosen {
            indexes,
            names,
            verdicts,
        }
    }
}

/// The plan indexes of the rows `selection` names; an error when it names
/// none, or names a worker or reason code that is not there.
fn chosen_rows(plan: &Plan, selection: &Selection, source: &Path) -> Result<Vec<usize>> {
    let chosen: Vec<usize> = match selection {
        Selection::Workers(ids) => workers_rows(plan, ids, source)?,
        Selection::PreservedBy(code) => preserved_rows(plan, code)?,
        Selection::Candidates => plan.candidates().map(|e| e.index).collect(),
    };
    if chosen.is_empty() {
        return Err(Error::input(
            About::Option("fixture capture"),
            format!(
                "no row of {} matches the selection; nothing to capture",
                crate::store::location::label(source)
            ),
        ));
    }
    Ok(chosen)
}

/// The rows of each named worker identity, in the order named; an error
/// for an identity no row has.
fn workers_rows(plan: &Plan, ids: &[String], source: &Path) -> Result<Vec<usize>> {
    let mut out = Vec::new();
    for id in ids {
        let found: Vec<usize> = plan
            .entries
            .iter()
            .filter(|e| plan.identity(e) == *id)
            .map(|e| e.index)
            .collect();
        if found.is_empty() {
            return Err(Error::input(
                About::Worker(id.to_string()),
                format!(
                    "no row of {} has worker_identity {:?}; `fleet-retire plan --all` lists them",
                    crate::store::location::label(source),
                    crate::text::esc(id)
                ),
            ));
        }
        out.extend(found);
    }
    Ok(out)
}

/// The preserved rows whose primary reason is `code`; an error when `code`
/// is not a reason code.
fn preserved_rows(plan: &Plan, code: &str) -> Result<Vec<usize>> {
    if crate::reasons::Reason::from_code(code).is_none() {
        return Err(Error::input(
            About::Option("--all-preserved-by"),
            format!("{code:?} is not a reason code (docs/reason-codes.md lists them)"),
        ));
    }
    Ok(plan
        .preserved()
        .filter(|e| e.reason().code() == code)
        .map(|e| e.index)
        .collect())
}

/// The active leases that protect any of the `included` rows.
fn protecting_leases<'a>(
    plan: &Plan,
    leases: &'a [crate::evidence::leases::Lease],
    included: &[usize],
) -> Vec<&'a crate::evidence::leases::Lease> {
    leases
        .iter()
        .filter(|l| l.is_active())
        .filter(|l| {
            let p = Protections::from_leases([*l]);
            let index = crate::observe::ProtectionIndex::of(&p);
            included
                .iter()
                .any(|&i| !crate::observe::protection_hits(&plan.rows[i], &index).is_empty())
        })
        .collect()
}

/// The `included` rows as the case's `rows`, every column, secrets replaced.
fn rows_json(plan: &Plan, included: &[usize], redactor: &mut Redactor) -> Vec<Json> {
    included
        .iter()
        .map(|&i| {
            let row = &plan.rows[i];
            let mut obj = Map::new();
            for col in COLUMNS {
                let v = row.get(*col);
                obj.insert(col.name().to_string(), redactor.value(col.name(), v));
            }
            Json::Object(obj)
        })
        .collect()
}

/// The leases as the case's `leases`, secrets replaced.
fn leases_json(relevant: &[&crate::evidence::leases::Lease], redactor: &mut Redactor) -> Vec<Json> {
    relevant
        .iter()
        .map(|l| {
            Json::Object(
                l.fields()
                    .map(|(k, v)| (k.to_string(), redactor.value(k, v.as_val())))
                    .collect(),
            )
        })
        .collect()
}

/// The case's `processes`: the probe's answer for every positive pid of the
/// `included` rows (a pid it was never asked about reads as its default).
fn processes_json(
    plan: &Plan,
    probe: &RecordingProbe<'_>,
    included: &[usize],
) -> BTreeMap<String, Json> {
    let answers = probe.given();
    let mut processes = BTreeMap::new();
    for &i in included {
        if let Val::Int(pid) = plan.rows[i].get(Col::Pid) {
            if pid > 0 {
                let seen = answers.processes.get(&pid).cloned().unwrap_or_default();
                processes.insert(
                    pid.to_string(),
                    json!({"alive": seen.alive, "start_time": seen.start_time}),
                );
            }
        }
    }
    processes
}

/// The case's `context`: this host's facts and the canonical repository,
/// scanned for secrets.
fn context_json(plan: &Plan, redactor: &mut Redactor) -> Json {
    let host = &plan.facts.host;
    let mut context = json!({
        "host_id": host.host_id,
        "boot_id": host.boot_id,
        "canonical_repository": plan.facts.canonical_repository,
    });
    context["pid_namespace"] = json!(host.pid_namespace);
    redactor.object("context", &mut context);
    context
}

/// The case's `name`: what was captured, in one line.
fn headline(selection: &Selection, chosen: &Chosen) -> String {
    let count = chosen.indexes.len();
    match selection {
        Selection::Workers(_) if count == 1 => format!(
            "captured: {} is {}",
            crate::text::esc(&chosen.names[0]),
            if chosen.verdicts[0] == "candidate" {
                "a candidate".to_string()
            } else {
                format!("preserved by {}", chosen.verdicts[0])
            }
        ),
        Selection::Workers(_) => format!("captured: {count} chosen rows"),
        Selection::PreservedBy(code) => {
            format!("captured: {count} row(s) preserved by {code}")
        }
        Selection::Candidates => format!("captured: {count} candidate(s)"),
    }
}

/// The case's `description`: where and when it was captured, the chosen
/// rows (the first ten named), and what was redacted.
fn description(
    plan: &Plan,
    policies: &Policies,
    source: &Path,
    chosen: &Chosen,
    redactor: &Redactor,
) -> String {
    let names = &chosen.names;
    format!(
        "EDIT ME: say what this case shows. Captured by `fleet-retire fixture capture` from {} \
         at {} under policies {}: the chosen rows ({}), every row bearing on their verdict, \
         the active leases protecting any of them, and the probe answers seen then.{}",
        crate::store::location::label(source),
        crate::time::format_ts(plan.facts.now),
        policies.fingerprint,
        if names.len() > 10 {
            format!("{} and {} more", names[..10].join(", "), names.len() - 10)
        } else {
            names.join(", ")
        },
        redacted_note(redactor)
    )
}

/// The description's closing sentence on placeholders; empty when nothing
/// was replaced.
fn redacted_note(redactor: &Redactor) -> String {
    if redactor.counts.is_empty() {
        return String::new();
    }
    format!(
        " Secrets were replaced by placeholders ({}).",
        redactor
            .counts
            .iter()
            .map(|(k, n)| format!("{k}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Plan the case on its own, and refuse it unless every chosen row comes
/// out as it did in the registry.
fn replay(case: &Json, policies: &Policies, chosen: &Chosen, included: &[usize]) -> Result<Plan> {
    let label = Path::new("<captured case>");
    let crate::fixture::Case::Plan(parsed) = crate::fixture::parse(label, case.clone())? else {
        return Err(Error::Internal {
            doing: "capturing: the case written is not read back as a plan case".into(),
            source: "capture wrote a case of another kind".into(),
        });
    };
    let replay = parsed.plan(policies)?;
    for (k, &i) in chosen.indexes.iter().enumerate() {
        let at = included
            .iter()
            .position(|&j| j == i)
            .expect("chosen rows are included");
        let got = verdict_of(&replay.entries[at]);
        if got != chosen.verdicts[k] {
            return Err(Error::Internal {
                doing: format!(
                    "capturing {}: the captured rows judge it {got}, the registry {}; the capture \
                     is refused rather than written wrong (please report this)",
                    crate::text::esc(&chosen.names[k]),
                    chosen.verdicts[k]
                ),
                source: "capture does not reproduce its verdict".into(),
            });
        }
    }
    Ok(replay)
}

/// The case's `expect`: the replayed plan's candidates and preserved rows.
fn expectation(replay: &Plan) -> Json {
    json!({
        "candidates": replay.candidates().map(|e| replay.identity(e)).collect::<Vec<_>>(),
        "preserved": replay
            .preserved()
            .map(|e| (replay.identity(e), e.reason().code().to_string()))
            .collect::<BTreeMap<_, _>>(),
    })
}

/// The chosen rows and every row bearing on their verdicts, in registry
/// order.
fn bearing_rows(plan: &Plan, chosen: &[usize]) -> Vec<usize> {
    let rows = &plan.rows;
    let mut by_key: HashMap<(&'static str, String), Vec<usize>> = HashMap::new();
    let mut by_identity: HashMap<String, Vec<usize>> = HashMap::new();
    let mut by_slot: HashMap<(String, String), Vec<usize>> = HashMap::new();
    let slot = |i: usize| {
        let r = &rows[i];
        let active = r.is_active();
        let instance = r.get(Col::ClientInstanceId).canon();
        let namespace = r.get(Col::Namespace).canon();
        (active && !instance.is_empty() && !namespace.is_empty()).then_some((instance, namespace))
    };
    for (i, row) in rows.iter().enumerate() {
        for (name, text) in conflict_keys(row, plan.observations[i].process_identity) {
            by_key.entry((name, text.into_owned())).or_default().push(i);
        }
        let id = row.get(Col::WorkerIdentity).canon();
        if !id.is_empty() {
            by_identity.entry(id).or_default().push(i);
        }
        if let Some(s) = slot(i) {
            by_slot.entry(s).or_default().push(i);
        }
    }
    let mut out: BTreeSet<usize> = chosen.iter().copied().collect();
    for &i in chosen {
        let row = &rows[i];
        for (name, text) in conflict_keys(row, plan.observations[i].process_identity) {
            out.extend(by_key.get(&(name, text.into_owned())).into_iter().flatten());
        }
        let id = row.get(Col::WorkerIdentity).canon();
        out.extend(by_identity.get(&id).into_iter().flatten());
        if let Some(s) = slot(i) {
            out.extend(by_slot.get(&s).into_iter().flatten());
        }
    }
    out.into_iter().collect()
}

/// Replaces secrets by placeholders, the same value by the same one, and
/// counts what it replaced by column.
#[derive(Default)]
struct Redactor {
    scrubber: Scrubber,
    counts: BTreeMap<String, usize>,
}

/// Columns whose every non-blank value is a secret.
const SECRET_COLUMNS: &[&str] = &["token_fingerprint"];

/// Whether a column's name says its values are secrets.
fn is_secret_column(column: &str) -> bool {
    SECRET_COLUMNS.contains(&column)
        || ["token", "secret", "password", "credential"]
            .iter()
            .any(|w| column.contains(w))
}

impl Redactor {
    /// A column's value as the case holds it: a secret column's value
    /// replaced whole, any other text (a blob's text too) scanned.
    fn value(&mut self, column: &str, v: Val<'_>) -> Json {
        let json = v.to_json();
        let Json::String(text) = &json else {
            return json;
        };
        let clean = if is_secret_column(column) && !v.is_blank() {
            Some(
                self.scrubber
                    .placeholder(text, &format!("redacted-{column}")),
            )
        } else {
            self.scrubber.scrub(text)
        };
        match clean {
            Some(clean) => {
                *self.counts.entry(column.to_string()).or_default() += 1;
                Json::String(clean)
            }
            None => json,
        }
    }

    /// Scan the text members of a JSON object (the case's context: the
    /// repository named on the command line is compared with the rows'
    /// bindings, so it gets the placeholders they got).
    fn object(&mut self, place: &str, object: &mut Json) {
        for (key, member) in object.as_object_mut().into_iter().flatten() {
            if let Json::String(text) = member {
                if let Some(clean) = self.scrubber.scrub(text) {
                    *self.counts.entry(format!("{place}.{key}")).or_default() += 1;
                    *member = Json::String(clean);
                }
            }
        }
    }

    /// A text the case repeats outside the rows (a chosen row's identity in
    /// the name), with the placeholders the rows got.
    fn text(&mut self, text: &str) -> String {
        self.scrubber
            .scrub(text)
            .unwrap_or_else(|| text.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Value;

    #[test]
    fn every_text_column_is_scanned() {
        let mut r = Redactor::default();
        let v = r.value(
            "remote",
            Value::Text("https://bot:s3cret@git.example/prgs/x".into()).as_val(),
        );
        assert_eq!(v, json!("https://redacted-1@git.example/prgs/x"));
        let v = r.value("client_name", Value::Text("Bearer ghp_X".into()).as_val());
        assert_eq!(v, json!("Bearer redacted-2"));
        let v = r.value(
            "retired_by",
            Value::Blob(b"glpat-Y".to_vec().into_boxed_slice()).as_val(),
        );
        assert_eq!(v, json!("b'redacted-3'"));
        assert_eq!(r.value("pid", Value::Int(7).as_val()), json!(7));
        assert_eq!(
            r.value("role", Value::Text("author".into()).as_val()),
            json!("author")
        );
        assert_eq!(r.text("w-ghp_X"), "w-redacted-2");
        assert_eq!(r.counts.values().sum::<usize>(), 3);
    }

    #[test]
    fn the_same_secret_gets_the_same_placeholder() {
        let mut r = Redactor::default();
        let a = r.value("token_fingerprint", Value::Text("tok-1".into()).as_val());
        let b = r.value("token_fingerprint", Value::Text("tok-2".into()).as_val());
        let c = r.value("token_fingerprint", Value::Text("tok-1".into()).as_val());
        assert_eq!(a, c);
        assert_ne!(a, b);
        assert_eq!(
            r.value("token_fingerprint", Value::Text(" ".into()).as_val()),
            json!(" ")
        );
        assert_eq!(r.counts["token_fingerprint"], 3);
    }
}

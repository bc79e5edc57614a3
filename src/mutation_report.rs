//! `policy mutate --format mutation-report`: the run in the mutation-testing
//! report schema (npm `mutation-testing-report-schema`, schema version 2),
//! the format of Stryker, Infection and others, which
//! `mutation-testing-elements` renders as the report reviewers know.
//!
//! Each policy file with its source; each mutant with our operator as
//! `mutatorName`, its replacement, its place in the text (the mutated
//! expression found again by its tokens among its policy's lines, see
//! `mutate::locate`, else the whole policy), and its status: `Killed` (by the property or fixture case named
//! in `killedBy`), `Survived`, `Ignored` for a mutant the solver proved
//! equivalent (`statusReason` says so, and whether only because its forbid
//! is shadowed), `CompileError` for one that does not type-check. The
//! property files and fixture files are the `testFiles`.

use crate::fixture::Case;
use crate::mutate::{Outcome, Report};
use crate::policy::Policies;
use crate::verify::Property;
use serde_json::{json, Map, Value as Json};
use std::path::PathBuf;

/// Where a mutant stands: its file, and the mutated text in it (the
/// whole policy when that text is not found as written).
fn place(o: &Outcome, policies: &Policies) -> (String, Json) {
    let file = policies
        .rules
        .get(&cedar_policy::PolicyId::new(&o.policy))
        .map_or_else(String::new, |r| r.file.clone());
    let at = o.location.map_or(((1, 1), (1, 2)), |s| (s.start, s.end));
    let location = json!({
        "start": {"line": at.0 .0, "column": at.0 .1},
        "end": {"line": at.1 .0, "column": at.1 .1},
    });
    (file, location)
}

/// The schema's status of one of our outcomes, and why when it is not a
/// plain kill or survival.
fn status(o: &Outcome) -> (&'static str, Option<String>) {
    match o.status {
        "killed" => ("Killed", None),
        "survived" => ("Survived", None),
        "equivalent" if o.shadowed => (
            "Ignored",
            Some(
                "proved equivalent by the solver: the mutated forbid is shadowed, so only \
                 reason codes can move"
                    .into(),
            ),
        ),
        "equivalent" => (
            "Ignored",
            Some("proved equivalent by the solver: no decision changes".into()),
        ),
        _ => ("CompileError", o.invalid.clone()),
    }
}

/// One mutant as the schema writes it.
fn mutant(id: usize, o: &Outcome, at: Json) -> Json {
    let (status, reason) = status(o);
    let mut m = json!({
        "id": id.to_string(),
        "mutatorName": o.operator,
        "replacement": o.after,
        "description": format!("{}: {} -> {}", o.operator, o.before, o.after),
        "location": at,
        "status": status,
    });
    if let Some(reason) = reason {
        m["statusReason"] = json!(reason);
    }
    let killers: Vec<&String> = o
        .killed_by_property
        .iter()
        .chain(o.killed_by_fixture.iter())
        .collect();
    if !killers.is_empty() {
        m["killedBy"] = json!(killers);
    }
    m
}

/// The whole report.
pub fn report(
    run: &Report,
    policies: &Policies,
    properties: &[Property],
    cases: &[(PathBuf, Case)],
) -> Json {
    let mut files: Map<String, Json> = policies
        .texts
        .iter()
        .map(|(name, text)| {
            (
                name.clone(),
                json!({"language": "cedar", "source": text, "mutants": []}),
            )
        })
        .collect();
    for (i, o) in run.outcomes.iter().enumerate() {
        let (file, at) = place(o, policies);
        if let Some(mutants) = files
            .get_mut(&file)
            .and_then(|f| f["mutants"].as_array_mut())
        {
            mutants.push(mutant(i + 1, o, at));
        }
    }
    let mut tests: Map<String, Json> = Map::new();
    for p in properties {
        let file = crate::sarif::in_folder(&p.file);
        let entry = tests.entry(file).or_insert_with(|| json!({"tests": []}));
        if let Some(list) = entry["tests"].as_array_mut() {
            list.push(json!({"id": p.id, "name": p.description,
                "location": {"start": {"line": p.line.max(1), "column": 1}}}));
        }
    }
    for (path, case) in cases {
        let name = case.name();
        tests.insert(
            path.display().to_string(),
            json!({"tests": [{"id": name, "name": name}]}),
        );
    }
    json!({
        "schemaVersion": "2",
        "thresholds": {"high": 100, "low": 100},
        "framework": {"name": "fleet-retire policy mutate", "version": env!("CARGO_PKG_VERSION")},
        "files": files,
        "testFiles": tests,
    })
}

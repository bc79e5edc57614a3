//! What fails, each once: a property (or a policy that can error), with
//! the policies that break it and its counterexample; and a fixture file,
//! with what differs from its expectations.

use super::view::{Failing, FixtureFail};
use super::{cex, lines, visible, Evidence};

/// Where a policy stands on the page: its first line, or, for one the
/// change removed, its first removed line.
pub fn place_of(e: &Evidence, id: &str) -> String {
    let pid = cedar_policy::PolicyId::new(id);
    if let Some(r) = e.policies.rules.get(&pid) {
        return lines::anchor(e, &r.file, r.line);
    }
    match e.compared().and_then(|(_, c)| c.old.rules.get(&pid)) {
        Some(r) => lines::removed_anchor(e, &r.file, r.line),
        None => "policies".into(),
    }
}

/// Each failing property once, in the order `policy verify` lists them.
pub fn failing(e: &Evidence) -> Vec<Failing> {
    let mut out: Vec<Failing> = Vec::new();
    for p in e.verification.proofs.iter().filter(|p| !p.holds) {
        if let Some(known) = out.iter_mut().find(|f| f.id == visible(&p.id)) {
            known.envs.push(visible(&p.request_env));
            continue;
        }
        let blame = e.blame.get(&p.id);
        let blamed: Vec<(String, String)> = blame
            .map(|b| b.policies.as_slice())
            .unwrap_or_default()
            .iter()
            .map(|id| (visible(id), place_of(e, id)))
            .collect();
        let said = match blame {
            Some(b) if !b.policies.is_empty() => {
                let ids: Vec<&str> = b.policies.iter().map(String::as_str).collect();
                format!("broken by {}: {}", ids.join(", "), b.how)
            }
            Some(b) => format!("not attributed to a policy: {}", b.how),
            None => "not attributed to a policy".into(),
        };
        let save = format!(
            "fleet-retire {}policy verify --save-counterexamples counterexamples  # writes \
             counterexamples/{}",
            e.policies_flag(),
            crate::outfile::safe_name(&format!("{}-0.json", p.id))
        );
        out.push(Failing {
            anchor: format!("failing-{}", out.len()),
            id: visible(&p.id),
            description: visible(&p.description),
            place: visible(&format!("{}:{}", p.file, p.line)),
            at: lines::anchor(e, &p.file, p.line),
            envs: vec![visible(&p.request_env)],
            blame: visible(&said),
            blamed,
            cex: p.witness.as_ref().map(|w| {
                let title = format!("counterexample of {}", p.id);
                cex::view(&title, &w.sentence, &w.deciding, &w.case, &save)
            }),
        });
    }
    out
}

/// Each fixture file that fails under the set, or cannot be run.
pub fn fixtures(e: &Evidence) -> Vec<FixtureFail> {
    e.fixtures
        .iter()
        .filter(|f| !f.problems.is_empty())
        .enumerate()
        .map(|(n, f)| FixtureFail {
            anchor: format!("fixture-{n}"),
            file: visible(&f.file),
            case: visible(
                f.case
                    .as_deref()
                    .unwrap_or("(not a case this runner reads)"),
            ),
            problems: f.problems.iter().map(|p| visible(p)).collect(),
        })
        .collect()
}

//! The verdict the page opens with, **Ready to sign** or **Not ready to
//! sign**, and every reason, each linked to its place on the page: a base
//! that cannot be compared, a loosening against it (per action), a
//! property that fails, a fixture that fails, a surviving mutant, a grant
//! the edit widened, each warning about profiles.json, and, when
//! `--min-coverage` asks for it, each forbid no fixture shows deciding.
//! `policy report` prints the same and exits 2 when not ready.

use super::view::{Change, Failing, FixtureFail, Grants, PolicyRow, Reason};
use super::{lines, visible, Evidence, Judged};

/// The page's verdict.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// No reason stands in the way.
    pub ready: bool,
    /// The reasons, in the page's order.
    pub reasons: Vec<Reason>,
}

impl Verdict {
    /// `Ready to sign`, or `Not ready to sign` with how many reasons.
    pub fn headline(&self) -> String {
        match self.reasons.len() {
            0 => "Ready to sign".into(),
            1 => "Not ready to sign: 1 reason".into(),
            n => format!("Not ready to sign: {n} reasons"),
        }
    }
}

/// What the page found, as its sections show it (the reasons link there).
pub struct Found<'a> {
    /// The change against the base.
    pub change: Option<&'a Change>,
    /// The failing properties.
    pub failing: &'a [Failing],
    /// The failing fixtures.
    pub fixtures: &'a [FixtureFail],
    /// The grants matrix.
    pub grants: Option<&'a Grants>,
    /// The policy table.
    pub policies: &'a [PolicyRow],
}

/// At most this many surviving mutants are listed one by one.
const SURVIVORS_SHOWN: usize = 50;

fn reason(kind: &'static str, text: String, anchor: String) -> Reason {
    Reason {
        kind,
        text: visible(&text),
        anchor,
    }
}

/// Every reason not to sign, in the page's order.
pub fn reasons(e: &Evidence, mutants: &[Judged], found: &Found) -> Vec<Reason> {
    let mut out = Vec::new();
    if let Some(c) = found.change {
        if !c.problem.is_empty() {
            let text = format!("the base {} cannot be compared: {}", c.name, c.problem);
            out.push(reason("base", text, "change".into()));
        }
        for a in c.actions.iter().filter(|a| a.loosens) {
            let example = a
                .counterexamples
                .iter()
                .find(|x| x.title.ends_with("loosening"))
                .map(|x| format!(": {}", x.sentence))
                .unwrap_or_default();
            let text = format!("{} is {} against {}{example}", a.action, a.change, c.name);
            out.push(reason("loosened", text, a.anchor.clone()));
        }
    }
    for f in found.failing {
        let text = format!("property {} fails ({}); {}", f.id, f.place, f.blame);
        out.push(reason("proof", text, f.anchor.clone()));
    }
    for f in found.fixtures {
        let first = f.problems.first().cloned().unwrap_or_default();
        let text = format!("fixture {} fails: {first}", f.file);
        out.push(reason("fixture", text, f.anchor.clone()));
    }
    out.extend(survivors(e, mutants));
    if let Some(g) = found.grants {
        out.extend(grants(g));
    }
    out.extend(uncovered(e, found.policies));
    out
}

/// Each surviving mutant, at its line (the first fifty, then how many
/// more).
fn survivors(e: &Evidence, mutants: &[Judged]) -> Vec<Reason> {
    let mut out: Vec<(String, usize, Reason)> = Vec::new();
    for m in mutants.iter().filter(|m| m.status == "survived") {
        let rule = e
            .policies
            .rules
            .get(&cedar_policy::PolicyId::new(&m.policy));
        let (Some(r), Some(at)) = (rule, m.location) else {
            continue;
        };
        let text = format!(
            "{}:{}: a mutant of {} survives ({}: {} → {})",
            r.file, at.start.0, m.policy, m.operator, m.before, m.after
        );
        let anchor = lines::anchor(e, &r.file, at.start.0);
        out.push((r.file.clone(), at.start.0, reason("survivor", text, anchor)));
    }
    out.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    let more = out.len().saturating_sub(SURVIVORS_SHOWN);
    let mut shown: Vec<Reason> = out
        .into_iter()
        .take(SURVIVORS_SHOWN)
        .map(|(_, _, r)| r)
        .collect();
    if more > 0 {
        let text = format!("… and {more} more surviving mutants, each marked at its line");
        shown.push(reason("survivor", text, "policies".into()));
    }
    shown
}

/// Each grant the edit widened, and each warning about profiles.json.
fn grants(g: &Grants) -> Vec<Reason> {
    let mut out = Vec::new();
    for row in &g.rows {
        for cell in row.cells.iter().filter(|c| c.change == "granted") {
            let text = format!(
                "{} may now {} (widened against {})",
                row.profile,
                cell.operation,
                g.against.as_deref().unwrap_or("")
            );
            out.push(reason("grant", text, cell.anchor.clone()));
        }
    }
    for (warning, anchor) in &g.warnings {
        let text = format!("{}: {warning}", g.file);
        out.push(reason("warning", text, anchor.clone()));
    }
    out
}

/// With `--min-coverage N` and fewer than N percent of the forbids
/// covered: each forbid no fixture case shows deciding and no proof shows
/// never can.
fn uncovered(e: &Evidence, rows: &[PolicyRow]) -> Vec<Reason> {
    let (Some(min), Some(c)) = (e.min_coverage, e.coverage) else {
        return Vec::new();
    };
    if c.forbids_deciding_percent >= f64::from(min) {
        return Vec::new();
    }
    c.policies
        .iter()
        .filter(|p| p.effect == "forbid" && p.decided.is_empty() && p.never_primary != Some(true))
        .map(|p| {
            let anchor = rows
                .iter()
                .find(|r| r.id == visible(&p.id))
                .map_or_else(|| "policies".into(), |r| r.row.clone());
            let text = format!(
                "{}: no fixture case shows it deciding (forbids covered: {:.1} %, below \
                 --min-coverage {min})",
                p.id, c.forbids_deciding_percent
            );
            reason("coverage", text, anchor)
        })
        .collect()
}

//! The change against `--base`: the proved difference per action, each
//! with its counterexamples (plain, ready to save as fixtures), the
//! policies and files that differ (each linked to its diff in the source
//! view), and the fixture verdicts that move.

use super::view::{ActionChange, Change, ChangedPolicy, MovedVerdict};
use super::{cex, failing, lines, visible, Compared, Evidence};
use crate::outfile::safe_name;

/// The change section, with `--base`.
pub fn change(e: &Evidence) -> Option<Change> {
    let base = e.base.as_ref()?;
    let name = visible(&base.name);
    let compared = match &base.compared {
        Ok(c) => c,
        Err(why) => {
            return Some(Change {
                name,
                problem: visible(why),
                overall: String::new(),
                loosened: false,
                schema_changed: false,
                actions: Vec::new(),
                policies: Vec::new(),
                files: Vec::new(),
                moved: None,
            })
        }
    };
    let d = &compared.diff;
    Some(Change {
        name,
        problem: String::new(),
        overall: d.overall().word().to_string(),
        loosened: d.overall().loosens(),
        schema_changed: d.schema_changed,
        actions: actions(e, &base.name, compared),
        policies: d
            .policies
            .iter()
            .filter(|p| p.status != "unchanged")
            .map(|p| ChangedPolicy {
                id: visible(&p.id),
                status: p.status.to_string(),
                anchor: failing::place_of(e, &p.id),
                flag: description_flag(e, &p.id)
                    .map(|f| visible(&f))
                    .unwrap_or_default(),
            })
            .collect(),
        files: lines::changed_files(e),
        moved: compared.moved.as_ref().map(|moved| {
            moved
                .iter()
                .map(|o| MovedVerdict {
                    case: visible(&format!("{} ({})", o.case, o.file.display())),
                    subject: visible(&o.subject),
                    old: visible(&o.old),
                    new: visible(&o.new),
                    loosens: o.loosens,
                })
                .collect()
        }),
    })
}

/// Each action with its counterexamples, and the command that saves
/// them (`policy diff --save-counterexamples` names each file so).
fn actions(e: &Evidence, base: &str, compared: &Compared) -> Vec<ActionChange> {
    compared
        .diff
        .actions
        .iter()
        .map(|a| ActionChange {
            anchor: format!("change-{}", safe_name(&a.action)),
            action: visible(&a.action),
            change: a.change.word().to_string(),
            loosens: a.change.loosens(),
            counterexamples: a
                .counterexamples
                .iter()
                .enumerate()
                .map(|(n, c)| {
                    let file = safe_name(&format!("{}-{}-{n}.json", a.action, c.direction));
                    let save = format!(
                        "fleet-retire policy diff {base} {} --save-counterexamples \
                         counterexamples  # writes counterexamples/{file}",
                        e.reviewed()
                    );
                    let title = format!("{}: {}", a.action, c.direction);
                    cex::view(&title, &c.sentence, &c.deciding, &c.case, &save)
                })
                .collect(),
        })
        .collect()
}

/// For a policy whose code changed and whose `@description` did not, a
/// word to the reviewer.
pub fn description_flag(e: &Evidence, id: &str) -> Option<String> {
    let (base, compared) = e.compared()?;
    let pid = cedar_policy::PolicyId::new(id);
    let changed = compared
        .diff
        .policies
        .iter()
        .any(|p| p.id == id && p.status == "changed");
    let (now, before) = (e.policies.rules.get(&pid)?, compared.old.rules.get(&pid)?);
    (changed && now.description == before.description).then(|| {
        format!(
            "Its code changed and its @description did not (as in {base}: \"{}\"): does it \
             still say what the policy does?",
            now.description
        )
    })
}

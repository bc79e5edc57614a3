//! A counterexample on the page: its sentence, its deciding attributes,
//! and its fixture case pretty-printed in a `<pre>` that copies into a
//! valid fixture file (the deciding attributes' lines marked), with the
//! command that saves it.

use super::view::{Cex, CexLine};
use super::visible;
use crate::counterexample::base::short;
use serde_json::Value as Json;

/// The counterexample `case` as the page shows it.
pub fn view(title: &str, sentence: &str, deciding: &[String], case: &Json, save: &str) -> Cex {
    let text = serde_json::to_string_pretty(case).expect("a case serialises");
    Cex {
        title: visible(title),
        sentence: visible(sentence),
        deciding: visible(&crate::counterexample::deciding_text(deciding)),
        lines: marked(&text, deciding),
        save: visible(save),
    }
}

/// The case's lines, each deciding attribute's marked: an attribute line
/// (`"ttl_us": 0,`) within the entity of its type, through the end of its
/// value when the value spans lines (a set).
fn marked(text: &str, deciding: &[String]) -> Vec<CexLine> {
    let mut kind = String::new();
    let mut open: Option<usize> = None;
    let mut out = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if let Some(t) = trimmed.strip_prefix("\"type\": \"") {
            kind = short(t.trim_end_matches([',', '"'])).to_string();
        }
        let marked = if let Some(start) = open {
            if indent <= start {
                open = None;
            }
            true
        } else {
            let attr = trimmed
                .strip_prefix('"')
                .and_then(|rest| rest.split_once("\": "));
            match attr {
                Some((name, value)) if deciding.contains(&format!("{kind}.{name}")) => {
                    if value == "[" || value == "{" {
                        open = Some(indent);
                    }
                    true
                }
                _ => false,
            }
        };
        out.push(CexLine {
            text: visible(line),
            marked,
        });
    }
    out
}

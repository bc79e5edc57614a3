//! Cedar JSON expressions written back as Cedar text, for reports: the
//! place a mutant changed, before and after.

use serde_json::Value as Json;

/// At most this many characters of an expression are shown.
const SHOWN: usize = 160;

/// `s` cut to [`SHOWN`] characters (an ellipsis marks the cut).
pub fn cut(s: &str) -> String {
    if s.chars().count() <= SHOWN {
        return s.to_string();
    }
    let mut out: String = s.chars().take(SHOWN - 1).collect();
    out.push('…');
    out
}

/// One expression (Cedar JSON) as Cedar text; operands that are operators
/// themselves are parenthesised.
pub fn render(e: &Json) -> String {
    let Some((op, inner)) = e.as_object().and_then(|o| o.iter().next()) else {
        return e.to_string();
    };
    match op.as_str() {
        "Value" => value(inner),
        "Var" => inner.as_str().unwrap_or("?").to_string(),
        "." => format!(
            "{}.{}",
            operand(&inner["left"]),
            inner["attr"].as_str().unwrap_or("?")
        ),
        "!" => format!("!{}", operand(&inner["arg"])),
        "neg" => format!("-{}", operand(&inner["arg"])),
        "isEmpty" => format!("{}.isEmpty()", operand(&inner["arg"])),
        "contains" | "containsAll" | "containsAny" => {
            format!(
                "{}.{op}({})",
                operand(&inner["left"]),
                render(&inner["right"])
            )
        }
        "has" => format!(
            "{} has {}",
            operand(&inner["left"]),
            inner["attr"].as_str().unwrap_or("?")
        ),
        "like" => format!(
            "{} like {}",
            operand(&inner["left"]),
            pattern(&inner["pattern"])
        ),
        "if-then-else" => format!(
            "if {} then {} else {}",
            render(&inner["if"]),
            render(&inner["then"]),
            render(&inner["else"])
        ),
        "Set" => {
            let items: Vec<String> = inner.as_array().into_iter().flatten().map(render).collect();
            format!("[{}]", items.join(", "))
        }
        _ if inner.get("left").is_some() && inner.get("right").is_some() => {
            format!(
                "{} {op} {}",
                operand(&inner["left"]),
                operand(&inner["right"])
            )
        }
        _ => e.to_string(),
    }
}

/// An operand: in parentheses when it is itself a binary operator.
fn operand(e: &Json) -> String {
    let binary = e
        .as_object()
        .and_then(|o| o.values().next())
        .is_some_and(|inner| inner.get("left").is_some() && inner.get("right").is_some());
    let dotted = ["contains", "containsAll", "containsAny"]
        .iter()
        .any(|k| e.get(*k).is_some());
    if binary && !dotted {
        format!("({})", render(e))
    } else {
        render(e)
    }
}

fn value(v: &Json) -> String {
    match v {
        Json::Object(o) if o.contains_key("__entity") => format!(
            "{}::{}",
            o["__entity"]["type"].as_str().unwrap_or("?"),
            Json::from(o["__entity"]["id"].as_str().unwrap_or("?"))
        ),
        other => other.to_string(),
    }
}

fn pattern(p: &Json) -> String {
    let mut out = String::from("\"");
    for part in p.as_array().into_iter().flatten() {
        match part {
            Json::String(w) if w == "Wildcard" => out.push('*'),
            other => {
                let c = other["Literal"].as_str().unwrap_or("");
                out.push_str(
                    &c.replace('\\', "\\\\")
                        .replace('*', "\\*")
                        .replace('"', "\\\""),
                );
            }
        }
    }
    out.push('"');
    out
}

//! A result's structured content as text, for the clients that hand a
//! model the text of a result and nothing else (issue 52).
//!
//! MCP says a tool that returns structured content SHOULD also return it
//! serialised as JSON in a text block. Every tool result of this server
//! therefore carries two text blocks: the one-paragraph summary, then the
//! structured content's JSON. The whole result stays under
//! [`RESULT_BOUND`]: when the JSON twice over would not fit (a page of a
//! thousand rows with their evidence), the second block holds the essential
//! fields instead, marked `"abridged"`: every top-level value that is not a
//! list or a large object (tokens, counts, `next_cursor`, `next_offset`,
//! `reason_code`, `what_to_do`, …), and of every list each item's own
//! fields without what is nested in them (a row's identity and its reason
//! codes, without its evidence).

use super::pages::{json_size, RESULT_BOUND};
use serde_json::{json, Map, Value as Json};

/// Room left in a result for the rest of its reply: the JSON-RPC envelope,
/// a resource link, the block's own quoting.
const ENVELOPE: usize = 8 * 1024;

/// An object at the top level larger than this is left out of an abridged
/// block (`preserved_cursors` of a dozen reason codes is about 4 KB).
const LARGE_OBJECT: usize = 16 * 1024;

/// What an abridged block says of itself.
const ABRIDGED: &str = "the essential fields of this result (each row's identity and reasons, \
                        without its evidence); the whole result is its structured content";

/// The second text block of a result whose structured content is `body`
/// and whose first block is `summary`: `body`'s JSON, or its essential
/// fields when the result would otherwise be over [`RESULT_BOUND`].
pub(super) fn json_block(summary: &str, body: &Json) -> String {
    let whole = body.to_string();
    let used = whole.len().saturating_add(quoted_size(summary));
    let room = RESULT_BOUND.saturating_sub(used.saturating_add(ENVELOPE));
    if quoted_size(&whole) <= room {
        return whole;
    }
    let mut short = essential(body);
    fit(&mut short, room);
    short.to_string()
}

/// The bytes `text` takes as a JSON string, quotes and escapes included
/// (serde_json's escapes: two bytes for a quote, a backslash and the
/// usual control characters, six for the others), counted without
/// writing it: a page's text is most of a mebibyte.
fn quoted_size(text: &str) -> usize {
    let escapes: usize = text
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 1,
            0..=0x1f => 5,
            _ => 0,
        })
        .sum();
    text.len() + 2 + escapes
}

/// The essential fields of a result ([module docs](self)).
fn essential(body: &Json) -> Json {
    let Json::Object(map) = body else {
        return json!({"abridged": ABRIDGED});
    };
    let mut out = Map::new();
    out.insert("abridged".into(), json!(ABRIDGED));
    let mut left_out = Vec::new();
    for (key, value) in map {
        match value {
            Json::Array(items) => {
                out.insert(key.clone(), items.iter().map(own_fields).collect());
            }
            Json::Object(_) if json_size(value) > LARGE_OBJECT => left_out.push(key.clone()),
            other => {
                out.insert(key.clone(), other.clone());
            }
        }
    }
    if !left_out.is_empty() {
        out.insert("left_out".into(), json!(left_out));
    }
    Json::Object(out)
}

/// An item of a list without what is nested in it: an object keeps its
/// scalars and its lists of scalars (`reason_codes`); anything else is
/// kept as it is.
fn own_fields(item: &Json) -> Json {
    let Json::Object(map) = item else {
        return item.clone();
    };
    let scalar = |v: &Json| !matches!(v, Json::Array(_) | Json::Object(_));
    map.iter()
        .filter(|(_, v)| match v {
            Json::Array(list) => list.iter().all(scalar),
            other => scalar(other),
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect::<Map<String, Json>>()
        .into()
}

/// Cut the lists of an abridged block until its text fits in `room` bytes,
/// counting what each lost under `<name>_not_in_text`; as a last resort
/// (a result whose scalars alone are too large) only the note is left.
fn fit(short: &mut Json, room: usize) {
    if quoted_size(&short.to_string()) <= room {
        return;
    }
    let Json::Object(map) = short else {
        return;
    };
    let lists: Vec<String> = map
        .iter()
        .filter(|(_, v)| v.is_array())
        .map(|(k, _)| k.clone())
        .collect();
    let rest: Map<String, Json> = map
        .iter()
        .filter(|(_, v)| !v.is_array())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let fixed = quoted_size(&Json::Object(rest).to_string());
    let share = room.saturating_sub(fixed) / lists.len().max(1);
    for key in lists {
        if let Some(Json::Array(items)) = map.get_mut(&key) {
            // Each list's name, its brackets and its count of what was cut.
            let dropped = keep_quoted_within(items, share.saturating_sub(2 * key.len() + 64));
            if dropped > 0 {
                map.insert(format!("{key}_not_in_text"), json!(dropped));
            }
        }
    }
    if quoted_size(&short.to_string()) > room {
        *short =
            json!({"abridged": ABRIDGED, "left_out": "everything: see the structured content"});
    }
}

/// Keep the first items of `list` whose JSON, quoted in a text block, fits
/// in `budget` bytes; returns how many were dropped.
fn keep_quoted_within(list: &mut Vec<Json>, budget: usize) -> usize {
    let mut used = 0usize;
    let keep = list
        .iter()
        .take_while(|item| {
            // The item and the comma after it.
            used = used.saturating_add(quoted_size(&item.to_string()) - 2 + 1);
            used <= budget
        })
        .count();
    let dropped = list.len() - keep;
    list.truncate(keep);
    dropped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quoted_size_is_serde_jsons() {
        for text in [
            "",
            "plain",
            "a \"quote\" and \\ back",
            "\n\r\t\u{8}\u{c}\u{1}\u{1f} é ☃ \u{7f}",
        ] {
            assert_eq!(
                quoted_size(text),
                json_size(&Json::String(text.into())),
                "{text:?}"
            );
        }
    }

    #[test]
    fn a_small_result_is_its_json_whole() {
        let body = json!({"registry_fingerprint": "registryfp-1", "preserved": [{"worker_identity": "w-1", "evidence": {"pid": 1}}]});
        let text = json_block("summary", &body);
        assert_eq!(serde_json::from_str::<Json>(&text).unwrap(), body);
    }

    #[test]
    fn a_large_page_keeps_tokens_cursor_ids_and_reasons() {
        let row = |i: usize| {
            json!({"worker_identity": format!("w-{i}"), "reason_code": "heartbeat_not_expired",
                   "reason_codes": ["heartbeat_not_expired"], "evidence": {"blob": "x".repeat(1500)}})
        };
        let rows: Vec<Json> = (0..500).map(row).collect();
        let body = json!({"registry_fingerprint": "registryfp-1", "next_cursor": "c1.ab",
                          "preserved_not_shown": 7, "preserved": rows});
        let text = json_block("summary", &body);
        let total = json_size(&body) + quoted_size(&text) + quoted_size("summary");
        assert!(total < RESULT_BOUND, "{total}");
        let short: Json = serde_json::from_str(&text).unwrap();
        assert_eq!(short["next_cursor"], "c1.ab");
        assert_eq!(short["registry_fingerprint"], "registryfp-1");
        assert_eq!(short["preserved"].as_array().unwrap().len(), 500);
        assert_eq!(
            short["preserved"][499],
            json!({"worker_identity": "w-499", "reason_code": "heartbeat_not_expired",
                   "reason_codes": ["heartbeat_not_expired"]})
        );
        assert!(short["abridged"].is_string());
    }

    #[test]
    fn lists_too_long_even_abridged_are_cut_and_counted() {
        let rows: Vec<Json> = (0..6_000)
            .map(|i| json!({"worker_identity": format!("w-{i}-{}", "y".repeat(40)), "reason_code": "r"}))
            .collect();
        let body = json!({"preserved": rows, "pad": "z".repeat(100_000)});
        let text = json_block("summary", &body);
        let total = json_size(&body) + quoted_size(&text);
        assert!(total < RESULT_BOUND, "{total}");
        let short: Json = serde_json::from_str(&text).unwrap();
        let shown = short["preserved"].as_array().unwrap().len();
        assert!(shown > 1000 && shown < 6_000, "{shown}");
        assert_eq!(short["preserved_not_in_text"], 6_000 - shown);
        assert_eq!(short["pad"].as_str().map(str::len), Some(100_000));
    }
}

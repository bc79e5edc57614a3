//! Text at the edges: what a person reads in a terminal, and operator text
//! that must name something. Pure functions, no I/O; every layer may use
//! them.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Text from a registry, a file or a request, made safe for a terminal:
/// control characters (C0, DEL, C1) and the bidirectional overrides that
/// reorder what a person sees are written as `\u{..}` escapes, and a
/// backslash as `\\`, so a worker id cannot fake a line or a column.
pub fn esc(s: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| {
        c.is_control()
            || c == '\\'
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c == '\\' {
            out.push_str("\\\\");
        } else if unsafe_char(c) {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A canonical repository must name something: an empty or blank one would
/// switch the repository check off.
pub fn nonblank_repository(text: &str) -> std::result::Result<String, String> {
    if crate::value::Value::Text(text.into()).is_blank() {
        return Err(
            "the canonical repository is empty or blank; name it as OWNER/REPO \
             (an empty one would switch the repository check off)"
                .into(),
        );
    }
    Ok(text.to_string())
}

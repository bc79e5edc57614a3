//! Text at the edges: what a person reads in a terminal, and operator text
//! that must name something. Pure functions, no I/O; every layer may use
//! them.

use std::borrow::Cow;
use std::fmt::Write as _;

/// `a == b`, for the short texts of hot loops (a row's strings, a
/// column's recent values): lengths first, then up to 32 bytes as
/// (overlapping) words, without a call to `memcmp`, which costs more than
/// the comparison at these lengths.
#[inline]
pub fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let word = |s: &[u8], at: usize| u64::from_le_bytes(s[at..at + 8].try_into().expect("8 bytes"));
    let half = |s: &[u8], at: usize| u32::from_le_bytes(s[at..at + 4].try_into().expect("4 bytes"));
    let words = |at: &[usize]| at.iter().all(|&i| word(a, i) == word(b, i));
    match n {
        0 => true,
        1..=3 => a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1],
        4..=7 => half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4),
        8..=16 => words(&[0, n - 8]),
        17..=32 => words(&[0, 8, n - 16, n - 8]),
        _ => a == b,
    }
}

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

/// A count as a person reads it, its thousands grouped: `15,423`.
pub fn count(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

/// A JSON document for a terminal, pretty-printed, that still parses:
/// serde_json already writes control characters as `\u` escapes, and the
/// characters that reorder or hide text (bidirectional marks, overrides
/// and isolates, zero-width marks), which it writes as they are, are
/// written as JSON `\u` escapes too (they can only stand inside a string).
/// Copied from the terminal, it is the same document.
pub fn json_for_terminal(value: &serde_json::Value) -> String {
    let text = serde_json::to_string_pretty(value).expect("a JSON value serialises");
    let hidden = |c: char| {
        matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{2069}' | '\u{feff}')
    };
    if !text.chars().any(hidden) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if hidden(c) {
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push(c);
        }
    }
    out
}

/// `s` as one word for a POSIX shell, so a printed command can be pasted
/// and run: as it is when made only of characters no shell treats
/// specially, otherwise in single quotes (a `'` inside written `'"'"'`,
/// without a backslash, which [`esc`] would double when printing it).
pub fn shell_word(s: &str) -> Cow<'_, str> {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=:@%+,".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        Cow::Borrowed(s)
    } else {
        Cow::Owned(format!("'{}'", s.replace('\'', r#"'"'"'"#)))
    }
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

/// How a repository a caller restates compares with the one already fixed
/// (by a saved plan, or by `serve`'s launch). The command line and `serve`
/// read the same comparison and differ only in what they let a caller do
/// when nothing is fixed: an operator may name it, an agent may not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restated {
    /// A repository is fixed, and the caller named it again or left it out.
    Fixed(String),
    /// Nothing is fixed; the caller named this one.
    GivenOnly(String),
    /// Neither is there.
    Neither,
    /// The caller named another than the fixed one.
    Conflict {
        /// The one fixed.
        fixed: String,
        /// The one named.
        given: String,
    },
}

/// Compare a restated repository with the fixed one (exact text: a
/// repository is compared as the policies compare it).
pub fn restated(fixed: Option<&str>, given: Option<&str>) -> Restated {
    match (fixed, given) {
        (Some(f), Some(g)) if f != g => Restated::Conflict {
            fixed: f.to_string(),
            given: g.to_string(),
        },
        (Some(f), _) => Restated::Fixed(f.to_string()),
        (None, Some(g)) => Restated::GivenOnly(g.to_string()),
        (None, None) => Restated::Neither,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `same_bytes` is `==`: for every length up to 70, equal texts, texts
    /// that differ in any one byte, and texts of other lengths that share
    /// a prefix.
    #[test]
    fn same_bytes_is_equality() {
        for n in 0..70usize {
            let a: Vec<u8> = (0..n).map(|i| (i * 37 + n) as u8).collect();
            assert!(same_bytes(&a, &a.clone()), "length {n}");
            for at in 0..n {
                for flip in [1u8, 0x80] {
                    let mut b = a.clone();
                    b[at] ^= flip;
                    assert!(!same_bytes(&a, &b), "length {n}, byte {at} ^ {flip}");
                }
            }
            for m in 0..70usize {
                if m != n {
                    let other: Vec<u8> = a
                        .iter()
                        .copied()
                        .chain(std::iter::repeat(7))
                        .take(m)
                        .collect();
                    assert!(!same_bytes(&a, &other), "lengths {n} and {m}");
                    assert!(!same_bytes(&other, &a), "lengths {m} and {n}");
                }
            }
        }
    }

    #[test]
    fn a_restated_repository_is_compared_by_exact_text() {
        assert_eq!(restated(Some("o/r"), None), Restated::Fixed("o/r".into()));
        assert_eq!(
            restated(Some("o/r"), Some("o/r")),
            Restated::Fixed("o/r".into())
        );
        assert_eq!(
            restated(None, Some("o/r")),
            Restated::GivenOnly("o/r".into())
        );
        assert_eq!(restated(None, None), Restated::Neither);
        assert_eq!(
            restated(Some("o/r"), Some("O/r")),
            Restated::Conflict {
                fixed: "o/r".into(),
                given: "O/r".into()
            }
        );
    }

    #[test]
    fn shell_words_survive_a_shell() {
        assert_eq!(
            shell_word("fixtures/plan/pid-reuse.json"),
            "fixtures/plan/pid-reuse.json"
        );
        assert_eq!(shell_word("w 1"), "'w 1'");
        assert_eq!(shell_word(""), "''");
        for tricky in ["it's", "$(touch x)", "a\\b", "`x`;y", "'", "~"] {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("printf %s {}", shell_word(tricky)))
                .output()
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout), tricky);
        }
    }

    #[test]
    fn counts_are_grouped_and_shell_words_quoted() {
        let shown: Vec<String> = [0, 7, 999, 1000, 15_423, 1_234_567].map(count).into();
        assert_eq!(shown, ["0", "7", "999", "1,000", "15,423", "1,234,567"]);
        assert_eq!(shell_word("plan.json"), "plan.json");
        assert_eq!(shell_word("my plan.json"), "'my plan.json'");
        assert_eq!(shell_word("it's"), r#"'it'"'"'s'"#);
        assert_eq!(shell_word(""), "''");
    }
}

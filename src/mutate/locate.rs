//! Where a mutant stands in its policy file. Mutants are made on Cedar's
//! JSON form, which keeps no source positions; the mutated place is found
//! again in the text by its tokens. A rendered expression and the text it
//! came from hold the same tokens in the same order, except for
//! parentheses (the renderer adds them around every operand that is an
//! operator, the author may have written more or fewer), whitespace and
//! comments: all three are skipped on both sides. The search stays inside
//! the policy's own lines, so the same expression in another policy is
//! never taken for it.

use serde::{Deserialize, Serialize};

/// A place in a text: start inclusive, end exclusive, lines and columns
/// from 1, columns counted in characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    /// First line and column.
    pub start: (usize, usize),
    /// Line and column just after the last character.
    pub end: (usize, usize),
}

/// One token: its text and its byte range in the source.
struct Token<'a> {
    text: &'a str,
    start: usize,
    end: usize,
}

/// The tokens of `text` that carry meaning: no whitespace, comments or
/// parentheses. A string literal is one token, escapes and all.
fn tokens(text: &str) -> Vec<Token<'_>> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let start = i;
        if b.is_ascii_whitespace() || b == b'(' || b == b')' {
            i += 1;
            continue;
        }
        if text[i..].starts_with("//") {
            i = text[i..].find('\n').map_or(bytes.len(), |n| i + n);
            continue;
        }
        if b == b'"' {
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i = (i + 1).min(bytes.len());
        } else if b.is_ascii_alphanumeric() || b == b'_' {
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
        } else if ["::", "==", "!=", "<=", ">=", "&&", "||"]
            .iter()
            .any(|op| text[i..].starts_with(op))
        {
            i += 2;
        } else {
            i += text[i..].chars().next().map_or(1, char::len_utf8);
        }
        out.push(Token {
            text: &text[start..i],
            start,
            end: i,
        });
    }
    out
}

/// 1-based line and column of byte `offset` of `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

/// The byte range of lines `first..=last` (1-based) of `text`.
fn lines_range(text: &str, first: usize, last: usize) -> (usize, usize) {
    let mut start = text.len();
    let mut end = text.len();
    let mut offset = 0;
    for (n, line) in text.split_inclusive('\n').enumerate() {
        if n + 1 == first {
            start = offset;
        }
        offset += line.len();
        if n + 1 == last {
            end = offset;
            break;
        }
    }
    (start.min(end), end)
}

/// The first line of a policy spanning `first..=last` past its
/// annotations (and any comment or blank line among them): where its
/// effect, scope and conditions are, so an annotation's text is never
/// taken for the expression it repeats.
pub fn after_annotations(text: &str, first: usize, last: usize) -> usize {
    text.lines()
        .enumerate()
        .skip(first.saturating_sub(1))
        .take(last.saturating_sub(first) + 1)
        .find(|(_, l)| {
            let t = l.trim_start();
            !(t.is_empty() || t.starts_with('@') || t.starts_with("//"))
        })
        .map_or(first, |(i, _)| i + 1)
}

/// Where `place` (Cedar text, as the mutant renders it) stands for the
/// `occurrence`-th time (from 0) in lines `first..=last` of `text`, if it
/// does.
pub fn locate(
    text: &str,
    first: usize,
    last: usize,
    place: &str,
    occurrence: usize,
) -> Option<Span> {
    let wanted: Vec<&str> = tokens(place).iter().map(|t| t.text).collect();
    if wanted.is_empty() {
        return None;
    }
    let (from, to) = lines_range(text, first, last);
    let have = tokens(&text[from..to]);
    let at = have
        .windows(wanted.len())
        .filter(|w| w.iter().map(|t| t.text).eq(wanted.iter().copied()))
        .nth(occurrence)?;
    let (start, end) = (from + at[0].start, from + at[at.len() - 1].end);
    Some(Span {
        start: line_column(text, start),
        end: line_column(text, end),
    })
}

/// The whole of lines `first..=last` of `text`, from the first column to
/// the end of the last line.
pub fn lines(text: &str, first: usize, last: usize) -> Span {
    let width = text
        .lines()
        .nth(last.saturating_sub(1))
        .map_or(0, |l| l.chars().count());
    Span {
        start: (first.max(1), 1),
        end: (last.max(first).max(1), width + 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "@id(\"a\")\nforbid (principal, action, resource)\nwhen {\n  // a comment\n  resource.status == \"active\" &&\n  (resource.age < 5)\n};\n";

    #[test]
    fn an_expression_is_found_across_lines_and_parentheses() {
        let at = locate(
            TEXT,
            1,
            7,
            "(resource.status == \"active\") && (resource.age < 5)",
            0,
        )
        .unwrap();
        assert_eq!(at.start, (5, 3));
        assert_eq!(at.end, (6, 20));
        let at = locate(TEXT, 1, 7, "resource.age < 5", 0).unwrap();
        assert_eq!((at.start, at.end), ((6, 4), (6, 20)));
    }

    #[test]
    fn the_search_stays_inside_the_lines_given() {
        assert!(locate(TEXT, 6, 7, "resource.status == \"active\"", 0).is_none());
        assert!(locate(TEXT, 1, 7, "resource.status == \"gone\"", 0).is_none());
        assert!(locate(TEXT, 1, 7, "", 0).is_none());
    }

    #[test]
    fn strings_keep_their_escapes_and_columns_count_characters() {
        let text = "when { \"é\" == \"a\\\"b\" }";
        let at = locate(text, 1, 1, "\"a\\\"b\"", 0).unwrap();
        assert_eq!((at.start, at.end), ((1, 15), (1, 21)));
    }

    #[test]
    fn the_same_text_twice_is_told_apart_and_annotations_are_skipped() {
        let text = "@id(\"a\")\n@note(\"x > 0\")\npermit (principal, action, resource)\nwhen { x > 0 &&\n  y > 0 && z > 0 };\n";
        let body = after_annotations(text, 1, 5);
        assert_eq!(body, 3);
        assert_eq!(locate(text, body, 5, "0", 0).unwrap().start, (4, 12));
        assert_eq!(locate(text, body, 5, "0", 1).unwrap().start, (5, 7));
        assert_eq!(locate(text, body, 5, "0", 2).unwrap().start, (5, 16));
        assert!(locate(text, body, 5, "0", 3).is_none());
    }

    #[test]
    fn lines_cover_the_whole_policy() {
        assert_eq!(lines(TEXT, 2, 7).end, (7, 3));
        assert_eq!(lines(TEXT, 1, 1).start, (1, 1));
    }
}

//! Cedar's diagnostics, rendered by miette from the policy file itself: a
//! `file:line:col: message` line a script can grep, then the snippet with a
//! caret under the place, as Cedar's own CLI draws it. Lines and columns
//! come from miette reading the named source, never from counting here.

use miette::{Diagnostic, GraphicalReportHandler, GraphicalTheme, NamedSource, SourceCode};
use std::fmt;

/// A diagnostic seen through the file it is about.
struct InFile<'a> {
    diag: &'a dyn Diagnostic,
    source: &'a NamedSource<String>,
}

impl fmt::Debug for InFile<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.diag, f)
    }
}

impl fmt::Display for InFile<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self.diag, f)
    }
}

impl std::error::Error for InFile<'_> {}

impl Diagnostic for InFile<'_> {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.diag.code()
    }
    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.diag.help()
    }
    fn labels(&self) -> Option<Box<dyn Iterator<Item = miette::LabeledSpan> + '_>> {
        self.diag.labels()
    }
    fn source_code(&self) -> Option<&dyn SourceCode> {
        Some(self.source)
    }
}

/// Where a byte offset of `text` is, as miette reads it: 1-based line and
/// column.
pub fn place(text: &str, offset: usize) -> (usize, usize) {
    match text.read_span(&offset.into(), 0, 0) {
        Ok(at) => (at.line() + 1, at.column() + 1),
        Err(_) => (1, 1),
    }
}

fn one(diag: &dyn Diagnostic, source: &NamedSource<String>, text: &str, out: &mut Vec<String>) {
    let file = source.name();
    let at = diag
        .labels()
        .and_then(|mut l| l.next())
        .map(|span| {
            let (line, col) = place(text, span.offset());
            format!("{file}:{line}:{col}")
        })
        .unwrap_or_else(|| file.to_string());
    let help = diag
        .help()
        .map(|h| format!(" (help: {h})"))
        .unwrap_or_default();
    out.push(format!("{at}: {diag}{help}"));
    if diag.labels().is_some() {
        let mut drawn = String::new();
        let handler = GraphicalReportHandler::new_themed(GraphicalTheme::unicode_nocolor())
            .with_width(100)
            .with_context_lines(1);
        if handler
            .render_report(&mut drawn, &InFile { diag, source })
            .is_ok()
        {
            out.extend(drawn.lines().map(|l| format!("    {l}")));
        }
    }
}

/// A Cedar diagnostic about `file` (whose text is `text`), with the ones
/// related to it, as lines: each a `file:line:col: message (help: …)` line
/// followed by its drawn snippet.
pub fn describe(diag: &dyn Diagnostic, file: &str, text: &str) -> String {
    let source = NamedSource::new(file, text.to_string());
    let mut lines = Vec::new();
    one(diag, &source, text, &mut lines);
    for related in diag.related().into_iter().flatten() {
        one(related, &source, text, &mut lines);
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    #[test]
    fn a_parse_error_is_placed_and_drawn() {
        let text = "permit(principal, action, resource)\nwhen { resource.x != };\n";
        let e = cedar_policy::PolicySet::from_str(text).unwrap_err();
        let out = describe(&e, "p.cedar", text);
        let first = out.lines().next().unwrap();
        assert!(first.starts_with("p.cedar:2:"), "{out}");
        assert!(
            out.contains("[p.cedar:2:"),
            "the snippet names the place: {out}"
        );
        assert!(out.contains("when { resource.x != };"), "{out}");
    }

    #[test]
    fn place_counts_from_one() {
        assert_eq!(place("ab\ncd", 0), (1, 1));
        assert_eq!(place("ab\ncd", 4), (2, 2));
    }
}

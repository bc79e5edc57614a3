//! Cedar's diagnostics, rendered by miette from the policy file itself: a
//! `file:line:col: message` line a script can grep, then the snippet with a
//! caret under the place, as Cedar's own CLI draws it. Lines and columns
//! come from miette reading the named source, never from counting here.
//!
//! The snippet shows the located line and nothing else: only the first
//! label (the place the grep line names) is drawn, cut at the end of the
//! line it starts on, and no neighbouring line is read for context. A file
//! that is not a policy file at all (a secret, the environment) then shows
//! one line of itself at most.

use miette::{
    Diagnostic, GraphicalReportHandler, GraphicalTheme, MietteError, NamedSource, SourceCode,
    SourceSpan, SpanContents,
};
use std::fmt;

/// A diagnostic seen through the file it is about.
struct InFile<'a> {
    diag: &'a dyn Diagnostic,
    source: LinesOnly<'a>,
}

/// The file as the snippet reads it: asked for a span with context, it
/// gives the whole lines the span covers and not one more, whatever number
/// of context lines is asked for. (miette's own reading with no context
/// gives the span alone, not its line.)
struct LinesOnly<'a>(&'a NamedSource<String>);

impl SourceCode for LinesOnly<'_> {
    fn read_span<'a>(
        &'a self,
        span: &SourceSpan,
        before: usize,
        after: usize,
    ) -> Result<Box<dyn SpanContents<'a> + 'a>, MietteError> {
        if before == 0 && after == 0 {
            return self.0.read_span(span, 0, 0);
        }
        let text = self.0.inner().as_bytes();
        let start = span.offset().min(text.len());
        let end = (span.offset() + span.len()).clamp(start, text.len());
        let line_start = text[..start]
            .iter()
            .rposition(|b| *b == b'\n')
            .map_or(0, |i| i + 1);
        let line_end = text[end..]
            .iter()
            .position(|b| *b == b'\n')
            .map_or(text.len(), |i| end + i);
        self.0
            .read_span(&(line_start, line_end - line_start).into(), 0, 0)
    }
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
        let text = self.source.0.inner().as_str();
        let first = self.diag.labels()?.next()?;
        Some(Box::new(std::iter::once(within_its_line(first, text))))
    }
    fn source_code(&self) -> Option<&dyn SourceCode> {
        Some(&self.source)
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

/// A label cut to end where the line it starts on ends.
fn within_its_line(label: miette::LabeledSpan, text: &str) -> miette::LabeledSpan {
    let start = label.offset().min(text.len());
    let line_end = text.as_bytes()[start..]
        .iter()
        .position(|b| *b == b'\n')
        .map_or(text.len(), |i| start + i);
    let span = (start, label.len().min(line_end - start));
    let name = label.label().map(str::to_string);
    if label.primary() {
        miette::LabeledSpan::new_primary_with_span(name, span)
    } else {
        miette::LabeledSpan::new_with_span(name, span)
    }
}

/// One thing wrong with a policy file, located: what a script greps
/// (`file:line:col: message`), a reader sees (the drawn snippet below it)
/// and a SARIF log places (the file's name in its folder, line, column).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The file's name in its policy folder (`retirement.cedar`).
    pub file: String,
    /// 1-based line and column (1 when the problem has no place of its own).
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What is wrong, with Cedar's help when it has some: one line.
    pub message: String,
    /// The whole text for a person: the `file:line:col: message` line, then
    /// the snippet.
    pub drawn: String,
}

impl Problem {
    /// A problem found by our own checks, at a line of `file` (shown as
    /// `shown`).
    pub fn at(file: &str, shown: &str, line: usize, message: String) -> Problem {
        Problem {
            file: file.to_string(),
            line: line.max(1),
            column: 1,
            drawn: format!("{shown}:{line}: {message}"),
            message,
        }
    }
}

fn one(diag: &dyn Diagnostic, source: &NamedSource<String>, file: &str, text: &str) -> Problem {
    let shown = source.name();
    let offset = diag
        .labels()
        .and_then(|mut l| l.next())
        .map(|span| span.offset().min(text.len()));
    let place_of = offset.map(|o| place(text, o));
    let at = match place_of {
        Some((line, col)) => format!("{shown}:{line}:{col}"),
        None => shown.to_string(),
    };
    let help = diag
        .help()
        .map(|h| format!(" (help: {h})"))
        .unwrap_or_default();
    let message = format!("{diag}{help}");
    let mut lines = vec![format!("{at}: {message}")];
    if diag.labels().is_some() {
        let mut drawn = String::new();
        let handler = GraphicalReportHandler::new_themed(GraphicalTheme::unicode_nocolor())
            .with_width(100)
            .with_context_lines(1);
        if handler
            .render_report(
                &mut drawn,
                &InFile {
                    diag,
                    source: LinesOnly(source),
                },
            )
            .is_ok()
        {
            // The drawing's own header repeats the message (and its help)
            // of the line above: only the snippet is kept.
            lines.extend(
                drawn
                    .lines()
                    .filter(|l| {
                        let t = l.trim_start();
                        !t.is_empty() && !t.starts_with('×') && !t.starts_with("help:")
                    })
                    .map(|l| format!("    {l}")),
            );
        }
    }
    // miette counts columns in bytes; a SARIF log counts characters.
    let column = offset.filter(|o| text.is_char_boundary(*o)).map_or(1, |o| {
        let line_start = text[..o].rfind('\n').map_or(0, |i| i + 1);
        text[line_start..o].chars().count() + 1
    });
    let line = place_of.map_or(1, |p| p.0);
    Problem {
        file: file.to_string(),
        line,
        column,
        message,
        drawn: lines.join("\n"),
    }
}

/// A Cedar diagnostic about `file` (shown to a person as `shown`, whose
/// text is `text`), and the ones related to it: a problem each.
pub fn problems(diag: &dyn Diagnostic, file: &str, shown: &str, text: &str) -> Vec<Problem> {
    let source = NamedSource::new(shown, text.to_string());
    let mut out = vec![one(diag, &source, file, text)];
    for related in diag.related().into_iter().flatten() {
        out.push(one(related, &source, file, text));
    }
    out
}

/// The same as lines: each a `file:line:col: message (help: …)` line
/// followed by its drawn snippet.
pub fn describe(diag: &dyn Diagnostic, file: &str, text: &str) -> String {
    problems(diag, file, file, text)
        .into_iter()
        .map(|p| p.drawn)
        .collect::<Vec<_>>()
        .join("\n")
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
    fn the_snippet_is_the_located_line_alone() {
        let text =
            "// before\npermit(principal, action, resource)\nwhen { resource.x != };\n// after\n";
        let e = cedar_policy::PolicySet::from_str(text).unwrap_err();
        let out = describe(&e, "p.cedar", text);
        assert!(out.contains("when { resource.x != };"), "{out}");
        assert!(!out.contains("before") && !out.contains("after"), "{out}");
        assert!(!out.contains("permit(principal"), "{out}");
        // A span over three lines is drawn on its first only.
        let label = miette::LabeledSpan::new(Some("here".into()), 3, 30);
        let cut = within_its_line(label, "ab\ncdef\ngh\nij");
        assert_eq!((cut.offset(), cut.len()), (3, 4));
        let label = miette::LabeledSpan::new(None, 99, 5);
        let cut = within_its_line(label, "ab");
        assert_eq!((cut.offset(), cut.len()), (2, 0));
    }

    #[test]
    fn place_counts_from_one() {
        assert_eq!(place("ab\ncd", 0), (1, 1));
        assert_eq!(place("ab\ncd", 4), (2, 2));
    }
}

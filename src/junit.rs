//! JUnit XML, the test report every CI system's test view reads (GitLab,
//! Jenkins, GitHub test reporters): `fleet-retire test --format junit` (a
//! suite per fixture file, a case per fixture case) and `policy verify
//! --format junit` (a suite per property file, a case per proof). Written
//! with quick-xml, which escapes every text and attribute; characters XML
//! 1.0 cannot hold at all (most control characters) are shown escaped, as
//! in every human output.

use quick_xml::events::{BytesDecl, BytesText, Event};
use quick_xml::Writer;
use std::io;

/// One suite: a fixture file, or a property file.
#[derive(Debug, Clone)]
pub struct Suite {
    /// Its name (the file).
    pub name: String,
    /// Its cases.
    pub cases: Vec<TestCase>,
}

/// One case and how it ended.
#[derive(Debug, Clone)]
pub struct TestCase {
    /// The case's name.
    pub name: String,
    /// The class it belongs to (CI views group by it).
    pub classname: String,
    /// How long it took, in seconds.
    pub seconds: f64,
    /// Passed, failed or an error.
    pub outcome: Outcome,
}

/// How a case ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Every expectation held.
    Passed,
    /// An expectation did not hold: a one-line message and the whole text
    /// (expected and actual).
    Failed(String, String),
    /// The case could not be run (a malformed file).
    Error(String, String),
}

/// Text as XML 1.0 can hold it: control characters (other than tab, line
/// feed and carriage return) shown escaped.
fn xml_text(s: &str) -> String {
    if s.chars()
        .all(|c| !c.is_control() || matches!(c, '\t' | '\n' | '\r'))
    {
        return s.to_string();
    }
    s.chars()
        .map(|c| match c {
            '\t' | '\n' | '\r' => c.to_string(),
            c if c.is_control() => c.escape_unicode().to_string(),
            c => c.to_string(),
        })
        .collect()
}

fn count(cases: &[TestCase], failed: bool) -> usize {
    cases
        .iter()
        .filter(|c| match c.outcome {
            Outcome::Failed(..) => failed,
            Outcome::Error(..) => !failed,
            Outcome::Passed => false,
        })
        .count()
}

/// The report: `<testsuites name=…>` holding every suite.
pub fn write(name: &str, suites: &[Suite]) -> io::Result<Vec<u8>> {
    let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
    w.write_event(Event::Decl(BytesDecl::new("1.0", Some("UTF-8"), None)))?;
    let all: Vec<TestCase> = suites.iter().flat_map(|s| s.cases.clone()).collect();
    let seconds =
        |cases: &[TestCase]| format!("{:.3}", cases.iter().map(|c| c.seconds).sum::<f64>());
    w.create_element("testsuites")
        .with_attribute(("name", xml_text(name).as_str()))
        .with_attribute(("tests", all.len().to_string().as_str()))
        .with_attribute(("failures", count(&all, true).to_string().as_str()))
        .with_attribute(("errors", count(&all, false).to_string().as_str()))
        .with_attribute(("time", seconds(&all).as_str()))
        .write_inner_content(|w| {
            for suite in suites {
                w.create_element("testsuite")
                    .with_attribute(("name", xml_text(&suite.name).as_str()))
                    .with_attribute(("tests", suite.cases.len().to_string().as_str()))
                    .with_attribute(("failures", count(&suite.cases, true).to_string().as_str()))
                    .with_attribute(("errors", count(&suite.cases, false).to_string().as_str()))
                    .with_attribute(("time", seconds(&suite.cases).as_str()))
                    .write_inner_content(|w| suite.cases.iter().try_for_each(|c| case(w, c)))?;
            }
            Ok(())
        })?;
    let mut out = w.into_inner();
    out.push(b'\n');
    Ok(out)
}

/// One `<testcase>`, with its `<failure>` or `<error>`.
fn case(w: &mut Writer<Vec<u8>>, c: &TestCase) -> io::Result<()> {
    let element = w
        .create_element("testcase")
        .with_attribute(("name", xml_text(&c.name).as_str()))
        .with_attribute(("classname", xml_text(&c.classname).as_str()))
        .with_attribute(("time", format!("{:.3}", c.seconds).as_str()));
    let (tag, message, text) = match &c.outcome {
        Outcome::Passed => {
            element.write_empty()?;
            return Ok(());
        }
        Outcome::Failed(m, t) => ("failure", m, t),
        Outcome::Error(m, t) => ("error", m, t),
    };
    element.write_inner_content(|w| {
        w.create_element(tag)
            .with_attribute(("message", xml_text(message).as_str()))
            .with_attribute(("type", tag))
            .write_text_content(BytesText::new(&xml_text(text)))?;
        Ok(())
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Markup and control characters in a name or a message stay text.
    #[test]
    fn markup_and_control_characters_stay_text() {
        let suites = [Suite {
            name: "a<b>&\"c\"".into(),
            cases: vec![TestCase {
                name: "</testcase><x>".into(),
                classname: "k".into(),
                seconds: 0.5,
                outcome: Outcome::Failed("bell\u{7}".into(), "]]> & <".into()),
            }],
        }];
        let xml = String::from_utf8(write("r", &suites).unwrap()).unwrap();
        assert!(xml.contains("name=\"&lt;/testcase&gt;&lt;x&gt;\""), "{xml}");
        assert!(xml.contains("message=\"bell\\u{7}\""), "{xml}");
        assert!(xml.contains("]]&gt; &amp; &lt;"), "{xml}");
        assert!(
            xml.contains("tests=\"1\" failures=\"1\" errors=\"0\""),
            "{xml}"
        );
    }
}

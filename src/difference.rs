//! What a fixture case expected and what came out, for the runner, the
//! mutation judge and the capability cases alike (below all of them).

/// One expectation of a fixture case that did not hold: what, what the
/// case expected, and what came out. Shown as `what: want …, got …`; `test
/// --format json` gives the three fields.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Difference {
    /// What was compared.
    pub what: String,
    /// What the case expected.
    pub expected: String,
    /// What came out.
    pub actual: String,
}

impl Difference {
    /// A difference of `what`.
    pub fn new(
        what: impl Into<String>,
        expected: impl std::fmt::Display,
        actual: impl std::fmt::Display,
    ) -> Difference {
        Difference {
            what: what.into(),
            expected: expected.to_string(),
            actual: actual.to_string(),
        }
    }
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: want {}, got {}",
            self.what, self.expected, self.actual
        )
    }
}

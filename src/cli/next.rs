//! The commands the program prints for a person to run next (`plan --out`'s
//! apply command, an apply's next batch). Two rules: a printed command names
//! no flag the person did not give, and it works when run in the same
//! environment. Both hold when a flag is printed exactly when its value is
//! not what its environment variable already gives: a value that came from
//! the environment is left to it, and one typed on the command line is kept
//! unless the environment says the same.

use crate::text::{esc, shell_word};
use std::path::Path;

/// A command line being written for a person.
pub struct NextCommand {
    words: Vec<String>,
}

impl NextCommand {
    /// `fleet-retire` and `words`.
    pub fn new(words: &[&str]) -> NextCommand {
        let mut command = NextCommand {
            words: vec!["fleet-retire".into()],
        };
        for w in words {
            command.word(w);
        }
        command
    }

    /// One more word, quoted for a shell when it needs it.
    pub fn word(&mut self, word: &str) -> &mut NextCommand {
        self.words.push(shell_word(&esc(word)).into_owned());
        self
    }

    /// A path, quoted for a shell when it needs it.
    pub fn path(&mut self, path: &Path) -> &mut NextCommand {
        self.word(&path.display().to_string())
    }

    /// `flag value`, unless the environment variable `env` holds `value`
    /// already (see the module's words). `shown` is what to print for the
    /// value (a store's label, which never shows a password).
    pub fn flag(&mut self, flag: &str, env: Option<&str>, value: &str, shown: &str) -> &mut Self {
        let given_by_env = env
            .and_then(std::env::var_os)
            .is_some_and(|v| v.to_str() == Some(value));
        if !given_by_env {
            self.word(flag);
            self.word(shown);
        }
        self
    }

    /// [`Self::flag`] of an optional value.
    pub fn flag_opt(&mut self, flag: &str, env: Option<&str>, value: Option<&str>) -> &mut Self {
        if let Some(value) = value {
            self.flag(flag, env, value, value);
        }
        self
    }

    /// A store's `--registry` or `--leases`: its label (a PostgreSQL URL
    /// without its password, which then comes from PGPASSWORD).
    pub fn store(&mut self, flag: &str, env: &str, location: &Path) -> &mut NextCommand {
        let label = crate::store::location::label(location);
        let value = location.to_string_lossy();
        self.flag(flag, Some(env), &value, &label)
    }
}

impl std::fmt::Display for NextCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.words.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value the environment gives is left to it; another is printed,
    /// quoted when a shell would read it otherwise.
    #[test]
    fn a_flag_is_printed_unless_the_environment_gives_its_value() {
        // A variable no other test reads, set for this test alone.
        std::env::set_var("FLEET_RETIRE_TEST_NEXT_COMMAND", "from-env");
        let mut c = NextCommand::new(&["apply", "my plan.json"]);
        c.flag(
            "--profile",
            Some("FLEET_RETIRE_TEST_NEXT_COMMAND"),
            "from-env",
            "from-env",
        )
        .flag(
            "--profiles",
            Some("FLEET_RETIRE_TEST_NEXT_COMMAND"),
            "p.json",
            "p.json",
        )
        .flag_opt("--policies", None, None);
        assert_eq!(
            c.to_string(),
            "fleet-retire apply 'my plan.json' --profiles p.json"
        );
    }
}

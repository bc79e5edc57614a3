//! Failures (as opposed to findings): each says what failed, where, and what
//! to do, and maps to the exit code scripts branch on.

use std::path::PathBuf;

/// Exit codes (README.md, "Exit codes").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitCode {
    /// Done.
    Ok = 0,
    /// Bad input, unreadable store, failed test case.
    Error = 1,
    /// Ran, but refused (denied, tokens moved, over a limit).
    Refused = 2,
    /// Invalid policy or schema.
    InvalidPolicy = 3,
    /// The policies are valid but a property does not hold of them
    /// (`policy verify`, `grants --against`): a proof failed.
    ProofFailed = 4,
    /// The connection was lost after an apply's COMMIT was sent and before
    /// its reply: it may or may not have committed (`apply-status` says).
    OutcomeUnknown = 5,
}

impl From<ExitCode> for std::process::ExitCode {
    fn from(code: ExitCode) -> Self {
        std::process::ExitCode::from(code as u8)
    }
}

/// A failure that stops a command.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The worker registry could not be opened or read as one.
    #[error("registry {shown}: {message}")]
    Registry {
        /// The registry as messages name it: a file's path, or a
        /// PostgreSQL URL without its password (`store::location::label`
        /// makes it; only the store's code, which alone reads URLs, builds
        /// this error).
        shown: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// The lease store could not be read (never taken as "no leases").
    #[error("lease store {shown}: {message}")]
    Leases {
        /// The lease store as messages name it (see `Registry`).
        shown: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// SQLite failed while reading or writing a store: the cause is kept
    /// (`source`), so a caller can tell a busy database from a corrupt one.
    #[error("{store} {}: {doing}: {source}{}", shown(path), sqlite_hint(source))]
    Sqlite {
        /// Which store.
        store: Store,
        /// Its file.
        path: PathBuf,
        /// What we were doing ("cannot read", "cannot take the write lock").
        doing: String,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
    /// PostgreSQL failed while connecting to, reading or writing a store.
    /// `location` is the store's URL with any password masked.
    #[error(
        "{store} {location}: {doing}: {}{}",
        postgres_message(source),
        postgres_hint(source)
    )]
    Postgres {
        /// Which store.
        store: Store,
        /// Its URL, password masked.
        location: String,
        /// What we were doing.
        doing: String,
        /// PostgreSQL's (or the connection's) error.
        #[source]
        source: postgres::Error,
    },
    /// The connection to a PostgreSQL registry was lost after COMMIT was
    /// sent and before its reply came: the transaction may or may not have
    /// committed, and only the registry itself can say which.
    #[error("registry {shown}: the connection was lost after COMMIT was sent and before its reply ({message})")]
    OutcomeUnknown {
        /// The registry as messages name it.
        shown: String,
        /// What the connection said.
        message: String,
    },
    /// A file or folder could not be read or written.
    #[error("{}: {doing}: {source}", shown(path))]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// What we were doing.
        doing: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A policy, a property or the schema failed to parse or validate, or
    /// a proof could not be made.
    #[error("{message}")]
    Policy {
        /// What it is about.
        about: About,
        /// What is wrong and what to do.
        message: String,
    },
    /// A fixture file is malformed.
    #[error("fixture {}: {message}", shown(path))]
    Fixture {
        /// The fixture file.
        path: PathBuf,
        /// The field and what is wrong with it.
        message: String,
    },
    /// `profiles.json` is malformed or unreadable.
    #[error("profiles {}: {message}", shown(path))]
    Profiles {
        /// The profiles file.
        path: PathBuf,
        /// What is wrong and what to do.
        message: String,
    },
    /// A command was refused (capability denied, tokens moved, limit).
    #[error("{0}")]
    Refused(String),
    /// Anything else the operator got wrong on the command line or in a file.
    #[error("{message}")]
    Input {
        /// What it is about.
        about: About,
        /// What is wrong and what to do.
        message: String,
    },
    /// Something this program needs of the machine failed (an async
    /// runtime, rendering a document): not the operator's doing.
    #[error("{doing}: {source}")]
    Internal {
        /// What we were doing.
        doing: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Writing the command's output failed. A closed pipe (`| head`) is not
    /// a failure: `main` ends quietly with exit 0.
    #[error("writing the output: {0}")]
    Output(#[source] std::io::Error),
}

/// What an [`Error::Input`] or [`Error::Policy`] is about, carried beside
/// its message (as cargo-deny's diagnostics carry their labels), so a
/// caller can tell a bad option from a bad file, an unknown worker or an
/// invalid policy without reading the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum About {
    /// A command-line option or argument, as written (`--out`), or a
    /// command's arguments as a whole (`explain`).
    Option(&'static str),
    /// A file or folder that was named.
    File(PathBuf),
    /// A worker identity.
    Worker(String),
    /// One policy or property, by its id or its file's name.
    Policy(String),
    /// The policy set as a whole, or its schema.
    PolicySet,
    /// The arguments of a tool call to `serve`.
    ToolCall,
    /// Something of this machine the command needs (a process, the
    /// solver, a signal), not the operator's words.
    Machine,
}

impl Error {
    /// A stable name for what failed, for the JSON error envelope
    /// (`--format json`): `registry`, `leases`, `sqlite`, `postgres`,
    /// `outcome_unknown`, `io`,
    /// `policy`, `fixture`, `profiles`, `refused`, `input`, `internal` or
    /// `output`.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Registry { .. } => "registry",
            Error::Leases { .. } => "leases",
            Error::Sqlite { .. } => "sqlite",
            Error::Postgres { .. } => "postgres",
            Error::OutcomeUnknown { .. } => "outcome_unknown",
            Error::Io { .. } => "io",
            Error::Policy { .. } => "policy",
            Error::Fixture { .. } => "fixture",
            Error::Profiles { .. } => "profiles",
            Error::Refused(_) => "refused",
            Error::Input { .. } => "input",
            Error::Internal { .. } => "internal",
            Error::Output(_) => "output",
        }
    }

    /// The JSON error envelope `--format json` prints on stdout when a
    /// command fails: what failed, the exit code, the message (which names
    /// the file or store and the place), a stable `reason_code` a script
    /// branches on, and `what_to_do` (README, "Output").
    pub fn envelope(&self) -> serde_json::Value {
        let (reason_code, what_to_do) = self.reason();
        serde_json::json!({"error": {
            "kind": self.kind(),
            "exit_code": self.exit_code() as u8,
            "message": self.to_string(),
            "reason_code": reason_code,
            "what_to_do": what_to_do,
        }})
    }

    /// The reason code of a failure, in the vocabulary apply's outcomes
    /// use where one fits, and what to do about it in general terms (the
    /// message says it for the case at hand).
    fn reason(&self) -> (&'static str, &'static str) {
        let store = |store: &Store| {
            match store {
            Store::Registry => (
                "registry_unavailable",
                "check the registry the message names (the path or URL, its permissions, that its server answers), then run the command again",
            ),
            Store::Leases => (
                "lease_store_unavailable",
                "check the lease store the message names (the path or URL, its permissions, that it is the writable member), then run the command again",
            ),
        }
        };
        match self {
            Error::Registry { .. } => store(&Store::Registry),
            Error::Leases { .. } => store(&Store::Leases),
            Error::Sqlite { store: s, .. } | Error::Postgres { store: s, .. } => store(s),
            Error::OutcomeUnknown { .. } => ("outcome_unknown", "do not apply again yet: run `fleet-retire apply-status APPLY_ID` with the same registry, which says whether the apply committed"),
            Error::Io { .. } => ("file_unreadable", "check the file the message names (its path and permissions), then run the command again"),
            Error::Policy { .. } => ("invalid_policy", "fix the policy or schema at the place the message names (`fleet-retire policy validate` checks it), then run the command again"),
            Error::Fixture { .. } => ("invalid_fixture", "fix the fixture file at the place the message names (docs/fixtures.md describes the format)"),
            Error::Profiles { .. } => ("invalid_profiles", "fix profiles.json at the place the message names (`fleet-retire grants` checks it)"),
            Error::Refused(_) => ("refused", "read the message: it says why the command refused and what would let it run"),
            Error::Input { .. } => ("bad_input", "correct the argument, variable or file the message names, then run the command again"),
            Error::Internal { .. } => ("internal_error", "this is a bug: report it with the message, and check the registry with `fleet-retire snapshot`"),
            Error::Output(_) => ("output_failed", "check where the output goes (a full disk, a closed pipe), then run the command again"),
        }
    }

    /// An [`Error::Input`].
    pub fn input(about: About, message: impl Into<String>) -> Error {
        Error::Input {
            about,
            message: message.into(),
        }
    }

    /// An [`Error::Policy`].
    pub fn policy(about: About, message: impl Into<String>) -> Error {
        Error::Policy {
            about,
            message: message.into(),
        }
    }

    /// What an input or policy error is about.
    pub fn about(&self) -> Option<&About> {
        match self {
            Error::Input { about, .. } | Error::Policy { about, .. } => Some(about),
            _ => None,
        }
    }
}

/// A path as an error names it: a file as it is, and a PostgreSQL URL given
/// where a file was meant (`apply postgres://…`) without what may hold a
/// password: everything up to its last `@` (a raw `/`, `?` or `@` in a
/// password hides nothing that way) and its query (`?password=`). The
/// stores' own messages name a URL through `store::location::label`; this
/// layer sits below the stores and masks on its own.
fn shown(path: &std::path::Path) -> String {
    let text = path.to_string_lossy();
    let Some((scheme, rest)) = text.split_once("://").filter(|(s, _)| {
        s.eq_ignore_ascii_case("postgres") || s.eq_ignore_ascii_case("postgresql")
    }) else {
        return text.into_owned();
    };
    let after_user = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let place = after_user.split(['?', '#']).next().unwrap_or_default();
    format!("{scheme}://{place}")
}

/// The stores an [`Error::Sqlite`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// The worker registry.
    Registry,
    /// The control-plane lease store.
    Leases,
}

impl std::fmt::Display for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Store::Registry => "registry",
            Store::Leases => "lease store",
        })
    }
}

/// What to do about the SQLite errors an operator can act on.
fn sqlite_hint(e: &rusqlite::Error) -> &'static str {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase) => {
            "; the file is not a SQLite database: check the path"
        }
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
            "; another process holds the lock: try again, or raise the busy timeout"
        }
        Some(rusqlite::ErrorCode::ReadOnly) => {
            "; the file or its folder is not writable by this user"
        }
        _ => "",
    }
}

/// PostgreSQL's own message (with its detail), or the connection error.
fn postgres_message(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => match db.detail() {
            Some(detail) => format!("{} ({detail})", db.message()),
            None => db.message().to_string(),
        },
        None => match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    }
}

/// What to do about the PostgreSQL errors an operator can act on.
fn postgres_hint(e: &postgres::Error) -> &'static str {
    use postgres::error::SqlState;
    let said = postgres_message(e);
    if said.contains("server does not support TLS") {
        return "; the server does not speak TLS: turn `ssl` on in its postgresql.conf (with a \
                certificate), or, only on a network you trust, put sslmode=disable in the URL";
    }
    if said.contains("certificate verify failed") || said.contains("TLS handshake") {
        return "; the server's certificate was refused: sslrootcert=FILE must hold the root \
                that signed it, it must not have expired, and with sslmode=verify-full (the \
                default for a host that is not this machine) it must name the host as the URL \
                writes it";
    }
    match e.code() {
        None if e.is_closed() || e.as_db_error().is_none() => {
            "; is the server running and the URL right (postgres://USER@HOST:PORT/DATABASE)?"
        }
        Some(c) if *c == SqlState::INVALID_PASSWORD || *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION => {
            "; check the user and password in the URL"
        }
        Some(c) if *c == SqlState::INVALID_CATALOG_NAME => {
            "; the database does not exist: create it (createdb), or fix the URL"
        }
        Some(c) if *c == SqlState::INSUFFICIENT_PRIVILEGE => {
            "; this database user lacks a privilege the command needs: grant it, or connect as the tables' owner"
        }
        _ => "",
    }
}

impl Error {
    /// A PostgreSQL failure of `store` at `location` while `doing`.
    pub fn postgres<'a>(
        store: Store,
        location: &'a str,
        doing: &'a str,
    ) -> impl Fn(postgres::Error) -> Error + Copy + 'a {
        move |source| Error::Postgres {
            store,
            location: location.to_string(),
            doing: doing.to_string(),
            source,
        }
    }

    /// A SQLite failure of `store` at `path` while `doing`, for `map_err`.
    pub fn sqlite<'a>(
        store: Store,
        path: &'a std::path::Path,
        doing: &'a str,
    ) -> impl Fn(rusqlite::Error) -> Error + Copy + 'a {
        move |source| Error::Sqlite {
            store,
            path: path.to_path_buf(),
            doing: doing.to_string(),
            source,
        }
    }

    /// An I/O failure at `path` while `doing`, for `map_err`.
    pub fn io<'a>(
        path: &'a std::path::Path,
        doing: &'a str,
    ) -> impl Fn(std::io::Error) -> Error + Copy + 'a {
        move |source| Error::Io {
            path: path.to_path_buf(),
            doing: doing.to_string(),
            source,
        }
    }

    /// Another writer holds the store's lock past our busy timeout.
    pub fn is_lock_contention(&self) -> bool {
        matches!(
            self,
            Error::Sqlite { source, .. } if matches!(
                source.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
            )
        )
    }
}

/// Write a line to standard output, as `println!` would, but return the
/// failure (a closed pipe, a full disk) instead of panicking.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*).map_err($crate::error::Error::Output)
    }};
}

/// `print!` that returns the failure instead of panicking.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut w = std::io::stdout().lock();
        write!(w, $($arg)*).and_then(|()| w.flush()).map_err($crate::error::Error::Output)
    }};
}

impl Error {
    /// The exit code this failure maps to.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            Error::Output(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::Ok,
            Error::Policy { .. } => ExitCode::InvalidPolicy,
            Error::Refused(_) => ExitCode::Refused,
            Error::OutcomeUnknown { .. } => ExitCode::OutcomeUnknown,
            _ => ExitCode::Error,
        }
    }
}

impl Error {
    /// A closed standard output: the reader has all it wanted.
    pub fn is_closed_pipe(&self) -> bool {
        matches!(self, Error::Output(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
    }
}

/// Result with the crate's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the SIGBUS handler writes (a constant: the handler may only make
/// async-signal-safe calls, so it formats nothing).
const BUS_ERROR_MESSAGE: &[u8] = b"fleet-retire: a store file could not be read where it was \
mapped into memory (a disk error, or the file was cut short by a process that ignores \
SQLite's locks). Nothing was changed by this command. Check the disk and the file \
(sqlite3 FILE 'PRAGMA integrity_check'), then run the command again.\n";

extern "C" fn bus_error(_: nix::libc::c_int) {
    // SAFETY: write(2) and _exit(2) are async-signal-safe; the message is
    // a static byte string.
    unsafe {
        nix::libc::write(
            2,
            BUS_ERROR_MESSAGE.as_ptr().cast(),
            BUS_ERROR_MESSAGE.len(),
        );
        nix::libc::_exit(ExitCode::Error as nix::libc::c_int);
    }
}

/// Turn SIGBUS into a plain message and exit 1. The registry's read-only
/// readers map part of the file (`evidence::registry`), and a mapped page
/// that cannot be read raises SIGBUS where `pread` would have returned an
/// error. Only reads map, so nothing is half-written when this exits: a
/// plan or a snapshot writes nothing, and apply's transaction (whose reads
/// never map) is rolled back by SQLite from its journal.
pub fn on_bus_error() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(
        SigHandler::Handler(bus_error),
        SaFlags::empty(),
        SigSet::empty(),
    );
    // SAFETY: the handler makes only async-signal-safe calls.
    let _ = unsafe { sigaction(Signal::SIGBUS, &action) };
}

#[cfg(test)]
mod shown_tests {
    #[test]
    fn a_url_given_as_a_path_shows_no_part_of_its_password() {
        for (url, want) in [
            (
                "postgres://u:se/cr?et@db:5432/fleet?sslmode=verify-full",
                "postgres://db:5432/fleet",
            ),
            ("postgresql://u:a@b@db/fleet", "postgresql://db/fleet"),
            ("postgres://db/fleet?password=secret", "postgres://db/fleet"),
            ("plan.json", "plan.json"),
        ] {
            assert_eq!(super::shown(std::path::Path::new(url)), want);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_and_policy_errors_carry_their_subject_and_read_as_their_message() {
        let e = Error::input(About::Option("--out"), "--out x: the path exists");
        assert_eq!(e.to_string(), "--out x: the path exists");
        assert_eq!(e.about(), Some(&About::Option("--out")));
        assert_eq!(e.exit_code(), ExitCode::Error);
        let p = Error::policy(About::Policy("worker-live".into()), "worker-live: bad");
        assert_eq!(p.to_string(), "worker-live: bad");
        assert_eq!(p.exit_code(), ExitCode::InvalidPolicy);
        assert_eq!(Error::Refused("no".into()).about(), None);
    }

    /// Another connection holding the write lock is contention, told apart
    /// by SQLite's own code rather than by the words of its message, and the
    /// cause stays attached.
    #[test]
    fn a_held_write_lock_is_contention_and_keeps_its_cause() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.sqlite");
        let holder = rusqlite::Connection::open(&path).unwrap();
        holder
            .execute_batch("CREATE TABLE t (x); BEGIN IMMEDIATE; INSERT INTO t VALUES (1);")
            .unwrap();
        let other = rusqlite::Connection::open(&path).unwrap();
        other.busy_timeout(std::time::Duration::ZERO).unwrap();
        let e = other
            .execute_batch("BEGIN IMMEDIATE")
            .map_err(Error::sqlite(
                Store::Registry,
                &path,
                "cannot take the write lock",
            ))
            .unwrap_err();
        assert!(e.is_lock_contention(), "{e}");
        assert!(std::error::Error::source(&e).is_some());
        assert!(e.to_string().contains("try again"), "{e}");
        assert_eq!(e.exit_code(), ExitCode::Error);
        let not_busy = Error::Registry {
            shown: path.display().to_string(),
            message: "database is locked (in words only)".into(),
        };
        assert!(!not_busy.is_lock_contention());
    }
}

//! Failures (as opposed to findings): each says what failed, where, and what
//! to do, and maps to the exit code scripts branch on.

use std::path::PathBuf;

/// Exit codes (design.md "Command line").
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
}

/// A failure that stops a command.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The worker registry could not be opened or read as one.
    #[error("registry {}: {message}", path.display())]
    Registry {
        /// The registry file.
        path: PathBuf,
        /// What is wrong and what to do.
        message: String,
    },
    /// The lease store could not be read (never taken as "no leases").
    #[error("lease store {}: {message}", path.display())]
    Leases {
        /// The lease database.
        path: PathBuf,
        /// What is wrong and what to do.
        message: String,
    },
    /// A policy or the schema failed to parse or validate.
    #[error("{0}")]
    Policy(String),
    /// A fixture file is malformed.
    #[error("fixture {}: {message}", path.display())]
    Fixture {
        /// The fixture file.
        path: PathBuf,
        /// The field and what is wrong with it.
        message: String,
    },
    /// `profiles.json` is malformed or unreadable.
    #[error("profiles {}: {message}", path.display())]
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
    #[error("{0}")]
    Input(String),
    /// Writing the command's output failed. A closed pipe (`| head`) is not
    /// a failure: `main` ends quietly with exit 0.
    #[error("writing the output: {0}")]
    Output(#[source] std::io::Error),
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
            Error::Policy(_) => ExitCode::InvalidPolicy,
            Error::Refused(_) => ExitCode::Refused,
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

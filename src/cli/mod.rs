//! The command line: one file per subcommand, shared flags flattened in.

pub mod apply;
pub mod apply_args;
pub mod apply_status;
pub mod batches;
pub mod completions;
pub mod controller;
pub mod demo;
pub mod diff;
pub mod explain;
pub mod fixture;
pub mod grants;
pub mod launch;
pub mod mutate;
pub mod next;
pub mod plan;
pub mod policy;
pub mod progress;
pub mod registry;
pub mod report_gather;
pub mod report_page;
pub mod sample;
pub mod serve;
pub mod snapshot;
pub mod test;
pub mod worker;

use crate::capability::{check, Profiles};
use crate::error::{About, Error, ExitCode, Result};
use crate::policy::{Policies, PolicySource};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// A short table for a terminal.
    Human,
    /// The stable, complete JSON document.
    Json,
    /// JUnit XML, for a CI system's test view: `test` and `policy verify`
    /// only.
    Junit,
    /// An LCOV tracefile of which policy lines the fixtures exercised:
    /// `test --coverage` only.
    Lcov,
    /// A SARIF 2.1.0 log of findings located in the policy files (and
    /// profiles.json), for code-scanning views: `policy validate`, `verify`,
    /// `mutate`, `diff` and `grants` only.
    Sarif,
    /// The mutation-testing report schema's JSON (Stryker's format, read by
    /// `mutation-testing-elements`): `policy mutate` only.
    MutationReport,
}

/// fleet-retire: retire stale worker registrations, decided by Cedar policy.
#[derive(Debug, Parser)]
#[command(name = "fleet-retire", version, about, max_term_width = 100)]
pub struct Cli {
    /// Output format.
    #[arg(long, global = true, value_enum, default_value_t = Format::Human)]
    pub format: Format,
    /// Policy folder to use instead of the policies built into the binary.
    #[arg(long, global = true, env = "FLEET_RETIRE_POLICIES", value_name = "DIR")]
    pub policies: Option<PathBuf>,
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Dry run: which registrations may be retired, and why the rest are kept.
    Plan(plan::PlanArgs),
    /// Retire exactly what a plan approved, in one guarded transaction.
    Apply(apply::ApplyArgs),
    /// Retire stale workers by itself: one leader per (registry, host),
    /// fenced by its lease's term, budgeted, with /metrics (docs/controller.md).
    Controller(controller::ControllerArgs),
    /// Whether an apply committed (for one that ended `outcome_unknown`):
    /// its audit rows on the registry, read once no COMMIT is in flight.
    /// Exit 0 when it committed, 2 when it did not.
    ApplyStatus(apply_status::ApplyStatusArgs),
    /// The live fleet: instances, collisions, stale rows, manifest drift.
    Snapshot(snapshot::SnapshotArgs),
    /// A small real fleet, end to end: register, die, snapshot, plan, apply.
    Demo(demo::DemoArgs),
    /// The MCP server a launcher starts: tools bound to this process's profile and files.
    Serve(serve::ServeArgs),
    /// Mint a launch identity and print the five-server mcpServers config.
    Launch(launch::LaunchArgs),
    /// Register a worker in the registry (as the worker would).
    Register(worker::RegisterArgs),
    /// Move a worker's heartbeat to now.
    Heartbeat(worker::WorkerArgs),
    /// Give a worker's registration a historical status.
    Release(worker::WorkerArgs),
    /// Why one worker is kept or would be retired: evidence and every policy's verdict.
    Explain(explain::ExplainArgs),
    /// Who may snapshot, plan and apply, per profile; --against shows what an edit changes.
    Grants(grants::GrantsArgs),
    /// Validate, list or prove the policies.
    Policy(policy::PolicyArgs),
    /// Run policy regression fixtures (files or folders of JSON cases).
    Test(test::TestArgs),
    /// Make fixtures: capture rows of a real registry as a case.
    Fixture(fixture::FixtureArgs),
    /// Make a registry: `registry create` (a new SQLite file), `registry copy`
    /// (a SQLite registry onto PostgreSQL).
    Registry(registry::RegistryArgs),
    /// Print a completion script for a shell (e.g. `fleet-retire completions
    /// bash > /etc/bash_completion.d/fleet-retire`).
    Completions(CompletionsArgs),
    /// Print the man page (`fleet-retire man > fleet-retire.1`), or write
    /// every page, one per command, into a folder (`--dir DIR`).
    Man(completions::ManArgs),
}

/// The command line: the derived one, with each subcommand's `--format`
/// listing only the formats that subcommand writes (a global flag would
/// show every subcommand the root's whole list). A format given before the
/// subcommand (`fleet-retire --format junit plan`) is still read by the
/// root and refused by [`check_format`] with the commands that write it.
pub fn command() -> clap::Command {
    own_formats(<Cli as clap::CommandFactory>::command(), "")
}

/// Parse the process's arguments with [`command`].
pub fn parse() -> std::result::Result<Cli, clap::Error> {
    use clap::FromArgMatches;
    let mut command = command();
    let matches = command.try_get_matches_from_mut(std::env::args_os())?;
    Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut command))
}

/// `cmd`'s subcommands (named by `path`, their names from the root), each
/// given its own `--format`, recursively.
fn own_formats(mut cmd: clap::Command, path: &str) -> clap::Command {
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    for name in names {
        let path = format!("{path} {name}").trim_start().to_string();
        cmd = cmd.mut_subcommand(&name, |sc| own_formats(sc, &path).arg(format_arg(&path)));
    }
    cmd
}

/// The formats the subcommand at `path` writes, and whether its `--format`
/// is hidden (it writes for no reader that chooses: a transcript, a
/// protocol, a script).
fn formats_of(path: &str) -> (&'static [Format], bool) {
    use Format::{Human, Json, Junit, Lcov, MutationReport, Sarif};
    match path {
        "test" => (&[Human, Json, Junit, Lcov], false),
        "policy" => (&[Human, Json, Junit, Sarif, MutationReport], false),
        "policy validate" | "policy diff" | "grants" => (&[Human, Json, Sarif], false),
        "policy verify" => (&[Human, Json, Junit, Sarif], false),
        "policy mutate" => (&[Human, Json, Sarif, MutationReport], false),
        "demo" | "serve" | "completions" | "man" => (&[Human, Json], true),
        _ => (&[Human, Json], false),
    }
}

/// A subcommand's own `--format`: the same argument as the root's (its
/// value reaches `Cli::format`), with only its formats.
fn format_arg(path: &str) -> clap::Arg {
    use clap::builder::{PossibleValuesParser, TypedValueParser};
    let (formats, hidden) = formats_of(path);
    let values: Vec<clap::builder::PossibleValue> = formats
        .iter()
        .filter_map(ValueEnum::to_possible_value)
        .collect();
    clap::Arg::new("format")
        .long("format")
        .value_name("FORMAT")
        .help("Output format")
        .default_value("human")
        .hide(hidden)
        .value_parser(PossibleValuesParser::new(values).map(|name| {
            <Format as ValueEnum>::from_str(&name, false).expect("a format of the list")
        }))
}

/// Arguments of `completions`.
#[derive(Debug, Clone, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Where the registry and lease store are.
#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// The worker registry: a SQLite file, or a PostgreSQL database as
    /// postgres://USER@HOST:PORT/DATABASE (password in PGPASSWORD;
    /// docs/multi-host.md).
    #[arg(
        long,
        env = "FLEET_RETIRE_REGISTRY",
        hide_env_values = true,
        value_name = "PATH|URL"
    )]
    pub registry: PathBuf,
    /// The control-plane lease store (a SQLite file, or a postgres:// URL);
    /// required, never assumed empty.
    #[arg(
        long,
        env = "FLEET_RETIRE_LEASES",
        hide_env_values = true,
        value_name = "PATH|URL"
    )]
    pub leases: PathBuf,
    /// The expected repository binding, e.g. prgs/gitea-tools (required by
    /// plan; apply takes it from the saved plan when not given).
    #[arg(long, env = "FLEET_RETIRE_CANONICAL_REPOSITORY", value_name = "REPO",
          value_parser = crate::text::nonblank_repository)]
    pub canonical_repository: Option<String>,
    /// Root of the proc filesystem (boot id, process start times).
    #[arg(long, default_value = "/proc", value_name = "DIR", hide = true)]
    pub proc_root: PathBuf,
}

/// For a command line missing required arguments: the environment variable
/// each can come from, when it has one. A launcher sets them, so a person
/// starting `serve` by hand sees only the flags clap names otherwise.
pub fn missing_env_hint(e: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::MissingRequiredArgument {
        return None;
    }
    let Some(ContextValue::Strings(missing)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let command = <Cli as clap::CommandFactory>::command();
    let lines: Vec<String> = missing
        .iter()
        .filter_map(|m| {
            let long = m.trim_start_matches("--").split(' ').next().unwrap_or("");
            env_of(&command, long).map(|env| format!("  {m}: or set {env}"))
        })
        .collect();
    (!lines.is_empty()).then(|| {
        format!(
            "each of these may come from the environment instead:\n{}",
            lines.join("\n")
        )
    })
}

/// The environment variable of the flag `--long`, in `command` or any of
/// its subcommands (a flag's variable is the same wherever it appears).
fn env_of(command: &clap::Command, long: &str) -> Option<String> {
    command
        .get_arguments()
        .find(|a| a.get_long() == Some(long))
        .and_then(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .or_else(|| command.get_subcommands().find_map(|c| env_of(c, long)))
}

/// How much of a long list a human report shows (JSON always has all).
#[derive(Debug, Clone, Copy, Args)]
pub struct ListArgs {
    /// Human format: list every row, not only the first of each list.
    #[arg(long, conflicts_with = "limit")]
    pub all: bool,
    /// Human format: list the first N of each list (default 20).
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
}

impl ListArgs {
    /// The cap on each list: `None` for all.
    pub fn cap(&self) -> Option<usize> {
        (!self.all).then(|| self.limit.unwrap_or(crate::report::LIST_DEFAULT))
    }
}

/// Who is asking.
#[derive(Debug, Clone, Args)]
pub struct OperatorArgs {
    /// profiles.json, holding each profile's role and allowed operations.
    #[arg(long = "profiles", env = "GITEA_MCP_CONFIG", value_name = "PATH")]
    pub profiles_path: Option<PathBuf>,
    /// The operator's profile name.
    #[arg(long, env = "GITEA_MCP_PROFILE", value_name = "NAME")]
    pub profile: Option<String>,
}

impl OperatorArgs {
    /// The profiles file and profile name, or a refusal naming what is missing.
    pub fn given(
        &self,
        operation: crate::capability::Operation,
    ) -> Result<(&std::path::Path, &str)> {
        let path = self.profiles_path.as_ref().ok_or_else(|| {
            Error::Refused(format!(
                "{operation} refused: no profiles.json given; pass --profiles PATH (or set GITEA_MCP_CONFIG)"
            ))
        })?;
        let name = self.profile.as_ref().ok_or_else(|| {
            Error::Refused(format!(
                "{operation} refused: no operator profile given; pass --profile NAME (or set GITEA_MCP_PROFILE)"
            ))
        })?;
        Ok((path, name))
    }

    /// Refuse unless the capability policies allow `operation`.
    pub fn require(
        &self,
        policies: &Policies,
        operation: crate::capability::Operation,
    ) -> Result<Profiles> {
        let (path, name) = self.given(operation)?;
        let profiles = Profiles::load(path)?;
        let decision = check(policies, &profiles, name, operation)?;
        if !decision.allowed {
            return Err(Error::Refused(format!(
                "{operation} refused: {}",
                decision.explanation
            )));
        }
        Ok(profiles)
    }
}

impl Cli {
    /// Load the policy set this invocation uses.
    pub fn load_policies(&self) -> Result<Policies> {
        Policies::load(&self.policy_source())
    }

    /// Where the policies are read from: `--policies` (or
    /// `FLEET_RETIRE_POLICIES`), else the built-in set.
    pub fn policy_source(&self) -> PolicySource {
        match &self.policies {
            Some(dir) => PolicySource::Dir(dir.clone()),
            None => PolicySource::Embedded,
        }
    }
}

/// A SARIF log of `findings` on standard output.
pub fn print_sarif(rules: &[crate::sarif::Rule], findings: &[crate::sarif::Finding]) -> Result<()> {
    crate::outln!(
        "{}",
        serde_json::to_string_pretty(&crate::sarif::log(rules, findings))
            .expect("a log serialises")
    )
}

/// A standard format asked of a command that does not write it is an
/// error that says which commands do.
fn check_format(cli: &Cli) -> Result<()> {
    let writes_junit = match &cli.command {
        Command::Test(_) => true,
        Command::Policy(p) => matches!(p.command, policy::PolicyCommand::Verify { .. }),
        _ => false,
    };
    if cli.format == Format::Junit && !writes_junit {
        return Err(Error::input(
            About::Option("--format"),
            "--format junit is written by `fleet-retire test` and `fleet-retire policy verify`; \
             this command writes human or json",
        ));
    }
    let writes_sarif = match &cli.command {
        Command::Policy(p) => !matches!(
            p.command,
            policy::PolicyCommand::List | policy::PolicyCommand::Report(_)
        ),
        Command::Grants(_) => true,
        _ => false,
    };
    if cli.format == Format::Sarif && !writes_sarif {
        return Err(Error::input(
            About::Option("--format"),
            "--format sarif is written by `fleet-retire policy validate`, `policy verify`, \
             `policy mutate`, `policy diff` and `grants`; this command writes human or json",
        ));
    }
    let writes_mutants = matches!(&cli.command, Command::Policy(p) if matches!(
        p.command,
        policy::PolicyCommand::Mutate { .. }
    ));
    if cli.format == Format::MutationReport && !writes_mutants {
        return Err(Error::input(
            About::Option("--format"),
            "--format mutation-report is written by `fleet-retire policy mutate`; this command \
             writes human or json",
        ));
    }
    let writes_lcov = matches!(&cli.command, Command::Test(t) if t.coverage);
    if cli.format == Format::Lcov && !writes_lcov {
        return Err(Error::input(
            About::Option("--format"),
            "--format lcov is the coverage report of `fleet-retire test --coverage`; this \
             command writes human or json",
        ));
    }
    Ok(())
}

/// How this command logs: as JSON lines or text, and the level shown
/// when `FLEET_RETIRE_LOG` says nothing (a controller runs unattended, so
/// it says what each tick did).
pub fn log_style(cli: &Cli) -> (bool, &'static str) {
    match &cli.command {
        Command::Controller(a) => (a.log_format == controller::LogFormat::Json, "info"),
        // Warnings, and what a command says once at start (`serve`: where
        // it keeps plans).
        _ => (false, "warn,fleet_retire::start=info"),
    }
}

/// Run a parsed command line.
pub fn run(cli: Cli) -> Result<ExitCode> {
    check_format(&cli)?;
    match &cli.command {
        Command::Plan(args) => plan::run(&cli, args),
        Command::Apply(args) => apply::run(&cli, args),
        Command::Controller(args) => controller::run(&cli, args),
        Command::ApplyStatus(args) => apply_status::run(&cli, args),
        Command::Test(args) => test::run(&cli, args),
        Command::Fixture(args) => fixture::run(&cli, args),
        Command::Registry(args) => registry::run(&cli, args),
        Command::Snapshot(args) => snapshot::run(&cli, args),
        Command::Launch(args) => launch::run(&cli, args),
        Command::Serve(args) => serve::run(&cli, args),
        Command::Demo(args) => demo::run(&cli, args),
        Command::Policy(args) => policy::run(&cli, args),
        Command::Explain(args) => explain::run(&cli, args),
        Command::Grants(args) => grants::run(&cli, args),
        Command::Register(args) => worker::run_register(&cli, args),
        Command::Heartbeat(args) => worker::run_heartbeat(&cli, args),
        Command::Release(args) => worker::run_release(&cli, args),
        Command::Completions(args) => {
            crate::out!("{}", completions::script(args.shell))?;
            Ok(ExitCode::Ok)
        }
        Command::Man(args) => completions::man(args),
    }
}

#[cfg(test)]
mod tests {
    /// clap shows a variable's value beside its flag in `--help` unless
    /// told not to, and a store's variable may hold a URL with its password
    /// (docs/security.md, row 50.6): every flag a store variable fills
    /// hides its value.
    #[test]
    fn help_never_shows_a_store_variables_value() {
        fn walk(command: &clap::Command, found: &mut usize) {
            for arg in command.get_arguments() {
                let store = arg
                    .get_env()
                    .is_some_and(|e| e == "FLEET_RETIRE_REGISTRY" || e == "FLEET_RETIRE_LEASES");
                if store {
                    assert!(
                        arg.is_hide_env_values_set(),
                        "{} --{} shows its variable's value in --help",
                        command.get_name(),
                        arg.get_id()
                    );
                    *found += 1;
                }
            }
            for sub in command.get_subcommands() {
                walk(sub, found);
            }
        }
        let mut found = 0;
        walk(&<super::Cli as clap::CommandFactory>::command(), &mut found);
        assert!(found >= 15, "only {found} store flags found");
    }
}

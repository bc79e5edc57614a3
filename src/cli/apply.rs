//! `fleet-retire apply`: retire what a plan approved.

use crate::apply::{apply, Context, Hooks, Outcome, Request, Tokens, Workers};
use crate::cli::next::NextCommand;
use crate::cli::{Cli, Format, OperatorArgs, StoreArgs};
use crate::error::{About, Error, ExitCode, Result};
use crate::evidence::probe::SystemProbe;
use crate::text::Restated;
use clap::Args;
use serde_json::Value as Json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Arguments of `apply`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// A plan saved with `fleet-retire plan --out PLAN.json`.
    #[arg(value_name = "PLAN.json", conflicts_with_all = ["registry_fingerprint", "candidate_fingerprint", "policy_fingerprint"])]
    pub plan: Option<PathBuf>,
    /// The plan's registry_fingerprint.
    #[arg(long, requires_all = ["candidate_fingerprint", "policy_fingerprint", "workers"])]
    pub registry_fingerprint: Option<String>,
    /// The plan's candidate_fingerprint.
    #[arg(long)]
    pub candidate_fingerprint: Option<String>,
    /// The plan's policy_fingerprint.
    #[arg(long)]
    pub policy_fingerprint: Option<String>,
    /// Workers to retire: comma-separated, or a JSON list; `@FILE` reads
    /// either from FILE (one per line also works), for lists longer than a
    /// command line holds. With a saved plan: a subset of its candidates
    /// (refused if any is not one), for retiring a large plan in batches.
    #[arg(long)]
    pub workers: Option<String>,
    /// With a saved plan: retire only the first N of its candidates not
    /// retired yet, in the plan's order: one batch under --max-retire. Run
    /// the same command again for the next batch (one saved plan serves
    /// every batch), or use --all-batches.
    #[arg(long, value_name = "N", requires = "plan", conflicts_with = "workers",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub first: Option<u64>,
    /// With a saved plan: retire all its candidates, batch after batch
    /// (each of --first N, else --max-retire, in a transaction of its
    /// own), one line per batch; stops at the first refusal. Ctrl-C stops
    /// it between batches (a batch under way is committed whole or rolled
    /// back whole) and prints the command that continues.
    #[arg(long, requires = "plan", conflicts_with = "workers")]
    pub all_batches: bool,
    /// Retire nothing if more than this many workers would be retired.
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub max_retire: usize,
    /// How long to wait for a locked registry, in milliseconds (at most an hour).
    #[arg(long, default_value_t = 10_000, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    pub busy_timeout_ms: u64,
    /// Registry, leases, canonical repository.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Operator profile.
    #[command(flatten)]
    pub operator: OperatorArgs,
    /// How much of each list the human report shows.
    #[command(flatten)]
    pub list: crate::cli::ListArgs,
}

/// Read the apply request out of a saved plan: its head, as
/// [`PlanHead`](crate::plan::head::PlanHead) reads it, then checked.
pub fn request_from_plan(path: &Path) -> Result<Request> {
    let err = |m: String| {
        Error::input(
            About::File(path.to_path_buf()),
            format!("plan {}: {m}", path.display()),
        )
    };
    // A plan of a large registry is gigabytes of evidence apply never
    // reads: only the head and `planned_rows` are kept.
    let (doc, planned) = crate::jsonfile::read_selected::<crate::plan::planned::PlannedRows>(
        path,
        crate::plan::head::PlanHead::KEYS,
        "planned_rows",
    )
    .map_err(err)?;
    let head: crate::plan::head::PlanHead =
        crate::jsonfile::typed(Json::Object(doc)).map_err(|e| {
            err(format!(
                "{e}; is this a plan written by `fleet-retire plan --out`?"
            ))
        })?;
    let head = head.checked().map_err(err)?;
    let mut req = Request::new(
        Tokens {
            registry_fingerprint: head.registry_fingerprint,
            candidate_fingerprint: head.candidate_fingerprint,
            policy_fingerprint: head.policy_fingerprint,
        },
        head.workers,
    )
    .with_planned(planned.map(std::sync::Arc::new))
    .map_err(err)?;
    req.canonical_repository = head.canonical_repository;
    Ok(req)
}

/// The `--workers` value, or the file it names with `@FILE`.
fn workers_arg(given: &str) -> Result<Vec<String>> {
    let Some(file) = given.strip_prefix('@') else {
        return Workers::Text(given.to_string()).into_list();
    };
    let path = Path::new(file);
    let named = |e: &dyn std::fmt::Display| {
        Error::input(
            About::Option("--workers"),
            format!("--workers {}: {e}", path.display()),
        )
    };
    let bytes = crate::jsonfile::read_regular(path, crate::jsonfile::MAX_INPUT_BYTES)
        .map_err(|e| named(&e))?;
    Workers::Text(bytes.text).into_list().map_err(|e| named(&e))
}

/// The request the command line asks for: a saved plan, or the tokens and
/// workers given as options; with a saved plan, how many candidates it has.
fn request_of(args: &ApplyArgs) -> Result<(Request, Option<usize>)> {
    match (&args.plan, &args.registry_fingerprint) {
        (Some(path), _) => {
            let whole = request_from_plan(path)?;
            let candidates = whole.workers.len();
            Ok((batch_of(whole, args, path)?, Some(candidates)))
        }
        (None, Some(fp)) => Ok((
            Request::new(
                Tokens {
                    registry_fingerprint: fp.clone(),
                    candidate_fingerprint: args.candidate_fingerprint.clone().unwrap_or_default(),
                    policy_fingerprint: args.policy_fingerprint.clone().unwrap_or_default(),
                },
                workers_arg(args.workers.as_deref().unwrap_or(""))?,
            ),
            None,
        )),
        (None, None) => Err(Error::input(
            About::Option("apply"),
            "apply needs a saved plan (fleet-retire apply PLAN.json) or --registry-fingerprint, \
             --candidate-fingerprint, --policy-fingerprint and --workers",
        )),
    }
}

/// A saved plan's request cut to the batch asked for: `--first N` of its
/// candidates, or the `--workers` given, each of which must be one.
fn batch_of(mut req: Request, args: &ApplyArgs, plan: &Path) -> Result<Request> {
    if let Some(n) = args.first {
        // Every candidate stays in the request: the apply takes the first
        // N that are candidates now, passing over those an earlier batch of
        // this plan retired.
        req.first = Some(usize::try_from(n).unwrap_or(usize::MAX));
        return Ok(req);
    }
    let Some(given) = &args.workers else {
        return Ok(req);
    };
    let wanted = workers_arg(given)?;
    let candidates: std::collections::HashSet<&String> = req.workers.iter().collect();
    let strangers: Vec<String> = wanted
        .iter()
        .filter(|w| !candidates.contains(w))
        .map(|w| format!("{:?}", crate::text::esc(w)))
        .collect();
    if !strangers.is_empty() {
        return Err(Error::input(
            About::Option("--workers"),
            format!(
                "--workers names {} that {} not a candidate of the plan {}: {}; \
                 name candidates from its candidate_worker_identities, or plan again",
                strangers.len(),
                if strangers.len() == 1 { "is" } else { "are" },
                crate::text::esc(&plan.display().to_string()),
                strangers.join(", ")
            ),
        ));
    }
    req.workers = wanted;
    Ok(req)
}

/// The canonical repository: the plan's, which `--canonical-repository` may
/// restate; an operator may name it when the plan did not.
fn repository_of(req: &Request, given: Option<&str>) -> Result<String> {
    match crate::text::restated(req.canonical_repository.as_deref(), given) {
        Restated::Fixed(r) | Restated::GivenOnly(r) => Ok(r),
        Restated::Conflict { fixed, given } => Err(Error::Refused(format!(
            "the plan used canonical repository {fixed:?} but {given:?} was given; they must match"
        ))),
        Restated::Neither => Err(Error::input(
            About::Option("apply"),
            "apply needs the canonical repository the plan used: pass --canonical-repository",
        )),
    }
}

/// Run `apply`.
pub fn run(cli: &Cli, args: &ApplyArgs) -> Result<ExitCode> {
    let policies = cli.load_policies()?;
    let (profiles, profile) = args.operator.given(crate::capability::Operation::Apply)?;
    let (mut req, candidates) = request_of(args)?;
    req.max_retire = args.max_retire;
    req.canonical_repository = Some(repository_of(
        &req,
        args.store.canonical_repository.as_deref(),
    )?);
    let probe = SystemProbe::new(&args.store.proc_root);
    let ctx = Context {
        registry: &args.store.registry,
        leases: &args.store.leases,
        profiles,
        profile,
        proc_root: &args.store.proc_root,
        policies: &policies,
        probe: &probe,
        busy_timeout: Duration::from_millis(args.busy_timeout_ms),
    };
    if let (true, Some(plan)) = (args.all_batches, &args.plan) {
        return crate::cli::batches::run(cli, args, &req, &ctx, plan);
    }
    let spinner = crate::cli::progress::Spinner::start(
        "applying: judging the registry outside its lock, then retiring under it",
    );
    let report = apply(&req, &ctx, Hooks::default());
    drop(spinner);
    let mut report = report?;
    if let (Some(plan), Some(candidates)) = (&args.plan, candidates) {
        what_is_left(&mut report, candidates, cli, args, plan);
    }
    print_report(cli, args, &report);
    Ok(report.outcome.exit_code())
}

/// Of a saved plan's `candidates`, how many this apply leaves to retire,
/// when its outcome says (`None` after a refusal).
pub fn left_after(report: &crate::apply::Report, candidates: usize) -> Option<usize> {
    match report.outcome {
        Outcome::Applied => {
            Some(candidates.saturating_sub(report.retired_since_plan.len() + report.retired_count))
        }
        Outcome::AlreadyRetired
            if report.requested.len() == candidates || report.first.is_some() =>
        {
            Some(0)
        }
        _ => None,
    }
}

/// Say what is left of the plan after this apply, and the command for the
/// next batch: the same batch size, or every batch when this apply was
/// refused for asking too many at once.
fn what_is_left(
    report: &mut crate::apply::Report,
    candidates: usize,
    cli: &Cli,
    args: &ApplyArgs,
    plan: &Path,
) {
    report.left = left_after(report, candidates);
    let next = match (report.outcome, report.left) {
        (Outcome::Applied, Some(left)) if left > 0 && report.retired_count > 0 => {
            match args.first {
                Some(n) => Some(next_apply(cli, args, plan, &["--first", &n.to_string()])),
                None => Some(next_apply(cli, args, plan, &["--all-batches"])),
            }
        }
        (Outcome::BlastRadiusExceeded, _) => Some(next_apply(cli, args, plan, &["--all-batches"])),
        _ => None,
    };
    report.next_command = next.map(|c| c.to_string());
}

/// `fleet-retire apply PLAN` with the flags of this invocation that the
/// environment does not give already, then `tail`.
pub fn next_apply(cli: &Cli, args: &ApplyArgs, plan: &Path, tail: &[&str]) -> NextCommand {
    let mut c = NextCommand::new(&["apply"]);
    c.path(plan)
        .store("--registry", "FLEET_RETIRE_REGISTRY", &args.store.registry)
        .store("--leases", "FLEET_RETIRE_LEASES", &args.store.leases);
    let profiles = args
        .operator
        .profiles_path
        .as_ref()
        .map(|p| p.to_string_lossy());
    c.flag_opt("--profiles", Some("GITEA_MCP_CONFIG"), profiles.as_deref())
        .flag_opt(
            "--profile",
            Some("GITEA_MCP_PROFILE"),
            args.operator.profile.as_deref(),
        )
        .flag_opt(
            "--canonical-repository",
            Some("FLEET_RETIRE_CANONICAL_REPOSITORY"),
            args.store.canonical_repository.as_deref(),
        );
    let policies = cli.policies.as_ref().map(|p| p.to_string_lossy());
    c.flag_opt(
        "--policies",
        Some("FLEET_RETIRE_POLICIES"),
        policies.as_deref(),
    );
    if args.max_retire != 100 {
        c.word("--max-retire").word(&args.max_retire.to_string());
    }
    if args.busy_timeout_ms != 10_000 {
        c.word("--busy-timeout-ms")
            .word(&args.busy_timeout_ms.to_string());
    }
    for w in tail {
        c.word(w);
    }
    c
}

/// The report as JSON, with the `error` every non-zero exit carries
/// (README, "Output"): its kind, exit code, message, reason code and what
/// to do, beside the report's own fields.
fn with_error(report: &crate::apply::Report) -> serde_json::Value {
    let mut doc = serde_json::to_value(report).unwrap_or_default();
    let code = report.outcome.exit_code();
    if code != crate::error::ExitCode::Ok {
        doc["error"] = serde_json::json!({
            "kind": if code == crate::error::ExitCode::Refused { "refused" } else { "apply" },
            "exit_code": code as u8,
            "message": report.detail,
            "reason_code": report.outcome.code(),
            "what_to_do": report.outcome.what_to_do(),
        });
    }
    doc
}

/// Print an apply's report in the format asked. The exit code follows what
/// happened to the registry: a report that cannot be written (a closed
/// pipe, a full disk) is a warning, not a claim that the apply was rolled
/// back.
fn print_report(cli: &Cli, args: &ApplyArgs, report: &crate::apply::Report) {
    let stdout = std::io::stdout();
    let mut w = stdout.lock();
    let written = match cli.format {
        Format::Json => serde_json::to_writer_pretty(&mut w, &with_error(report))
            .map_err(std::io::Error::other)
            .and_then(|_| writeln!(w)),
        Format::Human | Format::Junit | Format::Lcov | Format::Sarif | Format::MutationReport => {
            write!(
                w,
                "{}",
                crate::report::apply_summary(report, args.list.cap())
            )
        }
    };
    if let Err(e) = written.and_then(|()| w.flush()) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!(
                "fleet-retire: warning: the apply report could not be written ({e}); {}",
                unwritten(report)
            );
        }
    }
}

/// What an apply whose report could not be written did, in one line: only
/// a committed retirement has audit rows to check.
pub fn unwritten(report: &crate::apply::Report) -> String {
    if report.mutation_performed {
        format!(
            "{} worker(s) were retired (outcome {}); the registry's retirement_audit table \
             holds one row for each",
            report.retired_count,
            report.outcome.code()
        )
    } else {
        format!(
            "nothing was retired (outcome {}): {}",
            report.outcome.code(),
            crate::text::esc(&report.detail)
        )
    }
}

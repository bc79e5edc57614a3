//! `fleet-retire apply`: retire what a plan approved.

use crate::apply::{apply, Context, Hooks, Outcome, Request, Tokens, Workers};
pub use crate::cli::apply_args::{left_after, next_apply, ApplyArgs};
use crate::cli::{Cli, Format};
use crate::error::{About, Error, ExitCode, Result};
use crate::evidence::probe::SystemProbe;
use crate::text::Restated;
use serde_json::Value as Json;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

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
    req.scope = head.scope;
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

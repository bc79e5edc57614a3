//! `fleet-retire apply PLAN --all-batches`: every batch of a saved plan, one
//! after the other.
//!
//! A plan of 15,723 candidates at the default blast radius of 100 took 158
//! hand-run `apply PLAN --first 100` (issue 52 §1). Here each batch is
//! exactly that apply: judged as any apply is, within the blast radius, in
//! a transaction of its own. The loop only chooses when to stop: when
//! nothing is left, when a batch retires nothing (what is left is no longer
//! a candidate), at the first refusal, or when interrupted. SIGINT or
//! SIGTERM is only noted; the batch under way is cancelled at its next
//! check (before its lock, before its first write, before COMMIT: rolled
//! back whole) or commits whole, and no batch starts after it. The last
//! line says what is left and the command that continues.

use crate::apply::{apply, Context, Hooks, Outcome, Report, Request};
use crate::cli::apply_args::{left_after, next_apply, ApplyArgs};
use crate::cli::{Cli, Format};
use crate::error::{ExitCode, Result};
use crate::text::count;
use serde::Serialize;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set by SIGINT or SIGTERM: no batch starts after it.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: nix::libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn catch_signals() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for signal in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe.
        let _ = unsafe { sigaction(signal, &action) };
    }
}

fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Why the batches stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Every candidate of the plan is retired.
    Done,
    /// A batch retired nothing: what is left is no longer a candidate.
    NothingRetirable,
    /// A signal: no batch after it (the one under way, if any, rolled back).
    Interrupted,
    /// A batch was refused (or failed): its outcome.
    Refused(Outcome),
}

/// One batch in the JSON document: its number, what it left, and its
/// report (without `retired_since_plan`, which grows with every batch:
/// its count is `retired_before`).
#[derive(Serialize)]
struct Batch {
    batch: usize,
    retired_before: usize,
    left: Option<usize>,
    #[serde(flatten)]
    report: Report,
}

/// The JSON document of `--all-batches`.
#[derive(Serialize)]
struct Batches {
    outcome: &'static str,
    success: bool,
    batch_size: usize,
    batches_run: usize,
    retired_count: usize,
    left: Option<usize>,
    next_command: Option<String>,
    detail: String,
    batches: Vec<Batch>,
    post_apply: Option<serde_json::Value>,
    residual: Option<crate::apply::residual::Residual>,
}

/// What `--all-batches` was asked: the command line, the saved plan at
/// `plan` and its request, the stores.
struct Run<'a> {
    cli: &'a Cli,
    args: &'a ApplyArgs,
    req: &'a Request,
    ctx: &'a Context<'a>,
    plan: &'a Path,
}

/// Run every batch of the plan at `plan`, whose request is `req`.
pub fn run(
    cli: &Cli,
    args: &ApplyArgs,
    req: &Request,
    ctx: &Context,
    plan: &Path,
) -> Result<ExitCode> {
    let run = Run {
        cli,
        args,
        req,
        ctx,
        plan,
    };
    catch_signals();
    let size = args
        .first
        .map_or(args.max_retire, |n| {
            usize::try_from(n).unwrap_or(usize::MAX)
        })
        .max(1);
    let started = std::time::Instant::now();
    let mut doc = Batches {
        outcome: Outcome::Applied.code(),
        success: true,
        batch_size: size,
        batches_run: 0,
        retired_count: 0,
        left: Some(req.workers.len()),
        next_command: None,
        detail: String::new(),
        batches: Vec::new(),
        post_apply: None,
        residual: None,
    };
    let stop = run_batches(cli, req, ctx, size, &mut doc)?;
    conclude(&run, stop, started, &mut doc)?;
    print(cli, args, &doc)?;
    Ok(match stop {
        Stop::Refused(outcome) => outcome.exit_code(),
        Stop::Done | Stop::NothingRetirable | Stop::Interrupted => ExitCode::Ok,
    })
}

/// The batches, until one of the reasons to stop; a progress line each.
fn run_batches(
    cli: &Cli,
    req: &Request,
    ctx: &Context,
    size: usize,
    doc: &mut Batches,
) -> Result<Stop> {
    let candidates = req.workers.len();
    let mut batch = req.clone();
    batch.first = Some(size);
    batch.skip_fleet_summary = true;
    loop {
        if interrupted() {
            return Ok(Stop::Interrupted);
        }
        let number = doc.batches.len() + 1;
        let mut report = apply(
            &batch,
            ctx,
            Hooks {
                cancelled: Some(&interrupted),
                ..Hooks::default()
            },
        )?;
        let left = left_after(&report, candidates);
        let stop = match report.outcome {
            _ if interrupted() && !report.mutation_performed => Some(Stop::Interrupted),
            Outcome::Applied if left == Some(0) => Some(Stop::Done),
            Outcome::Applied if report.retired_count == 0 => Some(Stop::NothingRetirable),
            Outcome::Applied => None,
            Outcome::AlreadyRetired => Some(Stop::Done),
            refused => Some(Stop::Refused(refused)),
        };
        doc.batches_run = number;
        doc.retired_count += report.retired_count;
        doc.left = left.or(doc.left);
        progress(cli, number, size, doc.left, &report, stop)?;
        let retired_before = std::mem::take(&mut report.retired_since_plan).len();
        doc.batches.push(Batch {
            batch: number,
            retired_before,
            left,
            report,
        });
        if let Some(stop) = stop {
            return Ok(stop);
        }
    }
}

/// One line for the batch just run: on stdout for a person, on stderr
/// beside the JSON document.
fn progress(
    cli: &Cli,
    number: usize,
    size: usize,
    left: Option<usize>,
    report: &Report,
    stop: Option<Stop>,
) -> Result<()> {
    let of = number + left.map_or(0, |l| l.div_ceil(size));
    let mut line = match stop {
        Some(Stop::Interrupted) => {
            format!("batch {number}: interrupted before it committed; nothing of it was retired")
        }
        Some(Stop::Refused(outcome)) => format!(
            "batch {number}: refused ({}): nothing of it was retired",
            outcome.code()
        ),
        _ => format!(
            "batch {number} of {of}: {} retired, {} left",
            count(report.retired_count),
            left.map_or("?".into(), count)
        ),
    };
    if !report.preserved.is_empty() && report.outcome == Outcome::Applied {
        line.push_str(&format!(
            " ({} requested kept: no longer candidates)",
            count(report.preserved.len())
        ));
    }
    match cli.format {
        Format::Json => {
            eprintln!("{line}");
            Ok(())
        }
        _ => crate::outln!("{line}"),
    }
}

/// Fill the document's ending: what happened, what is left, the command
/// that continues, and (when the plan is done or stuck) the fleet now.
fn conclude(run: &Run, stop: Stop, started: std::time::Instant, doc: &mut Batches) -> Result<()> {
    let left = doc.left.unwrap_or(0);
    let took = format!("{:.1} s", started.elapsed().as_secs_f64());
    let so_far = format!(
        "{} batch(es), {} retired in {took}",
        doc.batches_run,
        count(doc.retired_count)
    );
    let again = next_apply(run.cli, run.args, run.plan, &["--all-batches"]).to_string();
    doc.detail = match stop {
        Stop::Done => format!("{so_far}; none of the plan's candidates left"),
        Stop::NothingRetirable => format!(
            "{so_far}; {} of the plan's candidates left, none of them a candidate now (see the \
             last batch's `preserved`): plan again",
            count(left)
        ),
        Stop::Interrupted => {
            doc.outcome = "interrupted";
            doc.next_command = Some(again.clone());
            format!(
                "interrupted: {so_far}; {} of the plan's candidates left; continue with: {again}",
                count(left)
            )
        }
        Stop::Refused(outcome) => {
            doc.outcome = outcome.code();
            doc.success = false;
            doc.next_command = Some(again.clone());
            let why = doc
                .batches
                .last()
                .map(|b| crate::text::esc(&b.report.detail).into_owned())
                .unwrap_or_default();
            format!(
                "stopped at batch {} ({}): {why}. Before it: {so_far}; {} of the plan's \
                 candidates left. Once the cause is dealt with (a refusal that says \"plan \
                 again\" needs a new plan), continue with: {again}",
                doc.batches_run,
                outcome.code(),
                count(left)
            )
        }
    };
    if matches!(stop, Stop::Done | Stop::NothingRetirable) && doc.retired_count > 0 {
        fleet_now(run, doc)?;
    }
    Ok(())
}

/// The fleet after the last batch, from one fresh plan of the registry
/// (its rows, and why each stale one is kept): one read at the end rather
/// than a snapshot after every batch.
fn fleet_now(run: &Run, doc: &mut Batches) -> Result<()> {
    let (req, ctx) = (run.req, run.ctx);
    let now = crate::plan::plan_from_files(
        ctx.registry,
        ctx.leases,
        ctx.proc_root,
        req.canonical_repository.clone().unwrap_or_default(),
        ctx.policies,
    )?;
    let (summary, residual) = crate::apply::after_apply(
        req.canonical_repository.clone(),
        ctx.proc_root,
        ctx.probe,
        &now,
    );
    doc.post_apply = Some(summary);
    doc.residual = Some(residual);
    Ok(())
}

/// The document, or its closing lines for a person.
fn print(cli: &Cli, args: &ApplyArgs, doc: &Batches) -> Result<()> {
    if cli.format == Format::Json {
        let text = serde_json::to_string_pretty(doc).map_err(std::io::Error::other);
        return crate::outln!("{}", text.map_err(crate::error::Error::Output)?);
    }
    let mut out = String::new();
    if let Some(Batch { report, .. }) = doc
        .batches
        .last()
        .filter(|b| b.report.outcome != Outcome::Applied && doc.outcome != "interrupted")
    {
        out.push_str(&crate::report::apply_summary(report, args.list.cap()));
    }
    out.push_str(&doc.detail);
    out.push('\n');
    if let Some(p) = &doc.post_apply {
        out.push_str(&crate::report::after_summary(
            p,
            doc.residual.as_ref(),
            args.list.cap(),
        ));
    }
    crate::out!("{out}")
}

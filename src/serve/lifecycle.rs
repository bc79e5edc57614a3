//! The server as a worker: it registers its own row, heartbeats it while
//! it serves, and releases it when the client leaves or a signal arrives.

use super::{strict, Binding, FleetServer, Lifecycle};
use crate::error::{Error, ExitCode, Result};
use crate::worker::{heartbeat, identity_from_env, register, release, Registration, Writer};
use rmcp::ServiceExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How a served session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// The client closed stdin (or the session ended).
    Closed,
    /// SIGTERM or SIGINT.
    Signal,
    /// The server's own registration is no longer active.
    RegistrationLost,
}

/// How long a server that lost its registration keeps answering calls
/// (each with why it stops) before it closes the session: at least
/// [`STOP_GRACE`], and then until no call has been in flight or arrived for
/// [`STOP_QUIET`] (a client that reads why stops sending), for at most
/// [`STOP_LONGEST`] in all.
const STOP_GRACE: Duration = Duration::from_millis(1500);
/// See [`STOP_GRACE`].
const STOP_QUIET: Duration = Duration::from_millis(500);
/// See [`STOP_GRACE`].
const STOP_LONGEST: Duration = Duration::from_secs(30);

/// SIGTERM and SIGINT, as the serve loop waits for them.
type Signals = (tokio::signal::unix::Signal, tokio::signal::unix::Signal);

/// Register, serve on stdin/stdout until the client leaves or a signal
/// arrives, heartbeating all along, then release the registration.
pub fn run(binding: Binding, life: Lifecycle) -> Result<ExitCode> {
    crate::pool::limit_malloc_arenas();
    let registry = binding.registry.clone();
    let registration = Registration {
        worker_identity: identity_from_env(),
        namespace: life.namespace.clone(),
        role: None,
        pid: i64::from(std::process::id()),
        ttl_seconds: life.ttl_seconds,
        repository_binding: binding.canonical_repository.clone(),
        remote: None,
        transport: Some("stdio".into()),
        env: std::env::vars().collect(),
    };
    // The handlers are in place before the row is written: a SIGTERM or
    // SIGINT that arrives during or just after registration is held for the
    // serve loop, which releases the row, instead of killing the process with
    // its row left active.
    let (runtime, signals) = runtime_and_signals()?;
    let identity = register_patiently(&binding, &registration)?;
    tracing::info!("registered as worker {identity}");
    let server = FleetServer::new(binding)?;
    let stop = runtime.block_on(serve_until_stopped(
        server,
        registry.clone(),
        identity.clone(),
        life,
        signals,
    ));
    // A read of stdin may still be pending on a blocking thread; it cannot be
    // cancelled, so the runtime is let go rather than waited for.
    runtime.shutdown_background();
    match stop {
        Stop::RegistrationLost => Err(Error::Refused(format!(
            "worker {identity}'s registration is no longer active (retired or released by \
             someone else); this server stops rather than act unregistered"
        ))),
        Stop::Closed | Stop::Signal => {
            release(&registry, &identity, "released", Writer::Owner)?;
            tracing::info!("released worker {identity}");
            Ok(ExitCode::Ok)
        }
    }
}

/// The async runtime, and the SIGTERM and SIGINT handlers installed in it.
fn runtime_and_signals() -> Result<(tokio::runtime::Runtime, Signals)> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::Internal {
            doing: "cannot start the async runtime".into(),
            source: Box::new(e),
        })?;
    let signals = {
        let _inside = runtime.enter();
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(t), Ok(i)) => (t, i),
            (Err(e), _) | (_, Err(e)) => {
                return Err(Error::Internal {
                    doing: "cannot install the SIGTERM and SIGINT handlers".into(),
                    source: Box::new(e),
                })
            }
        }
    };
    Ok((runtime, signals))
}

/// Register the server's row; returns its identity. A fleet's workers
/// heartbeat into the same registry and SQLite's busy handler is not fair,
/// so a registration can lose the lock to them past its timeout. Only that
/// is retried, for up to a minute.
fn register_patiently(binding: &Binding, registration: &Registration) -> Result<String> {
    let started = std::time::Instant::now();
    loop {
        match register(&binding.registry, &binding.proc_root, registration) {
            Err(e) if e.is_lock_contention() && started.elapsed() < Duration::from_secs(60) => {
                tracing::warn!("registering: {e}; trying again");
                std::thread::sleep(Duration::from_millis(
                    100 + u64::from(std::process::id() % 400),
                ));
            }
            other => return Ok(other?.worker_identity),
        }
    }
}

async fn serve_until_stopped(
    server: FleetServer,
    registry: PathBuf,
    identity: String,
    life: Lifecycle,
    (mut term, mut int): Signals,
) -> Stop {
    let lost = Arc::new(tokio::sync::Notify::new());
    let handle = server.clone();
    let why_lost = format!(
        "this server's own registration ({identity}) is no longer active: it was retired or \
         released by someone else, and the server stops rather than act unregistered"
    );
    let beat = tokio::spawn(heartbeat_loop(
        registry,
        identity,
        life.interval,
        lost.clone(),
    ));
    let stop = tokio::select! {
        started = server.serve(strict::stdio()) => match started {
            Err(e) => {
                tracing::warn!("the MCP session did not start: {e}");
                Stop::Closed
            }
            Ok(running) => {
                let cancel = running.cancellation_token();
                // Pinned here, not in the select: a select drops the futures
                // of the arms it did not take, and dropping this one would
                // end the session at once, before the grace below.
                let waiting = running.waiting();
                tokio::pin!(waiting);
                tokio::select! {
                    _ = &mut waiting => Stop::Closed,
                    _ = term.recv() => { cancel.cancel(); Stop::Signal }
                    _ = int.recv() => { cancel.cancel(); Stop::Signal }
                    _ = lost.notified() => {
                        // Calls already queued are answered with why, not
                        // cut off by the end of the stream.
                        handle.stop(why_lost);
                        drained(&handle).await;
                        cancel.cancel();
                        Stop::RegistrationLost
                    }
                }
            }
        },
        _ = term.recv() => Stop::Signal,
        _ = int.recv() => Stop::Signal,
        _ = lost.notified() => Stop::RegistrationLost,
    };
    beat.abort();
    stop
}

/// Wait out [`STOP_GRACE`], then until the calls have been quiet for
/// [`STOP_QUIET`] (at most [`STOP_LONGEST`] in all).
async fn drained(server: &FleetServer) {
    let started = tokio::time::Instant::now();
    tokio::time::sleep(STOP_GRACE).await;
    let (mut seen, mut quiet_since) = (server.activity().1, tokio::time::Instant::now());
    while started.elapsed() < STOP_LONGEST {
        let (in_flight, arrived) = server.activity();
        if in_flight > 0 || arrived != seen {
            (seen, quiet_since) = (arrived, tokio::time::Instant::now());
        } else if quiet_since.elapsed() >= STOP_QUIET {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn heartbeat_loop(
    registry: PathBuf,
    identity: String,
    every: Duration,
    lost: Arc<tokio::sync::Notify>,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await; // the first tick is immediate; registration just wrote the stamp
    loop {
        ticks.tick().await;
        let (r, w) = (registry.clone(), identity.clone());
        match tokio::task::spawn_blocking(move || heartbeat(&r, &w, Writer::Owner)).await {
            Ok(Ok(_)) => {}
            Ok(Err(Error::Input { message: why, .. })) => {
                tracing::error!("heartbeat refused: {why}");
                lost.notify_one();
                return;
            }
            Ok(Err(e)) => tracing::warn!("heartbeat failed, will retry: {e}"),
            Err(e) => tracing::warn!("heartbeat task failed, will retry: {e}"),
        }
    }
}

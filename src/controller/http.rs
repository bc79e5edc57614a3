//! `/metrics`, `/livez` and `/readyz` (docs/controller.md), and the
//! signals: a small tokio runtime on a thread of its own, so the loop's
//! blocking work never delays a scrape, and SIGTERM or SIGINT only sets
//! the loop's stop flag (the loop finishes or rolls back its tick, releases
//! the lease and returns).

use super::metrics::Metrics;
use super::Health;
use crate::error::{About, Error, Result};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::routing::get;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What the handlers read.
#[derive(Clone)]
struct Shared {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    live_limit: Duration,
}

/// Install the signal handlers and, unless `listen` is `None`, bind it and
/// serve the endpoints, on a thread of their own; the address bound.
pub fn start(
    listen: Option<SocketAddr>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    live_limit: Duration,
    stop: Arc<AtomicBool>,
) -> Result<Option<SocketAddr>> {
    let internal = |what: &str, e: std::io::Error| Error::Internal {
        doing: format!("cannot {what}"),
        source: Box::new(e),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| internal("start the HTTP runtime", e))?;
    let (mut term, mut int) = {
        let _in = rt.enter();
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::terminate()).map_err(|e| internal("watch SIGTERM", e))?,
            signal(SignalKind::interrupt()).map_err(|e| internal("watch SIGINT", e))?,
        )
    };
    let listener = match listen {
        None => None,
        Some(addr) => Some(std::net::TcpListener::bind(addr).map_err(|e| {
            Error::input(
                About::Option("--listen"),
                format!("--listen {addr}: cannot listen there ({e}); pick a free address, or `--listen none`"),
            )
        })?),
    };
    let bound = listener.as_ref().and_then(|l| l.local_addr().ok());
    let shared = Shared {
        metrics,
        health,
        live_limit,
    };
    std::thread::spawn(move || {
        rt.block_on(async move {
            let server = async move {
                let Some(l) = listener else {
                    return std::future::pending::<()>().await;
                };
                let served = l
                    .set_nonblocking(true)
                    .and_then(|()| tokio::net::TcpListener::from_std(l));
                match served {
                    Ok(l) => {
                        if let Err(e) = axum::serve(l, router(shared)).await {
                            tracing::error!("the HTTP endpoints stopped: {e}");
                        }
                    }
                    Err(e) => tracing::error!("the HTTP endpoints cannot start: {e}"),
                }
            };
            let signals = async move {
                loop {
                    tokio::select! {
                        _ = term.recv() => tracing::info!("SIGTERM: stopping after this tick"),
                        _ = int.recv() => tracing::info!("SIGINT: stopping after this tick"),
                    }
                    stop.store(true, Ordering::SeqCst);
                }
            };
            tokio::join!(server, signals);
        });
    });
    Ok(bound)
}

fn router(shared: Shared) -> axum::Router {
    axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .with_state(shared)
}

/// OpenMetrics to a scraper that asks for it (Prometheus does), the
/// classic text format to any other.
async fn metrics(
    State(s): State<Shared>,
    headers: axum::http::HeaderMap,
) -> impl axum::response::IntoResponse {
    let open_metrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    if open_metrics {
        (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            s.metrics.encode(),
        )
    } else {
        (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            s.metrics.encode_classic(),
        )
    }
}

async fn livez(State(s): State<Shared>) -> (StatusCode, String) {
    answer(s.health.not_live(s.live_limit))
}

async fn readyz(State(s): State<Shared>) -> (StatusCode, String) {
    answer(s.health.not_ready())
}

fn answer(problem: Option<String>) -> (StatusCode, String) {
    match problem {
        None => (StatusCode::OK, "ok\n".into()),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

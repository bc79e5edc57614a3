//! Leadership: a thread that takes and renews the lease of this host every
//! retry period, by compare-and-set in the registry's database
//! (`store::seam::ControllerRows`), and says whether this process may act.
//!
//! It may act only while its last successful renewal began less than the
//! renew deadline ago (measured on the monotonic clock, from before the
//! renewal was sent, so the view here is never later than the lease's own
//! expiry): past it, nothing new starts, and an apply in flight is
//! cancelled at its next check and refused by the term check inside its
//! transaction anyway.

use crate::store::controller::{Acquired, Bucket};
use crate::store::seam::ControllerRows;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The lease's three durations (client-go's names and defaults).
#[derive(Debug, Clone, Copy)]
pub struct LeaseTimes {
    /// How long a lease lasts after its last renewal.
    pub ttl: Duration,
    /// How long after its last renewal a leader stops acting.
    pub renew_deadline: Duration,
    /// How often the lease is tried, and the change signal polled.
    pub retry: Duration,
}

impl LeaseTimes {
    /// The times, when ttl > renew deadline > 1.2 × retry period (so a
    /// leader stops acting before its lease can expire, and has more than
    /// one try to renew before it must stop).
    pub fn checked(self) -> std::result::Result<LeaseTimes, String> {
        if self.ttl > self.renew_deadline
            && self.renew_deadline.as_secs_f64() > 1.2 * self.retry.as_secs_f64()
        {
            Ok(self)
        } else {
            Err(format!(
                "--lease-ttl {:?}, --renew-deadline {:?} and --retry-period {:?} must satisfy \
                 ttl > renew deadline > 1.2 × retry period (the defaults are 15s, 10s, 2s)",
                self.ttl, self.renew_deadline, self.retry
            ))
        }
    }
}

#[derive(Default)]
struct State {
    /// The term held, with when its last successful renewal began.
    held: Option<(i64, Instant)>,
    /// The holder seen when another leads.
    other: Option<String>,
    /// The last failure to reach the lease, if the last try failed.
    failing: Option<String>,
}

struct Shared {
    state: Mutex<State>,
    stop: AtomicBool,
    deadline: Duration,
}

/// The lease of this host, kept by a thread of its own.
pub struct Leadership {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Who holds the lease and what this process does under it.
pub struct Holder {
    /// The lease's scope (this host).
    pub scope: String,
    /// This process's identity in the lease row.
    pub id: String,
}

impl Leadership {
    /// Start keeping the lease of `holder.scope` as `holder.id`.
    pub fn start(
        mut rows: Box<dyn ControllerRows>,
        holder: &Holder,
        times: LeaseTimes,
        bucket: Bucket,
    ) -> Leadership {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            stop: AtomicBool::new(false),
            deadline: times.renew_deadline,
        });
        let (scope, id) = (holder.scope.clone(), holder.id.clone());
        let inner = shared.clone();
        let thread = std::thread::spawn(move || {
            while !inner.stop.load(Ordering::SeqCst) {
                let began = Instant::now();
                let got = rows.acquire(&scope, &id, times.ttl, bucket);
                inner.note(got, began);
                sleep_unless(&inner.stop, times.retry.saturating_sub(began.elapsed()));
            }
            let term = inner.lock().held.take().map(|(t, _)| t);
            if let Some(term) = term {
                match rows.release(&scope, &id, term) {
                    Ok(_) => tracing::info!(term, "released the controller lease"),
                    Err(e) => tracing::warn!(
                        term,
                        "could not release the controller lease ({e}); it expires by itself"
                    ),
                }
            }
        });
        Leadership {
            shared,
            thread: Some(thread),
        }
    }

    /// The term this process may act under now, if any.
    pub fn leading(&self) -> Option<i64> {
        self.shared.leading()
    }

    /// A view of the lease for `/metrics` and `/readyz`, read when they
    /// are asked: the loop may be blocked (a frozen server) long past the
    /// renew deadline, and what it last set would still say it leads.
    pub fn view(&self) -> View {
        View(self.shared.clone())
    }

    /// The last term held (for the metric), and why the lease could not
    /// be reached on the last try, if it could not.
    pub fn status(&self) -> (Option<i64>, Option<String>) {
        let state = self.shared.lock();
        (state.held.map(|(t, _)| t), state.failing.clone())
    }

    /// Stop renewing and give the lease up (the thread ends within one
    /// try of the lease).
    pub fn release(mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
    }
}

/// The lease as [`Leadership`] holds it, read at any moment.
#[derive(Clone)]
pub struct View(Arc<Shared>);

impl View {
    /// Whether this process may act now (as [`Leadership::leading`]).
    pub fn leading(&self) -> bool {
        self.0.leading().is_some()
    }

    /// The term it holds, or held last while it could not renew.
    pub fn term(&self) -> Option<i64> {
        self.0.lock().held.map(|(t, _)| t)
    }

    /// Whether it holds a lease past its renew deadline.
    pub fn overdue(&self) -> bool {
        self.0.lock().held.is_some() && !self.leading()
    }
}

impl Shared {
    fn leading(&self) -> Option<i64> {
        self.lock()
            .held
            .filter(|(_, at)| at.elapsed() < self.deadline)
            .map(|(term, _)| term)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn note(&self, got: crate::error::Result<Acquired>, began: Instant) {
        let mut state = self.lock();
        match got {
            Ok(Acquired::Leading { term, .. }) => {
                if state.held.map(|(t, _)| t) != Some(term) {
                    tracing::info!(term, "leading: took the controller lease");
                }
                state.held = Some((term, began));
                state.other = None;
                state.failing = None;
            }
            Ok(Acquired::Following { holder, term }) => {
                if state.held.is_some() || state.other.as_deref() != Some(&holder) {
                    tracing::info!(term, holder = %holder, "following: another controller holds the lease");
                }
                state.held = None;
                state.other = Some(holder);
                state.failing = None;
            }
            // The lease could not be reached: what was held decays at the
            // renew deadline by itself.
            Err(e) => {
                tracing::warn!("cannot reach the controller lease: {e}");
                state.failing = Some(e.to_string());
            }
        }
    }
}

/// Sleep `d`, waking early when `stop` is set (checked every 50 ms).
pub fn sleep_unless(stop: &AtomicBool, d: Duration) {
    let until = Instant::now() + d;
    while !stop.load(Ordering::SeqCst) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

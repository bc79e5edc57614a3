//! What an operator watches (docs/controller.md, "Metrics"): one typed
//! registry, made once and handed to whoever records; the HTTP handler
//! only encodes it (`http.rs`). Names carry their unit and follow
//! Prometheus' conventions; the client appends `_total` to counters.

use super::lease::View;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;

/// A label set of one `outcome` label.
type Outcome = Vec<(String, String)>;

/// Every metric of the controller.
pub struct Metrics {
    registry: Registry,
    /// 1 while this process holds the lease.
    pub leader: Gauge,
    /// The term of the lease this process holds or last held.
    pub term: Gauge,
    /// Ticks, by how they ended.
    pub ticks: Family<Outcome, Counter>,
    /// Workers retired.
    pub retired: Counter,
    /// Workers a dry run would have retired.
    pub would_retire: Counter,
    /// Tokens left in the host's budget, as last read.
    pub budget_remaining: Gauge<f64, AtomicU64>,
    /// 1 while the brake is engaged.
    pub brake: Gauge,
    /// Candidates of the last plan.
    pub candidates: Gauge,
    /// How long each tick took.
    pub tick_duration: Histogram,
    /// Registry rows read by ticks and by the checks between them.
    pub rows_read: Counter,
    /// Registry rows the last tick read (its plan, and its apply under
    /// the lock).
    pub last_tick_rows_read: Gauge,
    /// Checks of the change signal, by what they found.
    pub checks: Family<Outcome, Counter>,
    /// When the last tick that saw everything ended (Unix seconds).
    pub last_success: Gauge<f64, AtomicU64>,
    /// The lease, read at every scrape for [`Metrics::leader`].
    lease: OnceLock<View>,
}

impl Metrics {
    /// A fresh set, registered.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let m = Metrics {
            leader: Gauge::default(),
            term: Gauge::default(),
            ticks: Family::default(),
            retired: Counter::default(),
            would_retire: Counter::default(),
            budget_remaining: Gauge::default(),
            brake: Gauge::default(),
            candidates: Gauge::default(),
            tick_duration: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            rows_read: Counter::default(),
            last_tick_rows_read: Gauge::default(),
            checks: Family::default(),
            last_success: Gauge::default(),
            lease: OnceLock::new(),
            registry: Registry::default(),
        };
        let p = "fleet_retire_controller";
        let r = &mut registry;
        r.register(
            format!("{p}_leader"),
            "1 while this process holds the controller lease of its host",
            m.leader.clone(),
        );
        r.register(
            format!("{p}_term"),
            "The term of the lease this process holds or last held",
            m.term.clone(),
        );
        r.register(format!("{p}_ticks"), "Ticks, by outcome", m.ticks.clone());
        r.register(
            format!("{p}_retired"),
            "Workers retired by this process",
            m.retired.clone(),
        );
        r.register(
            format!("{p}_would_retire"),
            "Workers a dry run would have retired",
            m.would_retire.clone(),
        );
        r.register(
            format!("{p}_budget_remaining"),
            "Retirements the host's budget allows now, as last read",
            m.budget_remaining.clone(),
        );
        r.register(
            format!("{p}_brake"),
            "1 while the brake holds back a mass retirement",
            m.brake.clone(),
        );
        r.register(
            format!("{p}_candidates"),
            "Candidates of the last plan",
            m.candidates.clone(),
        );
        r.register(
            format!("{p}_tick_duration_seconds"),
            "How long each tick took",
            m.tick_duration.clone(),
        );
        r.register(
            format!("{p}_rows_read"),
            "Registry rows read by ticks and by the checks of the change signal between them",
            m.rows_read.clone(),
        );
        r.register(
            format!("{p}_last_tick_rows_read"),
            "Registry rows the last tick read (its plan, and its apply under the lock)",
            m.last_tick_rows_read.clone(),
        );
        r.register(
            format!("{p}_checks"),
            "Checks of the registry's change signal between ticks, by what they found: quiet \
             (nothing changed), elsewhere (nothing of this host's scope), here (a tick is due)",
            m.checks.clone(),
        );
        r.register(
            format!("{p}_last_success_timestamp_seconds"),
            "When the last tick that saw everything ended",
            m.last_success.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Count a tick that ended with `outcome`.
    pub fn tick(&self, outcome: &str) {
        self.ticks
            .get_or_create(&vec![("outcome".to_string(), outcome.to_string())])
            .inc();
    }

    /// Count a check of the change signal.
    pub fn check(&self, found: &super::watch::Found) {
        let label = match found {
            super::watch::Found::Quiet => "quiet",
            super::watch::Found::Elsewhere => "elsewhere",
            super::watch::Found::Here(_) => "here",
        };
        self.checks
            .get_or_create(&vec![("found".to_string(), label.to_string())])
            .inc();
    }

    /// Read `lease` at every scrape: whether this process leads, and its
    /// term, are what it holds then, not what the loop last set (a loop blocked on a
    /// frozen server sets nothing past the renew deadline).
    pub fn watch_lease(&self, lease: View) {
        let _ = self.lease.set(lease);
    }

    /// The registry in the OpenMetrics text format (what Prometheus asks
    /// for first).
    pub fn encode(&self) -> String {
        if let Some(lease) = self.lease.get() {
            self.leader.set(i64::from(lease.leading()));
            if let Some(term) = lease.term() {
                self.term.set(term);
            }
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// The registry in Prometheus' classic text format (0.0.4), for a
    /// scraper that does not ask for OpenMetrics (`curl`, `promtool check
    /// metrics`).
    pub fn encode_classic(&self) -> String {
        classic(&self.encode())
    }
}

/// OpenMetrics text as Prometheus' classic text format: the two differ, for
/// what this registry holds, only in a counter's family name (OpenMetrics
/// names the family `x` and its sample `x_total`; the classic format names
/// both `x_total`) and the closing `# EOF`. The client writes only
/// OpenMetrics (prometheus/client_rust issue 51).
pub fn classic(open_metrics: &str) -> String {
    let counters: Vec<&str> = open_metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open_metrics.len() + 64);
    for line in open_metrics.lines() {
        if line == "# EOF" {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(&name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::super::lease::{Holder, Leadership, LeaseTimes};
    use crate::store::controller::{Acquired, Bucket, ChangesSince};
    use std::time::{Duration, Instant};

    /// A lease store that grants term 7 once, then answers no try for
    /// seconds (a frozen server).
    struct Frozen(usize);

    impl crate::store::seam::ControllerRows for Frozen {
        fn acquire(
            &mut self,
            _: &str,
            _: &str,
            _: Duration,
            _: Bucket,
        ) -> crate::error::Result<Acquired> {
            self.0 += 1;
            if self.0 > 1 {
                std::thread::sleep(Duration::from_secs(3));
                return Err(crate::error::Error::Refused("frozen".into()));
            }
            Ok(Acquired::Leading {
                term: 7,
                expires_at_ms: 0,
            })
        }
        fn release(&mut self, _: &str, _: &str, _: i64) -> crate::error::Result<bool> {
            Ok(false)
        }
        fn budget(&mut self, _: &str, _: Bucket) -> crate::error::Result<f64> {
            Ok(0.0)
        }
        fn changes(
            &mut self,
            _: Option<&str>,
            _: usize,
        ) -> crate::error::Result<Option<(String, ChangesSince)>> {
            Ok(None)
        }
    }

    /// While the lease cannot be renewed, `/metrics` stops saying this
    /// process leads at the renew deadline, and `/readyz` fails, though
    /// no loop set either (the loop is blocked too).
    #[test]
    fn past_the_renew_deadline_the_metrics_say_it_does_not_lead() {
        let times = LeaseTimes {
            ttl: Duration::from_millis(400),
            renew_deadline: Duration::from_millis(300),
            retry: Duration::from_millis(100),
        };
        let holder = Holder {
            scope: "host".into(),
            id: "host:1:x".into(),
        };
        let bucket = Bucket {
            capacity: 1.0,
            per_ms: 1,
        };
        let lease = Leadership::start(Box::new(Frozen(0)), &holder, times, bucket);
        let metrics = super::Metrics::new();
        metrics.watch_lease(lease.view());
        let health = super::super::Health::default();
        let _ = health.lease.set(lease.view());
        let leads = |v: i64| {
            let line = format!("fleet_retire_controller_leader {v}");
            metrics.encode().lines().any(|l| l == line)
        };
        let started = Instant::now();
        while lease.leading().is_none() {
            assert!(started.elapsed() < Duration::from_secs(2), "never led");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(leads(1));
        assert!(metrics
            .encode()
            .lines()
            .any(|l| l == "fleet_retire_controller_term 7"));
        assert_eq!(health.not_ready(), None);
        std::thread::sleep(Duration::from_millis(400));
        assert!(leads(0));
        assert!(health.not_ready().is_some());
    }

    #[test]
    fn the_classic_format_names_a_counters_family_as_its_samples() {
        let om = "# HELP a_ticks Ticks.\n# TYPE a_ticks counter\na_ticks_total{outcome=\"x\"} 1\n\
                  # HELP a_up Up.\n# TYPE a_up gauge\na_up 1\n# EOF\n";
        assert_eq!(
            super::classic(om),
            "# HELP a_ticks_total Ticks.\n# TYPE a_ticks_total counter\n\
             a_ticks_total{outcome=\"x\"} 1\n# HELP a_up Up.\n# TYPE a_up gauge\na_up 1\n"
        );
    }
}

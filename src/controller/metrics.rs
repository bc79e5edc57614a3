//! What an operator watches (docs/controller.md, "Metrics"): one typed
//! registry, made once and handed to whoever records; the HTTP handler
//! only encodes it (`http.rs`). Names carry their unit and follow
//! Prometheus' conventions; the client appends `_total` to counters.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

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

    /// The registry in the OpenMetrics text format (what Prometheus asks
    /// for first).
    pub fn encode(&self) -> String {
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

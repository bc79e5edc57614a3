//! Where does a plan's time go? `cargo run --release --example phase_timing -- REGISTRY LEASES`
use fleet_retire::evidence::leases::{self, Protections};
use fleet_retire::evidence::probe::{HostFacts, SystemProbe};
use fleet_retire::evidence::registry;
use fleet_retire::observe::{observe_all, RunFacts};
use fleet_retire::plan::plan;
use fleet_retire::policy::{Policies, PolicySource};
use std::path::Path;
use std::time::Instant;

fn rss() -> String {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .filter(|l| l.starts_with("VmHWM") || l.starts_with("VmRSS"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter("fleet_retire=debug")
        .init();
    let args: Vec<String> = std::env::args().collect();
    let (reg, lp) = (Path::new(&args[1]), Path::new(&args[2]));
    let policies = Policies::load(&PolicySource::Embedded).unwrap();
    let t = Instant::now();
    let rows = registry::load(reg).unwrap();
    let lease_rows = leases::load(lp).unwrap();
    println!("read {:?} {}", t.elapsed(), rss());
    let facts = RunFacts {
        now: fleet_retire::time::now(),
        host: HostFacts::observe(Path::new("/proc")),
        canonical_repository: Some("prgs/gitea-tools".into()),
        protections: Protections::from_leases(&lease_rows),
        active_leases: Vec::new(),
    };
    let probe = SystemProbe::new("/proc");
    let t = Instant::now();
    let obs = observe_all(&rows, &facts, &probe);
    println!("observe {:?} {}", t.elapsed(), rss());
    drop(obs);
    let t = Instant::now();
    let p = plan(rows, facts, &probe, &policies).unwrap();
    println!("plan (observe+judge+tokens) {:?} {}", t.elapsed(), rss());
    let t = Instant::now();
    let mut buf = Vec::new();
    p.write_json(&mut buf).unwrap();
    println!("write_json {:?} {} bytes {}", t.elapsed(), buf.len(), rss());
}

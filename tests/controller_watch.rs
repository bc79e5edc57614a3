//! What keeps `fleet-retire controller` from running away, and what an
//! operator watches (issue 53 §4, §5), with real processes: the budget
//! kept in the registry, the brake, a tick that cannot see, `/metrics`
//! `/livez` `/readyz` checked by promtool, the alert rules and the systemd
//! unit checked by their own tools.

mod common;

use common::controller::*;
use common::{text, KillOnDrop};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

/// The budget is kept in the registry (issue 53 §4): a controller allowed
/// 2 retirements an hour retires 2 of 4 dead workers, and a restart (a new
/// process, as after a crash or a failover) inherits the spent budget and
/// retires nothing more.
#[test]
fn the_budget_survives_a_restart() {
    let stores = stores();
    let mut workers: Vec<KillOnDrop> = (1..=4).map(|n| worker(&stores, n)).collect();
    kill_and_expire(&mut workers);
    let retired = || {
        (1..=4)
            .filter(|n| status(&stores.registry, &format!("w-{n}")).as_deref() == Some("retired"))
            .count()
    };
    let budget = ["--budget", "2/1h", "--log-format", "json"];
    let first = once(&stores, "controller-prgs", &budget);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first));
    assert_eq!(retired(), 2);
    let second = once(&stores, "controller-prgs", &budget);
    assert_eq!(second.status.code(), Some(0), "{}", text(&second));
    assert!(
        text(&second).contains("budget_exhausted"),
        "{}",
        text(&second)
    );
    assert_eq!(retired(), 2, "a restart reset the budget");
}

/// The brake (issue 53 §4): twelve workers of this host die at once; the
/// first tick retires none of them (more than half the host's active rows),
/// and they are retired only by a tick at least a heartbeat TTL (here one
/// second) later that finds them still dead.
#[test]
fn a_mass_death_engages_the_brake_until_a_ttl_later() {
    let stores = stores();
    let mut workers: Vec<KillOnDrop> = (1..=12).map(|n| worker(&stores, n)).collect();
    // Every heartbeat (TTL 1 s) expired, so all twelve are candidates at
    // once on the first tick.
    kill_and_expire(&mut workers);
    let c = Controller::start(&stores, "c", &[]);
    wait_for(Duration::from_secs(30), "the workers to be retired", || {
        (1..=12).all(|n| status(&stores.registry, &format!("w-{n}")).as_deref() == Some("retired"))
    });
    let outcomes: Vec<String> = c.outcomes().into_iter().filter(|o| o != "idle").collect();
    assert_eq!(
        outcomes.first().map(String::as_str),
        Some("braked"),
        "{outcomes:?}"
    );
    assert!(outcomes.contains(&"applied".to_string()), "{outcomes:?}");
}

/// "I cannot see" means "stop" (issue 53 §4): with a `/proc` whose
/// process table cannot be read (this host's name and boot id can), the
/// tick retires nothing and `--once` exits 1.
#[test]
fn a_tick_that_cannot_read_proc_retires_nothing() {
    let stores = stores();
    kill_and_expire(&mut [worker(&stores, 1)]);
    let fake = stores.dir.path().join("proc");
    for file in ["sys/kernel/hostname", "sys/kernel/random/boot_id"] {
        let to = fake.join(file);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(Path::new("/proc").join(file), &to).unwrap();
    }
    let fake = fake.display().to_string();
    let out = once(&stores, "controller-prgs", &["--proc-root", &fake]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("cannot see"), "{}", text(&out));
    assert_eq!(status(&stores.registry, "w-1").as_deref(), Some("active"));
}

/// What an operator watches (issue 53 §5): a running leader's `/metrics`
/// says it leads under the term the registry's lease row holds and counts
/// what it retired, in both formats; `promtool check metrics` accepts the
/// scrape; `/livez` and `/readyz` answer 200, and `/readyz` 503 once the
/// registry cannot be read.
#[test]
#[cfg_attr(
    not(fr_promtool),
    ignore = "needs promtool (apt-get install prometheus)"
)]
fn metrics_and_health_endpoints_tell_the_truth_and_promtool_accepts_them() {
    let stores = stores();
    let mut w = worker(&stores, 1);
    let (c, port) = start_listening(&stores, "m");
    w.0.kill().unwrap();
    w.0.wait().unwrap();
    let retired = std::panic::catch_unwind(|| {
        wait_for(Duration::from_secs(20), "the worker to be retired", || {
            status(&stores.registry, "w-1").as_deref() == Some("retired")
        })
    });
    assert!(
        retired.is_ok(),
        "{}",
        std::fs::read_to_string(&c.log).unwrap()
    );
    let (_, term) = leader(&stores.registry).unwrap();
    let (code, scrape) = get(port, "/metrics", None);
    assert_eq!(code, 200);
    assert_eq!(
        sample(&scrape, "fleet_retire_controller_leader"),
        Some(1.0),
        "{scrape}"
    );
    assert_eq!(
        sample(&scrape, "fleet_retire_controller_term"),
        Some(term as f64)
    );
    assert_eq!(
        sample(&scrape, "fleet_retire_controller_retired_total"),
        Some(1.0)
    );
    assert!(scrape.contains("# TYPE fleet_retire_controller_ticks_total counter"));
    let (_, om) = get(
        port,
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0"),
    );
    assert!(om.ends_with("# EOF\n"), "{om}");
    let mut promtool = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(scrape.as_bytes())
        .unwrap();
    let checked = promtool.wait_with_output().unwrap();
    assert!(checked.status.success(), "{}", text(&checked));
    assert_eq!(get(port, "/livez", None).0, 200);
    assert_eq!(get(port, "/readyz", None).0, 200);
    std::fs::rename(&stores.registry, stores.dir.path().join("moved.sqlite")).unwrap();
    wait_for(Duration::from_secs(20), "/readyz to fail", || {
        get(port, "/readyz", None).0 == 503
    });
}

/// The shipped alert rules pass `promtool check rules`.
#[test]
#[cfg_attr(
    not(fr_promtool),
    ignore = "needs promtool (apt-get install prometheus)"
)]
fn the_alert_rules_pass_promtool() {
    let rules =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/prometheus/fleet-retire-alerts.yml");
    let out = std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("SUCCESS: 5 rules found"),
        "{}",
        text(&out)
    );
}

/// The shipped systemd unit passes `systemd-analyze verify` (with the
/// binary this test built in place of /usr/local/bin/fleet-retire).
#[test]
#[cfg_attr(
    not(fr_systemd_analyze),
    ignore = "needs systemd-analyze (apt-get install systemd)"
)]
fn the_systemd_unit_passes_systemd_analyze() {
    let unit = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("contrib/systemd/fleet-retire-controller.service");
    let text_of = std::fs::read_to_string(unit).unwrap();
    assert!(text_of.contains("ProtectSystem=strict") && text_of.contains("NoNewPrivileges=yes"));
    let settings: Vec<&str> = text_of.lines().filter(|l| !l.starts_with('#')).collect();
    assert!(
        !settings
            .iter()
            .any(|l| l.starts_with("ProtectProc=") || l.starts_with("PrivatePIDs=")),
        "it must see other processes"
    );
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("fleet-retire-controller.service");
    std::fs::write(
        &copy,
        text_of.replace(
            "/usr/local/bin/fleet-retire",
            env!("CARGO_BIN_EXE_fleet-retire"),
        ),
    )
    .unwrap();
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
}

/// A real Prometheus (Debian's `prometheus`) scrapes a running leader
/// (negotiating OpenMetrics) with the shipped alert rules loaded, and its
/// query API answers `fleet_retire_controller_leader` 1 and the rules
/// loaded without error.
#[test]
#[cfg_attr(
    not(fr_prometheus),
    ignore = "needs prometheus (apt-get install prometheus)"
)]
fn a_real_prometheus_scrapes_the_leader() {
    let stores = stores();
    let (_c, port) = start_listening(&stores, "p");
    let listen = format!("127.0.0.1:{port}");
    wait_for(Duration::from_secs(20), "a leader", || {
        leader(&stores.registry).is_some()
    });
    let dir = stores.dir.path();
    let rules =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/prometheus/fleet-retire-alerts.yml");
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: fleet-retire\n    static_configs:\n      \
             - targets: ['{listen}']\n",
            rules.display()
        ),
    )
    .unwrap();
    let web = common::free_port();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let _prometheus = KillOnDrop(
        std::process::Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{web}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let answered = |path: &str| -> Option<serde_json::Value> {
        std::net::TcpStream::connect(("127.0.0.1", web)).ok()?;
        serde_json::from_str(&get(web, path, None).1).ok()
    };
    let leads = || {
        answered("/api/v1/query?query=fleet_retire_controller_leader")
            .is_some_and(|v| v["data"]["result"][0]["value"][1].as_str() == Some("1"))
    };
    let waited = std::panic::catch_unwind(|| {
        wait_for(
            Duration::from_secs(60),
            "Prometheus to scrape the leader",
            leads,
        )
    });
    assert!(
        waited.is_ok(),
        "{}",
        std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
    );
    let groups = answered("/api/v1/rules").unwrap();
    let group = &groups["data"]["groups"][0];
    assert_eq!(group["name"], "fleet-retire-controller", "{groups}");
    assert_eq!(group["rules"].as_array().unwrap().len(), 5);
    assert!(
        group["rules"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["health"] == "ok" || r["health"] == "unknown"),
        "{groups}"
    );
}

/// A tick is due when a kept row's heartbeat expires (issue 53 §3): with
/// an hour's resync interval and no write to announce it, a worker whose
/// process died while its heartbeat (TTL 3 s) was fresh is retired soon
/// after that heartbeat expires.
#[test]
fn a_tick_runs_when_a_kept_heartbeat_expires() {
    let stores = stores();
    let mut w = worker_with_ttl(&stores, 1, 3);
    let registered = std::time::Instant::now();
    let c = Controller::start(&stores, "e", &["--interval", "1h"]);
    let ticked = std::panic::catch_unwind(|| {
        wait_for(Duration::from_secs(10), "a first tick", || {
            c.outcomes().iter().any(|o| o == "idle")
        })
    });
    assert!(
        ticked.is_ok(),
        "{}",
        std::fs::read_to_string(&c.log).unwrap()
    );
    w.0.kill().unwrap();
    w.0.wait().unwrap();
    wait_for(Duration::from_secs(15), "the worker to be retired", || {
        status(&stores.registry, "w-1").as_deref() == Some("retired")
    });
    let took = registered.elapsed();
    eprintln!("retired {took:?} after registering with a 3 s TTL");
    assert!(took < Duration::from_secs(8), "{took:?}");
}

/// Attack (review of issue 53): the brake holds a mass death for a
/// heartbeat TTL (6 s here), and the host goes blind (its `/proc` cannot
/// be read) for longer than that. When it sees again, the held rows must
/// wait a full TTL more ("visibility regained restarts every grace
/// period", issue 53 §4): the workers could not be seen meanwhile either.
/// Before the fix the first tick that saw again retired them at once.
#[test]
fn a_brake_held_through_blindness_waits_a_full_ttl_after_sight_returns() {
    const WORKER_TTL: Duration = Duration::from_secs(6);
    let stores = stores();
    let mut workers: Vec<KillOnDrop> = (1..=12).map(|n| worker_with_ttl(&stores, n, 6)).collect();
    for w in &mut workers {
        w.0.kill().unwrap();
        w.0.wait().unwrap();
    }
    std::thread::sleep(WORKER_TTL + Duration::from_millis(200));
    // A `/proc` we can take away: a symlink swapped for a directory
    // holding only the host's name and boot id.
    let proc_root = stores.dir.path().join("proc");
    let blind = stores.dir.path().join("blind");
    for file in ["sys/kernel/hostname", "sys/kernel/random/boot_id"] {
        let to = blind.join(file);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(Path::new("/proc").join(file), &to).unwrap();
    }
    std::os::unix::fs::symlink("/proc", &proc_root).unwrap();
    let root = proc_root.display().to_string();
    let c = Controller::start(&stores, "c", &["--proc-root", &root]);
    wait_for(Duration::from_secs(10), "the brake", || {
        c.outcomes().iter().any(|o| o == "braked")
    });
    let swap = stores.dir.path().join("swap");
    std::os::unix::fs::symlink(&blind, &swap).unwrap();
    std::fs::rename(&swap, &proc_root).unwrap();
    std::thread::sleep(WORKER_TTL + Duration::from_secs(3));
    assert!(
        c.outcomes().iter().any(|o| o == "blind"),
        "{:?}",
        c.outcomes()
    );
    std::os::unix::fs::symlink("/proc", &swap).unwrap();
    std::fs::rename(&swap, &proc_root).unwrap();
    let regained = std::time::Instant::now();
    wait_for(Duration::from_secs(40), "the workers to be retired", || {
        (1..=12).all(|n| status(&stores.registry, &format!("w-{n}")).as_deref() == Some("retired"))
    });
    let after = regained.elapsed();
    let outcomes = c.outcomes();
    let last_blind = outcomes.iter().rposition(|o| o == "blind").unwrap();
    assert_eq!(
        outcomes[last_blind + 1],
        "braked",
        "the first tick that saw again retired ({after:?} after sight returned): {outcomes:?}"
    );
    assert!(after >= WORKER_TTL, "{after:?}: {outcomes:?}");
}

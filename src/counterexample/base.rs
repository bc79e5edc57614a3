//! The realistic row a counterexample starts from, and the plausible
//! values each attribute may take instead of the solver's.
//!
//! The row is what `fleet-retire test --export-cedar` writes for
//! `fixtures/plan/eligible-same-boot-dead-pid.json` (a worker that is dead
//! and stale on this host: its heartbeat an hour old with a 900 s TTL, its
//! pid gone, every count 1, stamps and ids of the shapes the program
//! measures), registered from this run's pid namespace. Its slot has one
//! claimant and no occupant: a dead row does not occupy its slot. The
//! operator is a controller holding read and retire. The built-in set
//! retires the row and lets the operator do everything
//! (`tests/policy_diff.rs` holds it to that).

use serde_json::{json, Value as Json};

/// The realistic entity of a type, keyed by its unqualified name (`Run`,
/// `Worker`, `Operator`), with the id a case gives it; `None` for a type
/// with no attributes to make plausible.
pub fn realistic(type_name: &str) -> Option<(&'static str, Json)> {
    let entity = match short(type_name) {
        "Run" => ("current", run()),
        "Worker" => ("row-0", worker()),
        "Operator" => ("controller-prgs", operator()),
        "Registry" => ("registry", json!({})),
        _ => return None,
    };
    Some(entity)
}

/// `FleetRetire::Worker` → `Worker`.
pub fn short(type_name: &str) -> &str {
    type_name.rsplit("::").next().unwrap_or(type_name)
}

/// A boot id of the kernel's shape (`/proc/sys/kernel/random/boot_id`).
const BOOT: &str = "8c1f4e2a-5b7d-4c3e-9a6f-1d2e3b4c5a69";
/// Another boot of the same host.
const OTHER_BOOT: &str = "3e9d0b6c-2a4f-4f18-8b5e-7c6a1d9f0e24";
/// The initial pid namespace, as `/proc/self/ns/pid` names it.
const NAMESPACE: &str = "pid:[4026531836]";
const INSTANCE: &str = "inst-codex-20260730T100000Z-abc123def456";

fn run() -> Json {
    json!({
        "boot_id": BOOT,
        "boot_id_known": true,
        "canonical_repository_given": true,
        "canonical_repository_key": "prgs/gitea-tools",
        "host_id": "build-01",
        "host_id_known": true,
        "lease_pids": [],
        "lease_session_ids": [],
        "lease_worker_identities": [],
        "pid_namespace": NAMESPACE,
    })
}

fn worker() -> Json {
    json!({
        "blank_fields": ["fleet_run_id", "live_revision", "loaded_revision", "parity_revision",
                         "process_identity", "retired_at", "retired_by", "retirement_reason",
                         "startup_revision"],
        "boot_id": BOOT,
        "client_instance_id": INSTANCE,
        "heartbeat_age_us": 3_600_000_000_i64,
        "heartbeat_parsed": true,
        "host_id": "build-01",
        "identity_row_count": 1,
        "instance_id_source": "launcher",
        "live_start_time": "",
        "pid": "4242",
        "pid_namespace": NAMESPACE,
        "pid_probe": "dead",
        "process_start_time": "ticks-100",
        "repository_binding": "prgs/gitea-tools",
        "repository_binding_key": "prgs/gitea-tools",
        "session_id": "sess-w-1",
        "shared_identity_evidence": [],
        "slot_active_claimants": 1,
        "slot_instance_key": INSTANCE,
        "slot_namespace_key": "author",
        "slot_occupants": 0,
        "status": "active",
        "ttl_number": true,
        "ttl_sign": 1,
        "ttl_us": 900_000_000_i64,
        "worker_identity": "w-1",
    })
}

fn operator() -> Json {
    json!({
        "exists": true,
        "well_formed": true,
        "role": "controller",
        "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"],
    })
}

/// Values an attribute may plausibly hold besides the realistic row's,
/// most ordinary first: tried in turn in place of a value the solver made
/// up, each kept only when the difference stays. For a set, the values of
/// its elements.
pub fn alternatives(type_name: &str, attr: &str) -> Vec<Json> {
    let texts = |v: &[&str]| v.iter().map(|s| Json::from(*s)).collect();
    let longs = |v: &[i64]| v.iter().map(|n| Json::from(*n)).collect();
    match (short(type_name), attr) {
        (_, "boot_id") => texts(&[BOOT, OTHER_BOOT, ""]),
        (_, "host_id") => texts(&["build-01", "build-02", ""]),
        (_, "pid_namespace") => texts(&[NAMESPACE, "pid:[4026532201]", ""]),
        ("Run", "canonical_repository_key") => texts(&["prgs/gitea-tools"]),
        ("Run", "lease_pids") | ("Worker", "pid") => texts(&["4242", "5151"]),
        ("Run", "lease_session_ids") | ("Worker", "session_id") => texts(&["sess-w-1", "sess-w-2"]),
        ("Run", "lease_worker_identities") | ("Worker", "worker_identity") => {
            texts(&["w-1", "w-2"])
        }
        ("Worker", "status") => texts(&["active", "retired", "released", "Active", ""]),
        ("Worker", "pid_probe") => texts(&["dead", "alive", "unknown"]),
        ("Worker", "instance_id_source") => texts(&["launcher", "pid_fallback", ""]),
        ("Worker", "live_start_time" | "process_start_time") => {
            texts(&["ticks-100", "ticks-200", ""])
        }
        ("Worker", "repository_binding" | "repository_binding_key") => texts(&[
            "prgs/gitea-tools",
            "prgs/gitea-tools/",
            "prgs/other-tools",
            "",
        ]),
        ("Worker", "client_instance_id" | "slot_instance_key") => {
            texts(&[INSTANCE, "inst-codex-20260730T090000Z-0123456789ab", ""])
        }
        ("Worker", "slot_namespace_key") => texts(&["author", "controller", ""]),
        ("Worker", "blank_fields") => texts(&["pid", "host_id", "boot_id", "session_id"]),
        ("Worker", "shared_identity_evidence") => texts(&[
            "session_id=sess-w-1",
            "pid=4242",
            "process_identity=pid-4242",
        ]),
        ("Worker", "identity_row_count" | "slot_active_claimants" | "slot_occupants") => {
            longs(&[1, 2, 0])
        }
        ("Worker", "ttl_sign") => longs(&[1, 0, -1]),
        ("Worker", "ttl_us") => longs(&[900_000_000, 60_000_000, 0]),
        ("Operator", "role") => texts(&["controller", "reconciler", "author", ""]),
        ("Operator", "allowed_operations") => {
            texts(&["gitea.read", "gitea.worker_registry.retire", "gitea.write"])
        }
        _ => Vec::new(),
    }
}

/// What an entity's attributes imply of others, as the program measures
/// them: a TTL of sign 0 is 0 µs, an unread heartbeat has age 0, a key is
/// its text without trailing `/`, a dead pid has no live start time. A
/// case whose deciding attributes were set alone is made consistent with
/// these where the difference allows.
pub fn implied(type_name: &str, attrs: &Json) -> Vec<(&'static str, Json)> {
    let mut out = Vec::new();
    if short(type_name) != "Worker" {
        return out;
    }
    let long = |k: &str| attrs[k].as_i64().unwrap_or(0);
    if attrs["ttl_number"] == false {
        out.push(("ttl_sign", Json::from(0)));
    }
    let sign = if attrs["ttl_number"] == false {
        0
    } else {
        long("ttl_sign")
    };
    let ttl = long("ttl_us");
    match sign {
        0 if ttl != 0 => out.push(("ttl_us", Json::from(0))),
        1 if ttl <= 0 => out.push(("ttl_us", Json::from(900_000_000_i64))),
        -1 if ttl >= 0 => out.push(("ttl_us", Json::from(-5_000_000_i64))),
        _ => {}
    }
    if attrs["heartbeat_parsed"] == false {
        out.push(("heartbeat_age_us", Json::from(0)));
    }
    if let Some(binding) = attrs["repository_binding"].as_str() {
        out.push((
            "repository_binding_key",
            Json::from(binding.trim_end_matches('/')),
        ));
    }
    if let Some(instance) = attrs["client_instance_id"].as_str() {
        out.push(("slot_instance_key", Json::from(instance)));
    }
    if attrs["pid_probe"] == "dead" {
        out.push(("live_start_time", Json::from("")));
    }
    out
}

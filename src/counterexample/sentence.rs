//! A counterexample in one sentence: who it is about, what its deciding
//! attributes hold, and what each side decides ("a worker whose heartbeat
//! is 91 s old with a 0 s TTL is retired by NEW and kept by OLD").

use super::base::short;
use serde_json::Value as Json;

/// `case` in one sentence: its subject with its deciding attributes, then
/// what `first` and `second` (a side's name and whether it allows) decide
/// of `action`.
pub fn say(case: &Json, deciding: &[String], first: (&str, bool), second: (&str, bool)) -> String {
    let action = case["request"]["action"]["id"].as_str().unwrap_or("");
    format!(
        "{} is {} by {} and {} by {}",
        subject(case, deciding),
        verb(action, first.1),
        first.0,
        verb(action, second.1),
        second.0
    )
}

/// `case` in one sentence, when it makes `policy` error.
pub fn say_error(case: &Json, deciding: &[String], policy: &str) -> String {
    format!(
        "{} makes policy {policy} error (Cedar skips a policy that errors)",
        subject(case, deciding)
    )
}

/// What a side does with the request, as a participle.
fn verb(action: &str, allows: bool) -> String {
    let counted = |what: &str| {
        if allows {
            format!("counted as {what}")
        } else {
            format!("not counted as {what}")
        }
    };
    match action {
        "retire" if allows => "retired".into(),
        "retire" => "kept".into(),
        "claim_instance_slot" => counted("claiming its slot"),
        "occupy_instance_slot" => counted("occupying its slot"),
        a if a.starts_with("hold_") => counted(&format!("holding its {}", &a[5..])),
        a if allows => format!("allowed to {a}"),
        a => format!("refused {a}"),
    }
}

/// The request's subject (the worker, or the operator) with a phrase per
/// deciding attribute; an ordinary one when none decides.
fn subject(case: &Json, deciding: &[String]) -> String {
    let entities = case["entities"].as_array().cloned().unwrap_or_default();
    let attrs = |kind: &str| {
        entities
            .iter()
            .find(|e| short(e["uid"]["type"].as_str().unwrap_or("")) == kind)
            .map(|e| e["attrs"].clone())
            .unwrap_or(Json::Null)
    };
    let worker = attrs("Worker");
    let resource = case["request"]["resource"]["type"].as_str().unwrap_or("");
    let (noun, ordinary) = if short(resource) == "Worker" {
        (
            "a worker",
            "an ordinary worker, dead and stale on this host,",
        )
    } else {
        (
            "an operator",
            "an ordinary controller holding gitea.read and gitea.worker_registry.retire",
        )
    };
    let phrases: Vec<String> = deciding
        .iter()
        .filter_map(|d| d.split_once('.'))
        .map(|(kind, attr)| phrase(kind, attr, &attrs(kind)[attr], &worker))
        .collect();
    match phrases.split_last() {
        None => ordinary.to_string(),
        Some((last, [])) => format!("{noun} {last}"),
        Some((last, rest)) => format!("{noun} {} and {last}", rest.join(", ")),
    }
}

/// Microseconds as seconds: `91 s`, `0.5 s`.
fn seconds(us: i64) -> String {
    let (whole, part) = (us / 1_000_000, (us % 1_000_000).abs());
    if part == 0 {
        return format!("{whole} s");
    }
    let sign = if us < 0 && whole == 0 { "-" } else { "" };
    let fraction = format!("{part:06}");
    format!("{sign}{whole}.{} s", fraction.trim_end_matches('0'))
}

/// A value as a sentence quotes it: a text in typographic quotes (so the
/// sentence reads the same in a fixture's JSON description, where a `"`
/// would be escaped), anything else as JSON writes it.
fn quoted(v: &Json) -> String {
    match v.as_str() {
        Some(text) => format!("“{text}”"),
        None => v.to_string(),
    }
}

/// A set's elements, quoted and joined.
fn listed(v: &Json) -> String {
    let items: Vec<String> = v.as_array().into_iter().flatten().map(quoted).collect();
    items.join(", ")
}

/// One deciding attribute in words.
fn phrase(kind: &str, attr: &str, v: &Json, worker: &Json) -> String {
    let text = v.as_str().unwrap_or("");
    let quoted = quoted(v);
    let long = v.as_i64().unwrap_or(0);
    let yes = v.as_bool().unwrap_or(false);
    let empty = v.as_array().is_some_and(Vec::is_empty);
    match (kind, attr) {
        ("Worker", "heartbeat_age_us") if long < 0 => {
            format!(
                "whose heartbeat is stamped {} in the future",
                seconds(-long)
            )
        }
        ("Worker", "heartbeat_age_us") => format!("whose heartbeat is {} old", seconds(long)),
        ("Worker", "ttl_us") => format!("with a {} TTL", seconds(long)),
        ("Worker", "heartbeat_parsed") if !yes => "whose heartbeat does not parse".into(),
        ("Worker", "ttl_number") if !yes => "whose TTL is not a number".into(),
        ("Worker", "ttl_sign") if long == 0 => "whose TTL is zero".into(),
        ("Worker", "ttl_sign") if long < 0 => "whose TTL is negative".into(),
        ("Worker", "ttl_sign") => "whose TTL is positive".into(),
        ("Worker", "pid_probe") => format!("whose pid probe answers {quoted}"),
        ("Worker", "status") => format!("whose status is {quoted}"),
        ("Worker", "identity_row_count") => format!("whose identity is on {long} row(s)"),
        ("Worker", "blank_fields") if empty => "with no field blank".into(),
        ("Worker", "blank_fields") => format!("with {} blank", listed(v)),
        ("Worker", "shared_identity_evidence") if !empty => {
            format!("sharing {} with a row that may be live", listed(v))
        }
        ("Worker", "slot_active_claimants") => {
            format!("whose slot has {long} active claimant(s)")
        }
        ("Worker", "slot_occupants") => format!("whose slot has {long} occupant(s)"),
        ("Worker", "live_start_time") if text.is_empty() => {
            "whose pid's process cannot be read".into()
        }
        ("Worker", "live_start_time") => {
            format!("whose pid now belongs to a process started at {quoted}")
        }
        ("Worker", "host_id") => format!("registered on host {quoted}"),
        ("Worker", "boot_id") => format!("registered in boot {quoted}"),
        ("Worker", "pid_namespace") => format!("registered from pid namespace {quoted}"),
        ("Run", "host_id_known") if !yes => "planned on a host whose name cannot be read".into(),
        ("Run", "boot_id_known") if !yes => "planned in a boot whose id cannot be read".into(),
        ("Run", "host_id") => format!("planned on host {quoted}"),
        ("Run", "boot_id") => format!("planned in boot {quoted}"),
        ("Run", "pid_namespace") => format!("planned from pid namespace {quoted}"),
        ("Run", "canonical_repository_given") if !yes => {
            "planned with no canonical repository given".into()
        }
        ("Run", "lease_pids" | "lease_session_ids" | "lease_worker_identities") => {
            leased(attr, v, worker)
        }
        ("Operator", "exists") if !yes => "not in profiles.json".into(),
        ("Operator", "well_formed") if !yes => "whose entry is malformed".into(),
        ("Operator", "role") => format!("whose role is {quoted}"),
        ("Operator", "allowed_operations") if empty => "allowed no operation".into(),
        ("Operator", "allowed_operations") => format!("allowed {}", listed(v)),
        _ => format!("with {attr} {quoted}"),
    }
}

/// A lease set: the worker's own value an active lease names, or which
/// values the leases name.
fn leased(attr: &str, v: &Json, worker: &Json) -> String {
    let (own, what) = match attr {
        "lease_pids" => ("pid", "pids"),
        "lease_session_ids" => ("session_id", "sessions"),
        _ => ("worker_identity", "worker identities"),
    };
    let mine = &worker[own];
    let items = v.as_array().cloned().unwrap_or_default();
    if items.contains(mine) {
        let noun = own.replace('_', " ");
        let value = mine.as_str().unwrap_or("");
        return format!("whose {noun} {value} an active lease names");
    }
    if items.is_empty() {
        return format!("while no active lease names any {what}");
    }
    format!("while active leases name the {what} {}", listed(v))
}

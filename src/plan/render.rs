//! The plan's rows as JSON text, fast: a large plan renders a hundred
//! thousand evidence blocks, and serde's derived serializer spent most of
//! its time escaping the same member names again for every row.
//!
//! The bytes are exactly what `serde_json::to_vec` gives for the derived
//! `Serialize` of [`Evidence`] (compact form, members in declaration
//! order): member names are written pre-rendered, strings are escaped only
//! when they hold a byte that JSON escapes, and numbers other than integers
//! go through serde_json itself. A test holds the two equal on every
//! fixture and on rows built to need escaping.

use crate::observe::{derived_process_identity, ProcessIdentityJson};
use crate::value::Val;

/// The evidence a verdict rests on (the seed's evidence keys, plus what
/// Cedar was shown). Defined beside [`evidence`], which writes the bytes
/// its derived `Serialize` gives.
#[derive(Debug, serde::Serialize)]
#[allow(missing_docs)]
pub struct Evidence<'a> {
    pub worker_identity: Val<'a>,
    pub client_type: &'static str,
    pub client_instance_id: Val<'a>,
    pub fleet_run_id: Val<'a>,
    pub namespace: Val<'a>,
    pub profile: Val<'a>,
    pub declared_role: Val<'a>,
    pub session_id: Val<'a>,
    pub generation_id: Val<'a>,
    pub fencing_epoch: Val<'a>,
    pub process_identity: ProcessIdentityJson<'a>,
    pub pid: Val<'a>,
    pub pid_alive: Option<bool>,
    pub live_process_start_time: Option<&'a str>,
    pub host_id: Val<'a>,
    pub boot_id: Val<'a>,
    pub process_start_time: Val<'a>,
    pub repository_binding: Val<'a>,
    pub foreign_repository: bool,
    pub status: Val<'a>,
    pub started_at: Val<'a>,
    pub last_heartbeat_at: Val<'a>,
    pub heartbeat_ttl_seconds: Val<'a>,
    pub canonical_heartbeat_ttl_seconds: f64,
    pub heartbeat_age_seconds: Option<f64>,
    pub heartbeat_fresh: Option<bool>,
    pub live: bool,
    pub ownership_state: &'static str,
    pub instance_id_provenance: &'static str,
    pub instance_identity_trusted: bool,
    pub identity_row_count: usize,
    pub shared_identity_evidence: &'a [String],
    pub instance_slot_contested: bool,
    pub protected_by_active_leases: &'a [String],
}

/// Append `s` as a JSON string.
fn string(out: &mut Vec<u8>, s: &str) {
    // serde_json escapes exactly the control characters, `"` and `\`.
    if needs_escape(s.as_bytes()) {
        serde_json::to_writer(&mut *out, s).expect("writing to memory cannot fail");
    } else {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    }
}

/// Whether `bytes` holds a byte JSON escapes (below 0x20, `"` or `\`),
/// eight bytes at a time: the plan writes about 100 MB of strings, almost
/// none of which need escaping.
fn needs_escape(bytes: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    // Some byte of `x` is below `n` (n <= 0x80): exact as a yes or no.
    let below = |x: u64, n: u8| x.wrapping_sub(ONES * u64::from(n)) & !x & HIGHS;
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let x = u64::from_ne_bytes(word.try_into().expect("eight bytes"));
        let hit = below(x, 0x20)
            | below(x ^ (ONES * u64::from(b'"')), 1)
            | below(x ^ (ONES * u64::from(b'\\')), 1);
        if hit != 0 {
            return true;
        }
    }
    words
        .remainder()
        .iter()
        .any(|&b| b < 0x20 || b == b'"' || b == b'\\')
}

fn boolean(out: &mut Vec<u8>, b: bool) {
    out.extend_from_slice(if b { b"true" } else { b"false" });
}

fn option_bool(out: &mut Vec<u8>, b: Option<bool>) {
    match b {
        Some(b) => boolean(out, b),
        None => out.extend_from_slice(b"null"),
    }
}

fn float(out: &mut Vec<u8>, f: f64) {
    serde_json::to_writer(&mut *out, &f).expect("writing to memory cannot fail");
}

fn integer(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// Append a registry value as its `Serialize` impl writes it.
pub fn value(out: &mut Vec<u8>, v: Val<'_>) {
    match v {
        Val::Null => out.extend_from_slice(b"null"),
        Val::Bool(b) => boolean(out, b),
        Val::Int(i) => integer(out, i),
        Val::Text(t) => string(out, t),
        other => serde_json::to_writer(&mut *out, &other).expect("writing to memory cannot fail"),
    }
}

fn strings(out: &mut Vec<u8>, items: &[String]) {
    out.push(b'[');
    for (i, s) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        string(out, s);
    }
    out.push(b']');
}

/// Append `e` as a JSON object.
pub fn evidence(out: &mut Vec<u8>, e: &Evidence<'_>) {
    // Each member's name with the punctuation before it.
    macro_rules! member {
        (first $name:literal) => {
            out.extend_from_slice(concat!("{\"", $name, "\":").as_bytes())
        };
        ($name:literal) => {
            out.extend_from_slice(concat!(",\"", $name, "\":").as_bytes())
        };
    }
    member!(first "worker_identity");
    value(out, e.worker_identity);
    member!("client_type");
    string(out, e.client_type);
    member!("client_instance_id");
    value(out, e.client_instance_id);
    member!("fleet_run_id");
    value(out, e.fleet_run_id);
    member!("namespace");
    value(out, e.namespace);
    member!("profile");
    value(out, e.profile);
    member!("declared_role");
    value(out, e.declared_role);
    member!("session_id");
    value(out, e.session_id);
    member!("generation_id");
    value(out, e.generation_id);
    member!("fencing_epoch");
    value(out, e.fencing_epoch);
    member!("process_identity");
    match e.process_identity {
        ProcessIdentityJson::Value(v) => value(out, v),
        ProcessIdentityJson::Pid(Val::Int(pid)) => {
            out.extend_from_slice(b"\"pid-");
            integer(out, pid);
            out.push(b'"');
        }
        ProcessIdentityJson::Pid(pid) => string(out, &derived_process_identity(pid)),
    }
    member!("pid");
    value(out, e.pid);
    member!("pid_alive");
    option_bool(out, e.pid_alive);
    member!("live_process_start_time");
    match e.live_process_start_time {
        Some(s) => string(out, s),
        None => out.extend_from_slice(b"null"),
    }
    member!("host_id");
    value(out, e.host_id);
    member!("boot_id");
    value(out, e.boot_id);
    member!("process_start_time");
    value(out, e.process_start_time);
    member!("repository_binding");
    value(out, e.repository_binding);
    member!("foreign_repository");
    boolean(out, e.foreign_repository);
    member!("status");
    value(out, e.status);
    member!("started_at");
    value(out, e.started_at);
    member!("last_heartbeat_at");
    value(out, e.last_heartbeat_at);
    member!("heartbeat_ttl_seconds");
    value(out, e.heartbeat_ttl_seconds);
    member!("canonical_heartbeat_ttl_seconds");
    float(out, e.canonical_heartbeat_ttl_seconds);
    member!("heartbeat_age_seconds");
    match e.heartbeat_age_seconds {
        Some(f) => float(out, f),
        None => out.extend_from_slice(b"null"),
    }
    member!("heartbeat_fresh");
    option_bool(out, e.heartbeat_fresh);
    member!("live");
    boolean(out, e.live);
    member!("ownership_state");
    string(out, e.ownership_state);
    member!("instance_id_provenance");
    string(out, e.instance_id_provenance);
    member!("instance_identity_trusted");
    boolean(out, e.instance_identity_trusted);
    member!("identity_row_count");
    integer(out, e.identity_row_count);
    member!("shared_identity_evidence");
    strings(out, e.shared_identity_evidence);
    member!("instance_slot_contested");
    boolean(out, e.instance_slot_contested);
    member!("protected_by_active_leases");
    strings(out, e.protected_by_active_leases);
    out.push(b'}');
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every ASCII byte at every place of strings up to 17 bytes long,
    /// beside characters of two to four bytes (whose bytes are all 0x80 or
    /// above and must not count): the word-at-a-time test answers as the
    /// byte-at-a-time one does, and the string is written as serde writes it.
    #[test]
    fn needs_escape_agrees_with_the_plain_test() {
        let plain = |s: &str| s.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\');
        for len in 0..=17 {
            for at in 0..len.max(1) {
                for byte in 0u8..=127 {
                    for filler in ["a", "é", "€", "𝄞", "\u{7f}"] {
                        let mut s: String = filler.repeat(len);
                        if len > 0 {
                            let mut chars: Vec<char> = s.chars().collect();
                            chars[at] = char::from(byte);
                            s = chars.into_iter().collect();
                        }
                        assert_eq!(needs_escape(s.as_bytes()), plain(&s), "{s:?}");
                        let mut out = Vec::new();
                        string(&mut out, &s);
                        assert_eq!(out, serde_json::to_vec(&s).unwrap(), "{s:?}");
                    }
                }
            }
        }
    }
}

//! Liveness (semantics §2), shared by the plan and the snapshot.
//!
//! A dead pid withdraws liveness; a live pid never grants it. A heartbeat
//! stamped in the future counts as fresh.

use crate::row::{Col, Row};
use crate::time::{parse_ts, Micros};
use crate::value::Value;

/// Default heartbeat TTL when the row's is unusable.
pub const DEFAULT_TTL_SECONDS: f64 = 900.0;

/// The liveness verdict for one row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Liveness {
    /// `status == "active"`, heartbeat fresh, pid not known dead.
    pub live: bool,
    /// `None` when `last_heartbeat_at` is unparsable.
    pub heartbeat_fresh: Option<bool>,
    /// Seconds since the heartbeat; `None` when unparsable.
    pub heartbeat_age_seconds: Option<f64>,
    /// The canonical TTL applied.
    pub heartbeat_ttl_seconds: f64,
    /// The pid probe's answer.
    pub pid_alive: Option<bool>,
}

/// Zero digits of Unicode's decimal-digit runs (category Nd, Unicode 14 as
/// in Python 3.11): Python's `\d` and `float()` accept all of them.
const ND_ZEROS: &[u32] = &[
    0x30, 0x660, 0x6F0, 0x7C0, 0x966, 0x9E6, 0xA66, 0xAE6, 0xB66, 0xBE6, 0xC66, 0xCE6, 0xD66,
    0xDE6, 0xE50, 0xED0, 0xF20, 0x1040, 0x1090, 0x17E0, 0x1810, 0x1946, 0x19D0, 0x1A80, 0x1A90,
    0x1B50, 0x1BB0, 0x1C40, 0x1C50, 0xA620, 0xA8D0, 0xA900, 0xA9D0, 0xA9F0, 0xAA50, 0xABF0, 0xFF10,
    0x104A0, 0x10D30, 0x11066, 0x110F0, 0x11136, 0x111D0, 0x112F0, 0x11450, 0x114D0, 0x11650,
    0x116C0, 0x11730, 0x118E0, 0x11950, 0x11C50, 0x11D50, 0x11DA0, 0x16A60, 0x16AC0, 0x16B50,
    0x1D7CE, 0x1D7D8, 0x1D7E2, 0x1D7EC, 0x1D7F6, 0x1E140, 0x1E2F0, 0x1E950, 0x1FBF0,
];

/// Python's reading of text as a number for the TTL: Unicode decimal digits
/// become ASCII, other characters stay (and fail the shape check).
fn ascii_digits(s: &str) -> String {
    s.chars()
        .map(|c| {
            let cp = c as u32;
            ND_ZEROS
                .iter()
                .find(|z| (**z..**z + 10).contains(&cp))
                .map(|z| char::from(b'0' + (cp - z) as u8))
                .unwrap_or(c)
        })
        .collect()
}

fn is_decimal_number(s: &str) -> bool {
    // [+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?  (after ascii_digits)
    let b = s.as_bytes();
    let mut i = 0;
    if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
        i += 1;
    }
    let int_start = i;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    let int_digits = i - int_start;
    let mut frac_digits = 0;
    if i < b.len() && b[i] == b'.' {
        i += 1;
        let f = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        frac_digits = i - f;
    }
    if int_digits == 0 && frac_digits == 0 {
        return false;
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        i += 1;
        if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
            i += 1;
        }
        let e = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == e {
            return false;
        }
    }
    i == b.len()
}

/// The canonical TTL: the row's when it is a finite number above zero
/// (integer, real, or wholly-decimal text; never a boolean), else 900.
pub fn canonical_ttl(v: &Value) -> f64 {
    let candidate = match v {
        Value::Int(i) => Some(*i as f64),
        Value::Real(f) => Some(*f),
        Value::Text(s) => {
            let ascii = ascii_digits(s);
            if is_decimal_number(&ascii) {
                ascii.parse::<f64>().ok()
            } else {
                None
            }
        }
        _ => None,
    };
    match candidate {
        Some(t) if t.is_finite() && t > 0.0 => t,
        _ => DEFAULT_TTL_SECONDS,
    }
}

/// Classify one row at `now` given its pid probe.
pub fn assess(row: &Row, now: Micros, pid_alive: Option<bool>) -> Liveness {
    let ttl = canonical_ttl(row.get(Col::HeartbeatTtlSeconds));
    let stamp = row.get(Col::LastHeartbeatAt).as_text().and_then(parse_ts);
    let age = stamp.map(|t| (now - t) as f64 / 1e6);
    let fresh = age.map(|a| a <= ttl);
    let active = row.get(Col::Status).as_text() == Some("active");
    Liveness {
        live: active && fresh == Some(true) && pid_alive != Some(false),
        heartbeat_fresh: fresh,
        heartbeat_age_seconds: age,
        heartbeat_ttl_seconds: ttl,
        pid_alive,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_accepts_numbers_and_decimal_text_only() {
        assert_eq!(canonical_ttl(&Value::Int(300)), 300.0);
        assert_eq!(canonical_ttl(&Value::Real(0.25)), 0.25);
        assert_eq!(canonical_ttl(&Value::Text("900".into())), 900.0);
        assert_eq!(canonical_ttl(&Value::Text("1e3".into())), 1000.0);
        assert_eq!(canonical_ttl(&Value::Text(".5".into())), 0.5);
        assert_eq!(canonical_ttl(&Value::Text("5.".into())), 5.0);
        // Python's \d and float() take any Unicode decimal digit.
        assert_eq!(
            canonical_ttl(&Value::Text("\u{663}\u{666}\u{660}\u{660}".into())),
            3600.0
        );
        assert_eq!(canonical_ttl(&Value::Text("\u{FF16}\u{FF10}".into())), 60.0);
        assert_eq!(
            canonical_ttl(&Value::Text("\u{B2}".into())),
            900.0,
            "superscript two is not Nd"
        );
        for bad in [
            " 900", "1_000", "inf", "nan", "", "0", "-5", "1e999", "e3", ".",
        ] {
            assert_eq!(canonical_ttl(&Value::Text(bad.into())), 900.0, "{bad:?}");
        }
        assert_eq!(canonical_ttl(&Value::Bool(true)), 900.0);
        assert_eq!(canonical_ttl(&Value::Int(0)), 900.0);
        assert_eq!(canonical_ttl(&Value::Real(f64::INFINITY)), 900.0);
        assert_eq!(canonical_ttl(&Value::Null), 900.0);
    }

    #[test]
    fn a_dead_pid_withdraws_liveness_and_a_live_one_never_grants_it() {
        let now = parse_ts("2026-07-30T12:00:00Z").unwrap();
        let mut row = Row::default();
        row.set(Col::Status, Value::Text("active".into()));
        row.set(
            Col::LastHeartbeatAt,
            Value::Text("2026-07-30T11:59:00Z".into()),
        );
        assert!(assess(&row, now, None).live);
        assert!(!assess(&row, now, Some(false)).live);
        row.set(
            Col::LastHeartbeatAt,
            Value::Text("2026-07-30T11:00:00Z".into()),
        );
        assert!(!assess(&row, now, Some(true)).live);
        // Exactly at the TTL boundary the heartbeat is still fresh.
        row.set(
            Col::LastHeartbeatAt,
            Value::Text("2026-07-30T11:45:00Z".into()),
        );
        assert_eq!(assess(&row, now, None).heartbeat_fresh, Some(true));
        // Future stamps are fresh.
        row.set(
            Col::LastHeartbeatAt,
            Value::Text("2026-07-31T00:00:00Z".into()),
        );
        assert_eq!(assess(&row, now, None).heartbeat_fresh, Some(true));
    }
}

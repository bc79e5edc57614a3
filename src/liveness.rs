//! Liveness (docs/semantics.md §2), shared by the plan and the snapshot.
//!
//! A dead pid withdraws liveness; a live pid never grants it. A heartbeat
//! stamped in the future counts as fresh.

use crate::row::{Col, Row};
use crate::time::{parse_ts, Micros};
use crate::value::Val;

/// Default heartbeat TTL when the row's is unusable.
pub const DEFAULT_TTL_SECONDS: f64 = 900.0;

/// The liveness verdict for one row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Liveness {
    /// `status == "active"`, heartbeat fresh, pid not known dead.
    pub live: bool,
    /// `None` when `last_heartbeat_at` is unparsable.
    pub heartbeat_fresh: Option<bool>,
    /// The canonical TTL applied.
    pub heartbeat_ttl_seconds: f64,
    /// The pid probe's answer.
    pub pid_alive: Option<bool>,
    /// Microseconds from the heartbeat to `assessed_at` (negative for a
    /// future stamp); `None` when unparsable. The entity builder reuses it
    /// rather than parsing the stamp a second time.
    pub heartbeat_age_us: Option<i64>,
    /// The clock this was assessed at.
    pub assessed_at: Micros,
}

fn is_decimal_number(s: &str) -> bool {
    // [+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?, ASCII digits only
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

/// `us / 1_000_000` as the nearest `f64` (ties to even): one rounding, as
/// Python's `timedelta.total_seconds()` does. Converting `us` to `f64` first
/// and then dividing rounds twice once `|us|` passes 2^53 (stamps about 285
/// years old), which can move an age across a TTL by one ulp.
pub fn micros_to_seconds(us: i64) -> f64 {
    const M: i128 = 1_000_000;
    let guess = us as f64 / 1e6;
    if us.unsigned_abs() < (1u64 << 53) {
        return guess; // exact conversion, then one correctly rounded division
    }
    // |c * 1e6 - us| exactly, all on one scale (times 2^19): here
    // 2^33 < |c| < 2^44, so c's exponent lies in -19..=-9 and no shift
    // overflows an i128.
    let error = |c: f64| -> (i128, bool) {
        let bits = c.to_bits();
        let exp = ((bits >> 52) & 0x7ff) as i32 - 1075;
        let mant = ((bits & ((1u64 << 52) - 1)) | (1u64 << 52)) as i128;
        let value = (if c < 0.0 { -mant } else { mant } * M) << (exp + 19);
        ((value - ((us as i128) << 19)).abs(), mant & 1 == 1)
    };
    let mut best = guess;
    let (mut best_err, mut best_odd) = error(guess);
    let bits = guess.to_bits();
    for c in [f64::from_bits(bits + 1), f64::from_bits(bits - 1)] {
        let (err, odd) = error(c);
        if err < best_err || (err == best_err && best_odd && !odd) {
            (best, best_err, best_odd) = (c, err, odd);
        }
    }
    best
}

/// A stored TTL as a number: an integer, a real, or wholly-decimal ASCII
/// text; never a boolean (docs/semantics.md §2).
fn stored_number(v: Val<'_>) -> Option<f64> {
    match v {
        Val::Int(i) => Some(i as f64),
        Val::Real(f) => Some(f),
        Val::Text(s) if is_decimal_number(s) => s.parse::<f64>().ok(),
        _ => None,
    }
}

/// The canonical TTL: the row's when it is a finite number above zero
/// (integer, real, or wholly-decimal text; never a boolean), else 900.
pub fn canonical_ttl(v: Val<'_>) -> f64 {
    match stored_number(v) {
        Some(t) if t.is_finite() && t > 0.0 => t,
        _ => DEFAULT_TTL_SECONDS,
    }
}

/// A stored TTL as Cedar reads it (`policies/schema.cedarschema`): whether
/// it is a number at all, its sign, and its value in whole microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TtlMeasure {
    /// An integer, a real, or text that is wholly an ASCII decimal number,
    /// and finite (docs/semantics.md §2); never a boolean.
    pub number: bool,
    /// The number's sign: -1, 0 or 1 (0 when not a number).
    pub sign: i64,
    /// The largest whole number of microseconds `a` for which an age of
    /// `a` microseconds, in seconds as Python computes it, is at most the
    /// TTL: so `age_us <= us` answers exactly what `age <= ttl` answers for
    /// every age. Saturates at the ends of the 64-bit range; 0 when not a
    /// number.
    pub us: i64,
}

/// Measure a stored TTL; the rules that turn it into the TTL a row is
/// judged by (the 900-second default, "greater than zero") are Cedar's.
pub fn measure_ttl(v: Val<'_>) -> TtlMeasure {
    match stored_number(v).filter(|t| t.is_finite()) {
        None => TtlMeasure {
            number: false,
            sign: 0,
            us: 0,
        },
        Some(t) => TtlMeasure {
            number: true,
            sign: if t > 0.0 {
                1
            } else if t < 0.0 {
                -1
            } else {
                0
            },
            us: seconds_to_age_bound(t),
        },
    }
}

/// The largest `a` with `micros_to_seconds(a) <= t` (`t` finite),
/// saturating: every age below `i64::MIN` or above `i64::MAX` is out of any
/// stamp's reach anyway.
fn seconds_to_age_bound(t: f64) -> i64 {
    let scaled = t * 1e6;
    if scaled >= i64::MAX as f64 {
        return i64::MAX;
    }
    if scaled <= i64::MIN as f64 {
        return i64::MIN;
    }
    // The guess is within a few microseconds; walk to the exact bound
    // (micros_to_seconds is monotonic).
    let mut a = scaled.floor() as i64;
    while a > i64::MIN && micros_to_seconds(a) > t {
        a -= 1;
    }
    while a < i64::MAX && micros_to_seconds(a + 1) <= t {
        a += 1;
    }
    a
}

/// Microseconds from the row's `last_heartbeat_at` to `now` (negative for a
/// stamp in the future), or `None` when the stamp is not strict RFC 3339
/// text (docs/semantics.md §1).
pub fn heartbeat_age_us(row: &Row, now: Micros) -> Option<i64> {
    row.get(Col::LastHeartbeatAt)
        .as_text()
        .and_then(parse_ts)
        .map(|t| now.saturating_sub(t))
}

impl Liveness {
    /// Seconds since the heartbeat, as Python computes them; `None` when
    /// the stamp is unparsable.
    pub fn heartbeat_age_seconds(&self) -> Option<f64> {
        self.heartbeat_age_us.map(micros_to_seconds)
    }
}

/// Classify one row at `now` given its pid probe.
pub fn assess(row: &Row, now: Micros, pid_alive: Option<bool>) -> Liveness {
    let ttl = canonical_ttl(row.get(Col::HeartbeatTtlSeconds));
    let stamp = row.get(Col::LastHeartbeatAt).as_text().and_then(parse_ts);
    let age_us = stamp.map(|t| now.saturating_sub(t));
    let fresh = age_us.map(|us| micros_to_seconds(us) <= ttl);
    let active = row.is_active();
    Liveness {
        live: active && fresh == Some(true) && pid_alive != Some(false),
        heartbeat_fresh: fresh,
        heartbeat_ttl_seconds: ttl,
        pid_alive,
        heartbeat_age_us: age_us,
        assessed_at: now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Value;

    /// The schema's statement of the TTL rule and the code agree: its
    /// grammar is the one `is_decimal_number` follows, and every example it
    /// gives is measured as it says.
    #[test]
    fn the_schema_states_the_ttl_rule_the_code_follows() {
        let schema = include_str!("../policies/schema.cedarschema");
        let line = |tag: &str| -> &str {
            schema
                .lines()
                .find_map(|l| l.trim().strip_prefix("//")?.trim().strip_prefix(tag))
                .unwrap_or_else(|| panic!("the schema has no {tag:?} line"))
                .trim()
        };
        let code = include_str!("liveness.rs");
        let grammar = line("grammar:");
        assert!(
            code.contains(&format!("// {grammar}, ASCII digits only")),
            "{grammar}"
        );
        let quoted = |l: &str| -> Vec<String> {
            l.split('"')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect()
        };
        let counts = quoted(line("counts:"));
        let not = quoted(line("does not count:"));
        assert!(counts.len() >= 8 && not.len() >= 8);
        for s in &counts {
            assert!(measure_ttl(Val::Text(s)).number, "{s:?} should count");
        }
        for s in &not {
            assert!(!measure_ttl(Val::Text(s)).number, "{s:?} should not count");
        }
    }

    #[test]
    fn ttl_accepts_numbers_and_decimal_text_only() {
        assert_eq!(canonical_ttl(Val::Int(300)), 300.0);
        assert_eq!(canonical_ttl(Val::Real(0.25)), 0.25);
        assert_eq!(canonical_ttl(Val::Text("900")), 900.0);
        assert_eq!(canonical_ttl(Val::Text("1e3")), 1000.0);
        assert_eq!(canonical_ttl(Val::Text(".5")), 0.5);
        assert_eq!(canonical_ttl(Val::Text("5.")), 5.0);
        // Digits of other scripts are not a number here (ASCII only).
        for other in [
            "\u{663}\u{666}\u{660}\u{660}",
            "\u{666}\u{660}",
            "\u{FF16}\u{FF10}",
            "\u{B2}",
        ] {
            assert_eq!(canonical_ttl(Val::Text(other)), 900.0, "{other:?}");
        }
        for bad in [
            " 900", "1_000", "inf", "nan", "", "0", "-5", "1e999", "e3", ".",
        ] {
            assert_eq!(canonical_ttl(Val::Text(bad)), 900.0, "{bad:?}");
        }
        assert_eq!(canonical_ttl(Val::Bool(true)), 900.0);
        assert_eq!(canonical_ttl(Val::Int(0)), 900.0);
        assert_eq!(canonical_ttl(Val::Real(f64::INFINITY)), 900.0);
        assert_eq!(canonical_ttl(Val::Null), 900.0);
    }

    /// The microsecond measurement answers `age <= ttl` exactly as the
    /// seconds do, for every TTL the fixtures hold and ages on either side
    /// of each bound; the rule "a number above zero, else 900" applied to
    /// the measurement gives the canonical TTL's answers.
    #[test]
    fn ttl_in_microseconds_keeps_every_comparison() {
        let ttls = [
            Value::Int(900),
            Value::Real(900.0),
            Value::Int(60),
            Value::Real(120.5),
            Value::Real(0.25),
            Value::Real(1e-5),
            Value::Real(5e-7),
            Value::Real(63921009599.99999),
            Value::Real(63921009599.99998),
            Value::Real(1e23),
            Value::Real(-0.0),
            Value::Int(0),
            Value::Int(-5),
            Value::Text("1e3".into()),
            Value::Text("1800.5".into()),
            Value::Text("-30".into()),
            Value::Text("abc".into()),
            Value::Bool(true),
            Value::Null,
        ];
        for v in &ttls {
            let m = measure_ttl(v.as_val());
            let canonical = canonical_ttl(v.as_val());
            // What the policies say: the row's TTL when a number above
            // zero, else 900 seconds.
            let judged = if m.number && m.sign > 0 {
                m.us
            } else {
                900_000_000
            };
            let bound = seconds_to_age_bound(canonical);
            for a in [
                bound.saturating_sub(2),
                bound.saturating_sub(1),
                bound,
                bound.saturating_add(1),
                bound.saturating_add(2),
                0,
                -1,
                1,
                899_999_999,
                900_000_000,
                900_000_001,
            ] {
                let seconds = micros_to_seconds(a) <= canonical;
                let micros = a < 0 || a <= judged;
                assert_eq!(seconds, micros, "{v:?} at {a} us");
            }
        }
    }

    #[test]
    fn heartbeat_age_is_rounded_once() {
        // Python's repr of us / 10**6 (int/int true division, as
        // total_seconds() computes it).
        for (us, python) in [
            (9_007_199_254_740_993_i64, 9_007_199_254.740993_f64),
            (31_556_889_864_403_199, 31_556_889_864.403_2),
            (-31_556_889_864_403_199, -31_556_889_864.403_2),
            (63_082_281_599_999_999, 63_082_281_600.0),
            (1_500_000, 1.5),
        ] {
            assert_eq!(micros_to_seconds(us), python, "{us}");
        }
        // A value where converting first, then dividing, rounds twice.
        let mut differs = 0;
        for k in 0..20_000_i64 {
            let us = (1_i64 << 55) + k * 7919;
            let once = micros_to_seconds(us);
            let exact = us as f64 / 1e6;
            if once != exact {
                differs += 1;
            }
        }
        // Counted with Python 3.11: `us / 10**6 != float(us) / 1e6` holds for
        // exactly 5241 of these.
        assert_eq!(differs, 5241);
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

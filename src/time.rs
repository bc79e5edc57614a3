//! Strict RFC 3339 stamps (docs/semantics.md §1), held as microseconds since the
//! Unix epoch in UTC.
//!
//! Parsing never guesses: anything outside the one accepted shape is
//! "unparsable", which the eligibility policies read as "preserve".

use chrono::{DateTime, NaiveDate, Utc};

/// Microseconds since 1970-01-01T00:00:00Z.
pub type Micros = i64;

/// Parse `YYYY-MM-DDTHH:MM:SS[.f+](Z|±HH:MM)`; `None` for anything else.
pub fn parse_ts(text: &str) -> Option<Micros> {
    let b = text.as_bytes();
    if b.len() < 20 {
        return None;
    }
    // At most four ASCII digits, so the value never overflows.
    let digits = |range: std::ops::Range<usize>| -> Option<u32> {
        b.get(range)?.iter().try_fold(0u32, |n, c| {
            c.is_ascii_digit().then(|| n * 10 + u32::from(c - b'0'))
        })
    };
    let year = digits(0..4)?;
    let month = digits(5..7)?;
    let day = digits(8..10)?;
    let hour = digits(11..13)?;
    let minute = digits(14..16)?;
    let second = digits(17..19)?;
    if b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let mut pos = 19;
    let mut micros: i64 = 0;
    if b[pos] == b'.' {
        pos += 1;
        let start = pos;
        while pos < b.len() && b[pos].is_ascii_digit() {
            pos += 1;
        }
        if pos == start {
            return None;
        }
        let mut frac = String::from_utf8_lossy(&b[start..pos.min(start + 6)]).into_owned();
        while frac.len() < 6 {
            frac.push('0');
        }
        micros = frac.parse().ok()?;
    }
    let offset_seconds: i64 = match &b[pos..] {
        [b'Z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let hh = digits(pos + 1..pos + 3)? as i64;
            let mm = digits(pos + 4..pos + 6)? as i64;
            let _ = (h1, h2, m1, m2);
            if hh >= 24 || mm >= 60 {
                return None;
            }
            let total = hh * 3600 + mm * 60;
            if *sign == b'-' {
                -total
            } else {
                total
            }
        }
        _ => return None,
    };
    if year == 0 {
        return None;
    }
    let date = NaiveDate::from_ymd_opt(year as i32, month, day)?;
    let naive = date.and_hms_opt(hour, minute, second)?;
    let utc_seconds = naive.and_utc().timestamp() - offset_seconds;
    // Python's datetime cannot leave years 1..=9999; such a stamp is unusable.
    let converted = DateTime::<Utc>::from_timestamp(utc_seconds, 0)?;
    let y = chrono::Datelike::year(&converted);
    if !(1..=9999).contains(&y) {
        return None;
    }
    Some(utc_seconds * 1_000_000 + micros)
}

/// Render as `YYYY-MM-DDTHH:MM:SSZ` (second precision, as the seed writes).
pub fn format_ts(t: Micros) -> String {
    DateTime::<Utc>::from_timestamp(t.div_euclid(1_000_000), 0)
        .map(|d| d.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// The current time from the system clock.
pub fn now() -> Micros {
    Utc::now().timestamp_micros()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_shapes() {
        let base = parse_ts("2026-07-30T12:00:00Z").unwrap();
        assert_eq!(base, 1_785_412_800 * 1_000_000);
        assert_eq!(parse_ts("2026-07-30T12:00:00.5Z"), Some(base + 500_000));
        assert_eq!(
            parse_ts("2026-07-30T12:00:00.1234567Z"),
            Some(base + 123_456)
        );
        assert_eq!(parse_ts("2026-07-30T14:00:00+02:00"), Some(base));
        assert_eq!(parse_ts("2026-07-30T11:30:00-00:30"), Some(base));
    }

    #[test]
    fn refuses_everything_else() {
        for bad in [
            "2026-07-30T12:00:00",
            "2026-07-30 12:00:00Z",
            "2026-07-30t12:00:00Z",
            "2026-07-30T12:00:00z",
            "2026-07-30T12:00:00+0200",
            "2026-07-30T12:00:00,5Z",
            "2026-07-30T12:00:00.Z",
            " 2026-07-30T12:00:00Z",
            "2026-07-30T12:00:00Z ",
            "2026-07-30T24:00:00Z",
            "2026-07-30T12:00:60Z",
            "2026-02-30T12:00:00Z",
            "2026-07-30T12:00:00+24:00",
            "",
            "1785412800",
            "２026-07-30T12:00:00Z",
            "-026-07-30T12:00:00Z",
            "2026-+7-30T12:00:00Z",
            "2026-07-30T1a:00:00Z",
            "2026-07-30T12:00:00+0a:00",
            "2026-07-30T12:00:00-01:6 ",
        ] {
            assert_eq!(parse_ts(bad), None, "{bad:?} must be unparsable");
        }
    }
}

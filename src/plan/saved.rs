//! The saved plan file (`plan --out`) and the on-disk form of a plan's rows
//! ([`PlannedRows`]): what apply needs, and nothing more.
//!
//! Apply reads a saved plan's head (its tokens and candidates) and
//! `planned_rows`, the rows the rule for rows beside the targets compares
//! (docs/semantics.md §13). The candidates are kept whole, with their
//! evidence, for the person who reviews them. A preserved row's verdict in
//! words and its evidence are read by nobody there (`plan --format json`
//! prints them): at 200,000 rows they made a 152 MB file that took 9.7 s to
//! write (issue 52 §1). So the saved plan lists no preserved rows, and each
//! planned row is one line:
//!
//! ```json
//! {"worker_identity":"w-author-7","digests":"<32 hex><32 hex>","verdict":2,"live":true}
//! ```
//!
//! `digests` is the row's two digests (every fingerprint field, then all but
//! the heartbeat: 128 bits each), `verdict` the place of its reason codes
//! in the list `verdicts` that precedes the rows (rows in one situation
//! share a list), `live` present only when true, and `peers` only for a
//! candidate. Plans saved before this form (`row_digest` and
//! `digest_without_heartbeat` as `sha256:` and 64 hex digits, `reason_codes`
//! per row) are still read: a digest's first 128 bits are the digest here.

use super::planned::{PlannedRow, PlannedRows};
use super::Plan;
use serde::de::Error as _;
use serde::ser::SerializeStruct;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;

impl Plan {
    /// The plan as a saved file for `apply`: the head, the candidates
    /// whole, and `planned_rows` (see the module's words).
    pub fn write_saved(&self, w: &mut dyn Write) -> std::io::Result<()> {
        let rows = PlannedRows::of(self);
        self.write_json_with(w, Some(&rows))
    }
}

/// Write `rows` as the value of `planned_rows`: the rows one a line,
/// rendered on every core.
pub(super) fn write_rows(rows: &PlannedRows, w: &mut dyn Write) -> std::io::Result<()> {
    let (table, index) = verdict_table(&rows.rows);
    write!(
        w,
        "{{\"registry_fingerprint\": {},\n\"verdicts\": {},\n\"rows\": [",
        serde_json::to_string(&rows.registry_fingerprint)?,
        serde_json::to_string(&table)?
    )?;
    let numbered: Vec<(usize, &PlannedRow)> = rows.rows.iter().enumerate().collect();
    let chunks: Vec<&[(usize, &PlannedRow)]> = numbered.chunks(4096).collect();
    let mut written = Ok(());
    crate::pool::par_map_ordered(
        &chunks,
        |chunk| {
            let mut out = Vec::with_capacity(chunk.len() * 160);
            for (n, row) in chunk.iter() {
                out.extend_from_slice(if *n == 0 { b"\n" } else { b",\n" });
                serde_json::to_writer(&mut out, &RowOut::of(row, index[*n]))
                    .expect("writing to memory cannot fail");
            }
            out
        },
        |text| {
            if written.is_ok() {
                written = w.write_all(&text);
            }
        },
    );
    written?;
    w.write_all(b"\n]}")
}

/// The distinct lists of reason codes, in the order rows first use them,
/// and each row's place in that list (`None`: not recorded).
fn verdict_table(rows: &[PlannedRow]) -> (Vec<&[String]>, Vec<Option<usize>>) {
    let mut table: Vec<&[String]> = Vec::new();
    let mut places: HashMap<&[String], usize> = HashMap::new();
    let index = rows
        .iter()
        .map(|r| {
            let codes = r.reason_codes.as_deref()?;
            Some(*places.entry(codes).or_insert_with(|| {
                table.push(codes);
                table.len() - 1
            }))
        })
        .collect();
    (table, index)
}

/// One planned row as written.
#[derive(Serialize)]
struct RowOut<'a> {
    worker_identity: &'a str,
    digests: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    verdict: Option<usize>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    live: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    peers: Option<&'a str>,
}

impl<'a> RowOut<'a> {
    fn of(row: &'a PlannedRow, verdict: Option<usize>) -> RowOut<'a> {
        RowOut {
            worker_identity: &row.worker_identity,
            digests: format!(
                "{:032x}{:032x}",
                row.row_digest, row.digest_without_heartbeat
            ),
            verdict,
            live: row.live,
            peers: row.peers.as_deref(),
        }
    }
}

impl Serialize for PlannedRows {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (table, index) = verdict_table(&self.rows);
        let rows: Vec<RowOut> = self
            .rows
            .iter()
            .zip(index)
            .map(|(r, v)| RowOut::of(r, v))
            .collect();
        let mut st = s.serialize_struct("PlannedRows", 3)?;
        st.serialize_field("registry_fingerprint", &self.registry_fingerprint)?;
        st.serialize_field("verdicts", &table)?;
        st.serialize_field("rows", &rows)?;
        st.end()
    }
}

/// `planned_rows` as read: this form or the one before it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RowsIn {
    registry_fingerprint: String,
    #[serde(default)]
    verdicts: Option<Vec<Vec<String>>>,
    rows: Vec<RowIn>,
}

/// One planned row as read. `digests` and `verdict` are this form's;
/// `row_digest`, `digest_without_heartbeat` and `reason_codes` the older
/// one's.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RowIn {
    worker_identity: String,
    #[serde(default)]
    digests: Option<String>,
    #[serde(default)]
    row_digest: Option<String>,
    #[serde(default)]
    digest_without_heartbeat: Option<String>,
    #[serde(default)]
    live: bool,
    #[serde(default)]
    verdict: Option<usize>,
    #[serde(default)]
    reason_codes: Option<Vec<String>>,
    #[serde(default)]
    peers: Option<String>,
}

impl<'de> Deserialize<'de> for PlannedRows {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let read = RowsIn::deserialize(d)?;
        let table: Vec<Arc<[String]>> = read
            .verdicts
            .unwrap_or_default()
            .into_iter()
            .map(Arc::from)
            .collect();
        let rows = read
            .rows
            .into_iter()
            .enumerate()
            .map(|(n, r)| r.checked(&table).map_err(|e| format!("rows[{n}]: {e}")))
            .collect::<Result<Vec<PlannedRow>, String>>()
            .map_err(D::Error::custom)?;
        Ok(PlannedRows {
            registry_fingerprint: read.registry_fingerprint,
            rows,
        })
    }
}

impl RowIn {
    /// The row, its digests and verdict found in whichever form it has.
    fn checked(self, table: &[Arc<[String]>]) -> Result<PlannedRow, String> {
        let (row_digest, digest_without_heartbeat) = match (
            &self.digests,
            &self.row_digest,
            &self.digest_without_heartbeat,
        ) {
            (Some(both), None, None) => both_digests(both)?,
            (None, Some(full), Some(quiet)) => (
                older_digest(full, "row_digest")?,
                older_digest(quiet, "digest_without_heartbeat")?,
            ),
            _ => {
                return Err("needs `digests` (or, in a plan saved by an older version, \
                            `row_digest` and `digest_without_heartbeat`), not both or neither; \
                            plan again with `fleet-retire plan --out`"
                    .into())
            }
        };
        let reason_codes = match (self.verdict, self.reason_codes) {
            (Some(_), Some(_)) => return Err("has both `verdict` and `reason_codes`".into()),
            (Some(at), None) => Some(table.get(at).cloned().ok_or_else(|| {
                format!(
                    "`verdict` {at} is not a place in `verdicts` (it has {})",
                    table.len()
                )
            })?),
            (None, codes) => codes.map(Arc::from),
        };
        Ok(PlannedRow {
            worker_identity: self.worker_identity,
            row_digest,
            digest_without_heartbeat,
            live: self.live,
            reason_codes,
            peers: self.peers,
        })
    }
}

/// `digests`: 64 lower-case hex digits, the two digests' 128 bits each.
fn both_digests(text: &str) -> Result<(u128, u128), String> {
    let hex = |part: &str| {
        (part.len() == 32 && part.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .then(|| u128::from_str_radix(part, 16).ok())
            .flatten()
    };
    match (text.get(..32).and_then(hex), text.get(32..).and_then(hex)) {
        (Some(full), Some(quiet)) => Ok((full, quiet)),
        _ => Err(format!(
            "`digests` must be 64 lower-case hex digits, not {:?}",
            crate::text::esc(text)
        )),
    }
}

/// An older plan's digest, `sha256:` and 64 hex digits: its first 128 bits.
fn older_digest(text: &str, key: &str) -> Result<u128, String> {
    text.strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .and_then(|h| u128::from_str_radix(&h[..32], 16).ok())
        .ok_or_else(|| {
            format!(
                "`{key}` must be `sha256:` and 64 hex digits, not {:?}",
                crate::text::esc(text)
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(identity: &str, codes: Option<&[&str]>, peers: Option<&str>) -> PlannedRow {
        PlannedRow {
            worker_identity: identity.into(),
            row_digest: 0x0123_4567_89ab_cdef_0011_2233_4455_6677,
            digest_without_heartbeat: u128::MAX - 7,
            live: identity.ends_with("live"),
            reason_codes: codes.map(|c| c.iter().map(|s| s.to_string()).collect()),
            peers: peers.map(str::to_string),
        }
    }

    fn sample() -> PlannedRows {
        PlannedRows {
            registry_fingerprint: "registryfp-0".into(),
            rows: vec![
                row("w-1", Some(&["eligible_stale_orphan"]), Some("p")),
                row("w-2-live", Some(&["worker_live", "pid_alive"]), None),
                row("w-3", Some(&["eligible_stale_orphan"]), Some("q")),
                row("w-4", None, None),
            ],
        }
    }

    /// Both writers (serde's, for `serve`'s kept plans, and the streamed
    /// one of a saved plan) give what the reader takes back, equal.
    #[test]
    fn both_writers_read_back_equal() {
        let rows = sample();
        let by_serde: PlannedRows =
            serde_json::from_str(&serde_json::to_string(&rows).unwrap()).unwrap();
        assert_eq!(by_serde, rows);
        let mut streamed = Vec::new();
        write_rows(&rows, &mut streamed).unwrap();
        let read: PlannedRows = serde_json::from_slice(&streamed).unwrap();
        assert_eq!(read, rows);
        let doc: serde_json::Value = serde_json::from_slice(&streamed).unwrap();
        assert_eq!(doc["verdicts"].as_array().unwrap().len(), 2);
        assert_eq!(doc["rows"][2]["verdict"], 0);
        assert!(doc["rows"][3].get("verdict").is_none());
    }

    /// A plan saved before this form is read: its digests' first 128 bits.
    #[test]
    fn the_older_form_is_read() {
        let older = serde_json::json!({"registry_fingerprint": "registryfp-0", "rows": [{
            "worker_identity": "w-1",
            "row_digest": format!("sha256:{:032x}{}", 5u128, "f".repeat(32)),
            "digest_without_heartbeat": format!("sha256:{:032x}{}", 6u128, "0".repeat(32)),
            "live": true, "reason_codes": ["worker_live"]}]});
        let read: PlannedRows = serde_json::from_value(older).unwrap();
        assert_eq!(read.rows[0].row_digest, 5);
        assert_eq!(read.rows[0].digest_without_heartbeat, 6);
        assert_eq!(
            read.rows[0].reason_codes.as_deref(),
            Some(&["worker_live".to_string()][..])
        );
    }

    /// A row without digests, a bad digest or a verdict out of the table
    /// is refused with its place and what to do.
    #[test]
    fn a_malformed_row_is_named() {
        let bad = |row: serde_json::Value| {
            let doc = serde_json::json!({"registry_fingerprint": "r", "verdicts": [["x"]],
                                         "rows": [row]});
            serde_json::from_value::<PlannedRows>(doc)
                .unwrap_err()
                .to_string()
        };
        let e = bad(serde_json::json!({"worker_identity": "w"}));
        assert!(e.contains("rows[0]: needs `digests`"), "{e}");
        let e = bad(serde_json::json!({"worker_identity": "w", "digests": "00"}));
        assert!(e.contains("64 lower-case hex digits"), "{e}");
        let e = bad(
            serde_json::json!({"worker_identity": "w", "digests": "0".repeat(64),
                                       "verdict": 3}),
        );
        assert!(e.contains("`verdict` 3 is not a place"), "{e}");
    }
}

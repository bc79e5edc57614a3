//! A kept plan's file: the plan's tokens, what made it, and its rows.
//!
//! Issue 52: a plan call through `serve` cost 1.41 times the command
//! line's `plan --format json` at 100,000 rows, and writing this file was
//! most of the difference: each row an object with its field names, every
//! row cloned before it was written, 8 KiB a write. Now each row is a JSON
//! array, `[worker_identity, row_digest, digest_without_heartbeat, live,
//! reason_codes, peers]` (each digest 32 hex digits, the 128 bits a plan
//! keeps), written straight from the plan kept in memory through a 1 MiB
//! buffer. The file
//! holds exactly what an apply by the next server reads ([`PlannedRows`]),
//! and about a third less of it. A file in any other shape (an older
//! server's) is not read: its apply plans again.

use super::made_by::MadeBy;
use crate::plan::planned::{PlannedRow, PlannedRows};
use serde::ser::{SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;

/// The shape of the files this server writes and reads.
const FORMAT: u32 = 3;

/// A plan's file as it is written: borrowed from the plan kept in memory.
#[derive(Serialize)]
pub(super) struct Writing<'a> {
    format: u32,
    registry_fingerprint: &'a str,
    candidate_fingerprint: &'a str,
    made_by: &'a MadeBy,
    rows: Rows<'a>,
}

impl<'a> Writing<'a> {
    /// The file of `rows`, planned under these tokens by `made_by`.
    pub(super) fn new(
        candidate_fingerprint: &'a str,
        made_by: &'a MadeBy,
        rows: &'a PlannedRows,
    ) -> Writing<'a> {
        Writing {
            format: FORMAT,
            registry_fingerprint: &rows.registry_fingerprint,
            candidate_fingerprint,
            made_by,
            rows: Rows(&rows.rows),
        }
    }
}

/// The rows, each written as an array.
struct Rows<'a>(&'a [PlannedRow]);

impl Serialize for Rows<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for r in self.0 {
            seq.serialize_element(&(
                &r.worker_identity,
                hex(r.row_digest),
                hex(r.digest_without_heartbeat),
                r.live,
                r.reason_codes.as_deref(),
                &r.peers,
            ))?;
        }
        seq.end()
    }
}

/// A digest as 32 hex digits.
fn hex(digest: u128) -> String {
    format!("{digest:032x}")
}

/// A digest read back: exactly 32 hex digits, else `None`.
fn unhex(text: &str) -> Option<u128> {
    let digits = text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit());
    digits.then(|| u128::from_str_radix(text, 16).ok())?
}

/// One row as the file holds it.
type Row = (
    String,
    String,
    String,
    bool,
    Option<Vec<String>>,
    Option<String>,
);

/// A plan's file as it is read.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Saved {
    format: u32,
    pub(super) registry_fingerprint: String,
    pub(super) candidate_fingerprint: String,
    pub(super) made_by: MadeBy,
    rows: Vec<Row>,
}

impl Saved {
    /// The planned rows it holds; `None` for a file of another shape.
    pub(super) fn into_rows(self) -> Option<PlannedRows> {
        if self.format != FORMAT {
            return None;
        }
        // Rows in one situation share one list of codes, as in the plan.
        let mut lists: HashMap<Vec<String>, Arc<[String]>> = HashMap::new();
        let mut rows = Vec::with_capacity(self.rows.len());
        for (worker_identity, full, quiet, live, codes, peers) in self.rows {
            rows.push(PlannedRow {
                worker_identity,
                row_digest: unhex(&full)?,
                digest_without_heartbeat: unhex(&quiet)?,
                live,
                reason_codes: codes.map(|c| {
                    lists
                        .entry(c)
                        .or_insert_with_key(|c| Arc::from(c.as_slice()))
                        .clone()
                }),
                peers,
            });
        }
        Some(PlannedRows {
            registry_fingerprint: self.registry_fingerprint,
            rows,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_come_back_as_they_were_written() {
        let row = |i: usize, candidate: bool| PlannedRow {
            worker_identity: format!("w-{i}"),
            row_digest: i as u128,
            digest_without_heartbeat: (i + 1000) as u128 | (7 << 120),
            live: i.is_multiple_of(2),
            reason_codes: (i != 3).then(|| {
                Arc::from(vec![if candidate {
                    "eligible_stale_orphan"
                } else {
                    "heartbeat_not_expired"
                }
                .to_string()])
            }),
            peers: candidate.then(|| {
                "slot_active_claimants=1 slot_occupants=0 shared_identity_evidence=[]".to_string()
            }),
        };
        let rows = PlannedRows {
            registry_fingerprint: "registryfp-00".into(),
            rows: (0..6).map(|i| row(i, i.is_multiple_of(3))).collect(),
        };
        let made_by = MadeBy {
            policy_fingerprint: "sha256:aa".into(),
            registry: "sqlite /r (device 1, inode 2)".into(),
            canonical_repository: "prgs/a".into(),
            profile: "controller-prgs".into(),
        };
        let text = serde_json::to_string(&Writing::new("candidatefp-00", &made_by, &rows)).unwrap();
        assert!(
            text.contains("\"070000000000000000000000000003e8\""),
            "a digest is 32 hex digits: {text}"
        );
        let saved: Saved = serde_json::from_str(&text).unwrap();
        assert_eq!(saved.candidate_fingerprint, "candidatefp-00");
        assert_eq!(saved.made_by, made_by);
        assert_eq!(saved.into_rows(), Some(rows));
    }

    #[test]
    fn a_file_of_another_shape_is_not_read() {
        let older = r#"{"registry_fingerprint": "registryfp-00", "candidate_fingerprint": "candidatefp-00",
            "made_by": {"policy_fingerprint": "p", "registry": "r", "canonical_repository": "c", "profile": "x"},
            "planned_rows": {"registry_fingerprint": "registryfp-00", "rows": []}}"#;
        assert!(serde_json::from_str::<Saved>(older).is_err());
        let later = older.replace(
            r#""planned_rows": {"registry_fingerprint": "registryfp-00", "rows": []}"#,
            r#""format": 2, "rows": []"#,
        );
        let saved: Saved = serde_json::from_str(&later).unwrap();
        assert_eq!(saved.into_rows(), None);
    }
}

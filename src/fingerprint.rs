//! The three compare-and-swap tokens, byte-compatible with the seed
//! (`registry_fingerprint`, `candidate_fingerprint`,
//! `external_state_fingerprint`). They are a contract with the original
//! system: the field lists, separators, version tags and prefixes here must
//! not change.

use crate::row::{Col, Row};
use crate::store::leases::{Lease, LeaseCol};
use sha2::{Digest, Sha256};

/// The registry-token field list, in contract order. `instance_id_source`,
/// `token_fingerprint`, the revisions and the `retired_*` columns are
/// deliberately absent (docs/semantics.md, pitfall 6).
pub const FINGERPRINT_FIELDS: &[Col] = &[
    Col::WorkerIdentity,
    Col::ClientName,
    Col::ClientInstanceId,
    Col::SessionId,
    Col::GenerationId,
    Col::Role,
    Col::Profile,
    Col::Namespace,
    Col::Remote,
    Col::RepositoryBinding,
    Col::Pid,
    Col::ProcessIdentity,
    Col::Transport,
    Col::StartedAt,
    Col::LastHeartbeatAt,
    Col::HeartbeatTtlSeconds,
    Col::FencingEpoch,
    Col::Status,
    Col::FleetRunId,
    Col::AuthenticatedAccount,
    Col::InstanceIdProvenance,
    Col::HostId,
    Col::BootId,
    Col::ProcessStartTime,
];

/// Lease fields that take part in the external-state token.
pub const LEASE_FENCE_FIELDS: &[LeaseCol] = &[
    LeaseCol::LeaseId,
    LeaseCol::Role,
    LeaseCol::Target,
    LeaseCol::Status,
    LeaseCol::SessionId,
    LeaseCol::OwnerSessionId,
    LeaseCol::OwnerPid,
    LeaseCol::SessionPid,
    LeaseCol::Generation,
];

const UNIT: char = '\u{1f}';
const RECORD: char = '\u{1e}';

/// The canonical serialization of one row (the unit the tokens sort and hash).
pub fn serialize_row(row: &Row) -> String {
    let mut out = String::with_capacity(640);
    serialize_row_into(row, &mut out);
    out
}

/// [`serialize_row`], appended to `out`.
pub fn serialize_row_into(row: &Row, out: &mut String) {
    for (col, label) in FINGERPRINT_FIELDS.iter().zip(field_labels()) {
        out.push_str(label);
        row.get(*col).write_canon(out);
    }
}

/// [`serialize_row_into`], returning where the value of column `marked`
/// lies in `out`: the row's text with that value cut out is
/// [`serialize_row_masking`]'s, so one serialization serves both.
pub fn serialize_row_marking(
    row: &Row,
    marked: crate::row::Col,
    out: &mut String,
) -> std::ops::Range<usize> {
    let mut at = out.len()..out.len();
    for (col, label) in FINGERPRINT_FIELDS.iter().zip(field_labels()) {
        out.push_str(label);
        let start = out.len();
        row.get(*col).write_canon(out);
        if *col == marked {
            at = start..out.len();
        }
    }
    at
}

/// [`serialize_row_into`] of the row with column `masked` set to null, without
/// copying the row.
pub fn serialize_row_masking(row: &Row, masked: crate::row::Col, out: &mut String) {
    for (col, label) in FINGERPRINT_FIELDS.iter().zip(field_labels()) {
        out.push_str(label);
        if *col != masked {
            row.get(*col).write_canon(out);
        }
    }
}

/// What precedes each field's value: `name=`, after a unit separator for
/// all but the first.
fn field_labels() -> &'static [String] {
    static LABELS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    LABELS.get_or_init(|| {
        FINGERPRINT_FIELDS
            .iter()
            .enumerate()
            .map(|(i, col)| {
                let sep = if i > 0 {
                    UNIT.to_string()
                } else {
                    String::new()
                };
                format!("{sep}{}=", col.name())
            })
            .collect()
    })
}

/// Rows in the order of their serializations, without writing them all
/// out. A serialization starts with the identity's key: `worker_identity=`,
/// the identity, a unit separator and `client_name=`. Where two keys differ
/// at a byte both have, that byte decides; where one key is the other or a
/// prefix of it (an identity may hold the separator itself), the whole
/// serializations are compared. The first 32 bytes of each key and its
/// length sit in the array being sorted, so most comparisons never leave it.
fn sorted_by_serialization(rows: Vec<&Row>) -> Vec<&Row> {
    debug_assert_eq!(FINGERPRINT_FIELDS[0], Col::WorkerIdentity);
    let next = format!("{UNIT}{}=", FINGERPRINT_FIELDS[1].name());
    let key = |row: &Row| -> Vec<u8> {
        let mut k = row.get(Col::WorkerIdentity).canon_cow().as_bytes().to_vec();
        k.extend_from_slice(next.as_bytes());
        k
    };
    // The prefix as four big-endian words: comparing words compares their
    // bytes in order, without a call to `memcmp`. As before, only the first
    // bytes both keys have are compared here.
    let mut order: Vec<([u64; 4], usize, u32)> = rows
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let canon = row.get(Col::WorkerIdentity).canon_cow();
            let (id, then) = (canon.as_bytes(), next.as_bytes());
            // The key's first 32 bytes (zeros past its end), copied in at
            // most two pieces.
            let mut p = [0u8; 32];
            let from_id = id.len().min(32);
            p[..from_id].copy_from_slice(&id[..from_id]);
            let from_then = then.len().min(32 - from_id);
            p[from_id..from_id + from_then].copy_from_slice(&then[..from_then]);
            let len = id.len() + then.len();
            let word =
                |w: usize| u64::from_be_bytes(p[w * 8..w * 8 + 8].try_into().expect("8 bytes"));
            ([word(0), word(1), word(2), word(3)], len, i as u32)
        })
        .collect();
    let whole = |i: u32| serialize_row(rows[i as usize]);
    order.sort_unstable_by(|a, b| {
        let m = a.1.min(b.1).min(32);
        if m == 32 {
            match a.0.cmp(&b.0) {
                std::cmp::Ordering::Equal => {}
                decided => return decided,
            }
        } else {
            // Compare the first `m` bytes only: whole words, then the top
            // bytes of the word the shorter key ends in.
            let (full, rest) = (m / 8, m % 8);
            match a.0[..full].cmp(&b.0[..full]) {
                std::cmp::Ordering::Equal => {}
                decided => return decided,
            }
            if rest > 0 {
                let shift = 64 - 8 * rest as u32;
                match (a.0[full] >> shift).cmp(&(b.0[full] >> shift)) {
                    std::cmp::Ordering::Equal => {}
                    decided => return decided,
                }
            }
        }
        if m == 32 {
            let (ka, kb) = (key(rows[a.2 as usize]), key(rows[b.2 as usize]));
            let m = ka.len().min(kb.len());
            match ka[..m].cmp(&kb[..m]) {
                std::cmp::Ordering::Equal => {}
                decided => return decided,
            }
        }
        whole(a.2).cmp(&whole(b.2))
    });
    order
        .into_iter()
        .map(|(_, _, i)| rows[i as usize])
        .collect()
}

/// The seed's digest over rows' serializations (sorted), each written
/// into one reused buffer as it is hashed.
fn digest_rows(version: &str, rows: Vec<&Row>, prefix: &str) -> String {
    let rows = sorted_by_serialization(rows);
    let mut hasher = digest_start(version, rows.len());
    let mut unit = String::with_capacity(1024);
    for row in rows {
        unit.clear();
        unit.push(RECORD);
        serialize_row_into(row, &mut unit);
        hasher.update(unit.as_bytes());
    }
    digest_finish(hasher, prefix)
}

/// A row digest's hasher after its head: the version tag, a record
/// separator and the number of units.
fn digest_start(version: &str, count: usize) -> Sha256 {
    let mut h = Sha256::new();
    h.update(version.as_bytes());
    h.update(RECORD.to_string().as_bytes());
    h.update(count.to_string().as_bytes());
    h
}

/// `prefix-` and the first 32 hex digits of the digest.
fn digest_finish(hasher: Sha256, prefix: &str) -> String {
    format!("{prefix}-{}", &hex(&hasher.finalize())[..32])
}

fn digest<S: AsRef<str> + Ord>(version: &str, mut units: Vec<S>, prefix: &str) -> String {
    units.sort_unstable();
    let mut hasher = Sha256::new();
    hasher.update(version.as_bytes());
    hasher.update(RECORD.to_string().as_bytes());
    hasher.update(units.len().to_string().as_bytes());
    for unit in &units {
        hasher.update(RECORD.to_string().as_bytes());
        hasher.update(unit.as_ref().as_bytes());
    }
    let hex = hex(&hasher.finalize());
    format!("{prefix}-{}", &hex[..32])
}

/// Lower-case hexadecimal of a byte string.
pub fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    hex_into(bytes, &mut out);
    out
}

/// [`hex`], appended to `out`: by table, since `serve` writes two digests
/// for every registry row of every plan and the formatting machinery was
/// a tenth of that work.
pub fn hex_into(bytes: &[u8], out: &mut String) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.reserve(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
}

/// The rows' registry positions in the order of their serializations,
/// kept from the registry token for the candidate token (whose order is
/// the registry's with the others left out).
pub struct SortedRows {
    order: Vec<u32>,
}

/// The registry token, and the sorted order it found. The rows are sorted
/// once; chunks of them are serialized on every core and hashed in order as
/// they come (a few chunks exist at a time, never a second copy of the
/// registry).
pub fn registry_token(rows: &[Row]) -> (String, SortedRows) {
    let order = sorted_order(rows);
    let registry = digest_units("registryfp-v1", rows, &order, "registryfp");
    (registry, SortedRows { order })
}

/// What every token of a host-scoped plan starts with (docs/semantics.md
/// §17): such a token vouches for one host's scope, never the whole
/// registry, and cannot be mistaken for the seed's.
pub const HOST_SCOPE: &str = "host-scope:";

/// The tokens of a host-scoped plan: the registry token over every row it
/// read (this host's active rows and their peers), bound to the host and
/// to the count of its other rows, and the candidate token over the rows
/// `is_candidate` picks; both prefixed [`HOST_SCOPE`], and hashed under
/// version tags of their own.
pub fn scoped_tokens(
    rows: &[Row],
    host: &str,
    terminal: u64,
    is_candidate: impl Fn(usize) -> bool,
) -> (String, String) {
    let order = sorted_order(rows);
    let scope = format!("{UNIT}{host}{UNIT}{terminal}");
    let registry = digest_units(
        &format!("host-scope-registryfp-v1{scope}"),
        rows,
        &order,
        &format!("{HOST_SCOPE}registryfp"),
    );
    let chosen: Vec<u32> = order
        .iter()
        .copied()
        .filter(|&i| is_candidate(i as usize))
        .collect();
    let candidate = digest_units(
        &format!("host-scope-candidatefp-v1{scope}"),
        rows,
        &chosen,
        &format!("{HOST_SCOPE}candidatefp"),
    );
    (registry, candidate)
}

/// The rows' positions in the order the tokens hash them.
fn sorted_order(rows: &[Row]) -> Vec<u32> {
    let started = std::time::Instant::now();
    let sorted = sorted_by_serialization(rows.iter().collect());
    tracing::debug!(rows = rows.len(), elapsed = ?started.elapsed(), "tokens: rows sorted");
    // Registry positions in sorted order (the rows are a slice, so a row's
    // index is its offset from the first).
    let index_of =
        |r: &Row| ((r as *const Row as usize - rows.as_ptr() as usize) / size_of::<Row>()) as u32;
    sorted.iter().map(|r| index_of(r)).collect()
}

impl SortedRows {
    /// The candidate token: the candidate rows' units, in sorted order.
    pub fn candidate_token(&self, rows: &[Row], is_candidate: impl Fn(usize) -> bool) -> String {
        let chosen: Vec<u32> = self
            .order
            .iter()
            .copied()
            .filter(|&i| is_candidate(i as usize))
            .collect();
        digest_units("candidatefp-v1", rows, &chosen, "candidatefp")
    }
}

/// The digest of the units of the rows at `order`'s positions, in that
/// order: chunks serialized on every core, hashed as they come.
fn digest_units(version: &str, rows: &[Row], order: &[u32], prefix: &str) -> String {
    const CHUNK: usize = 2048;
    let mut hasher = digest_start(version, order.len());
    let chunks: Vec<&[u32]> = order.chunks(CHUNK).collect();
    crate::pool::par_map_ordered(
        &chunks,
        |chunk| serialize_chunk(rows, chunk),
        |text| hasher.update(text.as_bytes()),
    );
    digest_finish(hasher, prefix)
}

/// The units (record separator, then the serialization) of the rows at
/// `chunk`'s positions, in order.
fn serialize_chunk(rows: &[Row], chunk: &[u32]) -> String {
    let mut text = String::with_capacity(chunk.len() * 700);
    for (j, &i) in chunk.iter().enumerate() {
        if let Some(&ahead) = chunk.get(j + 16) {
            rows[ahead as usize].prefetch();
        }
        if let Some(&ahead) = chunk.get(j + 8) {
            rows[ahead as usize].prefetch_texts();
        }
        text.push(RECORD);
        serialize_row_into(&rows[i as usize], &mut text);
    }
    text
}

/// Token over every registry row; order-independent, time-independent.
pub fn registry_fingerprint<'a>(rows: impl IntoIterator<Item = &'a Row>) -> String {
    digest_rows("registryfp-v1", rows.into_iter().collect(), "registryfp")
}

/// Token over exactly the approved candidate rows.
pub fn candidate_fingerprint<'a>(rows: impl IntoIterator<Item = &'a Row>) -> String {
    digest_rows("candidatefp-v1", rows.into_iter().collect(), "candidatefp")
}

/// Token over the active leases a decision consumed.
pub fn external_state_fingerprint<'a>(leases: impl IntoIterator<Item = &'a Lease>) -> String {
    let units = leases
        .into_iter()
        .map(|lease| {
            let mut out = String::new();
            for (i, col) in LEASE_FENCE_FIELDS.iter().enumerate() {
                if i > 0 {
                    out.push(UNIT);
                }
                out.push_str(col.name());
                out.push('=');
                out.push_str(&lease.get(*col).canon());
            }
            out
        })
        .collect();
    digest("externalfp-v1", units, "externalfp")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Value;

    /// Both tokens as a plan makes them (`plan_with` runs the two halves
    /// apart: the registry token beside the verdicts, the candidate token
    /// after them).
    fn plan_tokens(rows: &[Row], is_candidate: impl Fn(usize) -> bool) -> (String, String) {
        let (registry, sorted) = registry_token(rows);
        let candidate = sorted.candidate_token(rows, is_candidate);
        (registry, candidate)
    }

    /// The one-pass tokens of a plan equal the two tokens computed apart,
    /// over many chunks (rows in shuffled identity order, candidates in
    /// runs and alone, identities that hold the unit separator).
    #[test]
    fn plan_tokens_equal_the_tokens_computed_apart() {
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let rows: Vec<Row> = (0..9_000)
            .map(|i| {
                let mut r = Row::default();
                let id = match next(50) {
                    0 => format!("w-{}\u{1f}client_name=x", next(100)),
                    1 => "w-dup".to_string(),
                    _ => format!("w-{}", next(1_000_000)),
                };
                r.set(Col::WorkerIdentity, Value::Text(id.into()));
                r.set(Col::Pid, Value::Int(i));
                r.set(Col::Status, Value::Text("active".into()));
                r
            })
            .collect();
        let flags: Vec<bool> = (0..rows.len()).map(|_| next(3) > 0).collect();
        let (registry, candidate) = plan_tokens(&rows, |i| flags[i]);
        assert_eq!(registry, registry_fingerprint(&rows));
        let chosen = rows.iter().zip(&flags).filter(|(_, c)| **c).map(|(r, _)| r);
        assert_eq!(candidate, candidate_fingerprint(chosen));
    }

    #[test]
    fn empty_registry_token_is_the_hash_of_version_and_count() {
        // sha256("registryfp-v1\x1e0"), computed independently of this code:
        // printf 'registryfp-v1\0360' | sha256sum
        let want = {
            let mut h = Sha256::new();
            h.update(b"registryfp-v1\x1e0");
            format!("registryfp-{}", &hex(&h.finalize())[..32])
        };
        assert_eq!(registry_fingerprint(std::iter::empty()), want);
    }

    #[test]
    fn token_ignores_order_and_numeric_typing() {
        let mut a = Row::default();
        a.set(Col::WorkerIdentity, Value::Text("w-1".into()));
        a.set(Col::HeartbeatTtlSeconds, Value::Real(900.0));
        let mut b = Row::default();
        b.set(Col::WorkerIdentity, Value::Text("w-2".into()));
        let mut a2 = a.clone();
        a2.set(Col::HeartbeatTtlSeconds, Value::Int(900));
        assert_eq!(
            registry_fingerprint([&a, &b]),
            registry_fingerprint([&b, &a2])
        );
        let mut a3 = a.clone();
        a3.set(Col::HeartbeatTtlSeconds, Value::Real(900.5));
        assert_ne!(
            registry_fingerprint([&a, &b]),
            registry_fingerprint([&a3, &b])
        );
        // token_fingerprint never moves the token.
        let mut a4 = a.clone();
        a4.set(Col::TokenFingerprint, Value::Text("secret".into()));
        assert_eq!(registry_fingerprint([&a]), registry_fingerprint([&a4]));
    }

    #[test]
    fn external_token_matches_the_seed() {
        // Expected values: the seed's mcp_fleet_retirement.external_state_fingerprint
        // run on the same two leases (and on none) under Python 3.11.
        let lease = |v: serde_json::Value| Lease::from_json(v.as_object().unwrap()).unwrap();
        let leases = [
            lease(
                serde_json::json!({"lease_id": "l-1", "role": "author", "target": "issue-1",
                "status": "active", "session_id": "s-1", "owner_session_id": null, "owner_pid": 4242,
                "session_pid": null, "generation": "g-1", "owner_worker_identity": "w"}),
            ),
            lease(
                serde_json::json!({"lease_id": "l-2", "role": "merger", "target": "pr-7",
                "status": "active", "session_id": null, "owner_session_id": "s-2", "owner_pid": null,
                "session_pid": 77.0, "generation": null}),
            ),
        ];
        assert_eq!(
            external_state_fingerprint(&leases),
            "externalfp-8d1cccf1b9a50154f9d37835f4d2fd09"
        );
        assert_eq!(
            external_state_fingerprint(std::iter::empty()),
            "externalfp-cc1f702beded00b09eecf2c3524e2b05"
        );
    }

    /// The tokens sort rows without writing every serialization out; they
    /// must hash exactly what sorting the serializations would. Identities
    /// that are prefixes of each other, that hold characters below the unit
    /// separator, that repeat, that are not text, or that are longer than
    /// the sorted prefix are where a shortcut could go wrong.
    #[test]
    fn sorting_without_serializing_matches_sorting_serializations() {
        fn reference(version: &str, rows: &[Row], prefix: &str) -> String {
            let units: Vec<String> = rows.iter().map(serialize_row).collect();
            digest(version, units, prefix)
        }
        let long = "w-".repeat(20);
        let ids: Vec<Value> = [
            "w-a",
            "w-a\u{1}",
            "w-a\u{1e}",
            "w-a\u{1f}",
            "w-a\u{20}",
            "w-a\t",
            "w-ab",
            "w-a",
            "",
            "w-\u{e9}",
            "w-z",
        ]
        .iter()
        .map(|t| Value::Text((*t).into()))
        .chain([
            Value::Null,
            Value::Int(7),
            Value::Int(-7),
            Value::Real(7.5),
            Value::Text(format!("{long}x").into()),
            Value::Text(format!("{long}x\u{1}").into()),
            Value::Text(long.as_str().into()),
            Value::Text(format!("{long}x").into()),
        ])
        .collect();
        let mut rows = Vec::new();
        for (n, id) in ids.iter().enumerate() {
            for pid in [1, 2] {
                let mut row = Row::default();
                row.set(Col::WorkerIdentity, id.clone());
                row.set(Col::Pid, Value::Int(pid * 100 + n as i64 % 3));
                rows.push(row);
            }
        }
        {
            let mut want: Vec<String> = rows.iter().map(serialize_row).collect();
            want.sort();
            let got: Vec<String> = sorted_by_serialization(rows.iter().collect())
                .into_iter()
                .map(serialize_row)
                .collect();
            for (a, b) in want.iter().zip(&got) {
                assert_eq!(a, b, "first difference");
            }
        }
        // Reversed and rotated orders give the same token.
        for turn in 0..3 {
            let mut order = rows.clone();
            order.rotate_left(turn * 5);
            if turn == 2 {
                order.reverse();
            }
            assert_eq!(
                registry_fingerprint(&order),
                reference("registryfp-v1", &order, "registryfp")
            );
            let (registry, candidate) = plan_tokens(&order, |i| i % 3 == 0);
            assert_eq!(registry, reference("registryfp-v1", &order, "registryfp"));
            let chosen: Vec<Row> = order.iter().step_by(3).cloned().collect();
            assert_eq!(
                candidate,
                reference("candidatefp-v1", &chosen, "candidatefp")
            );
        }
    }

    /// Random identities over an alphabet made of the bytes that matter
    /// (the separator, the letters of `client_name=`, a byte below the
    /// separator), long and short: the shortcut sorts them as sorting the
    /// serializations does.
    #[test]
    fn random_identities_sort_as_their_serializations() {
        let alphabet = [
            '\u{1f}', '\u{1e}', '\u{1}', 'c', 'l', 'i', '=', '_', 'n', 'w',
        ];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        for _ in 0..50 {
            let mut rows = Vec::new();
            for _ in 0..60 {
                // Keys (the identity and 13 bytes) end in every word of the
                // 32-byte prefix, at every byte of it, and beyond it.
                let len = if next(4) == 0 {
                    28 + next(12)
                } else {
                    next(20)
                };
                let id: String = (0..len).map(|_| alphabet[next(alphabet.len())]).collect();
                let mut row = Row::default();
                row.set(Col::WorkerIdentity, Value::Text(id.into()));
                row.set(
                    Col::ClientName,
                    Value::Text(["", "c", "\u{1f}"][next(3)].into()),
                );
                rows.push(row);
            }
            let mut want: Vec<String> = rows.iter().map(serialize_row).collect();
            want.sort();
            let got: Vec<String> = sorted_by_serialization(rows.iter().collect())
                .into_iter()
                .map(serialize_row)
                .collect();
            assert_eq!(want, got);
        }
    }
}

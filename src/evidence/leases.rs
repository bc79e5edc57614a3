//! The control-plane lease store (docs/semantics.md §6).
//!
//! Only rows whose `status` is exactly `active` count, whatever their
//! `expires_at` says. A store that is named but missing, unreadable, or
//! without the table is an error: it is never read as "no leases".

use crate::error::Result;
pub use crate::store::leases::{Lease, LeaseCol, COLUMNS, TABLE};
pub use crate::store::seam::FenceSource;
use crate::value::Value;
use std::collections::BTreeSet;
use std::path::Path;

/// What the active leases protect.
///
/// A row's identity and session are matched by their canonical text
/// (docs/semantics.md §5), so a lease names them by its canonical text too:
/// `42`, `42.0` and `"42"` are one session, as they are one value in every
/// token. The seed compared `str()` of the lease value instead, which left a
/// REAL `42.0` lease protecting nothing of a row whose session is `42`. Both
/// texts are kept (they differ only for whole reals and booleans), so every
/// row the seed protected stays protected: a protection is only ever added
/// (docs/semantics.md §16).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Protections {
    /// `owner_worker_identity` values, by canonical text and `str()`
    /// ([`names`]).
    pub worker_identities: BTreeSet<String>,
    /// `session_id` and `owner_session_id` values, by canonical text and
    /// `str()` ([`names`]).
    pub session_ids: BTreeSet<String>,
    /// `owner_pid` and `session_pid` values, canonical text (non-NULL).
    pub pids: BTreeSet<String>,
}

/// The lease columns that feed each protection (stated in full beside
/// `lease_*` in `policies/schema.cedarschema`; a test holds the two equal).
pub const WORKER_IDENTITY_COLUMNS: &[LeaseCol] = &[LeaseCol::OwnerWorkerIdentity];
/// See [`WORKER_IDENTITY_COLUMNS`].
pub const SESSION_COLUMNS: &[LeaseCol] = &[LeaseCol::SessionId, LeaseCol::OwnerSessionId];
/// See [`WORKER_IDENTITY_COLUMNS`].
pub const PID_COLUMNS: &[LeaseCol] = &[LeaseCol::OwnerPid, LeaseCol::SessionPid];

impl Protections {
    /// Collect the protections of the active leases among `leases`.
    pub fn from_leases<'a>(leases: impl IntoIterator<Item = &'a Lease>) -> Protections {
        let mut p = Protections::default();
        for lease in leases.into_iter().filter(|l| l.is_active()) {
            for &col in WORKER_IDENTITY_COLUMNS {
                names(&mut p.worker_identities, lease.get(col));
            }
            for &col in SESSION_COLUMNS {
                names(&mut p.session_ids, lease.get(col));
            }
            for &col in PID_COLUMNS {
                let v = lease.get(col);
                if *v != Value::Null {
                    p.pids.insert(v.canon());
                }
            }
        }
        p
    }
}

/// Add the texts by which a lease's value names a row: its canonical text
/// when that is not empty (NULL and `""` name nothing), and the seed's
/// `str()` of a truthy value, where the two differ.
fn names(set: &mut BTreeSet<String>, v: &Value) {
    let canon = v.canon();
    if !canon.is_empty() {
        set.insert(canon);
    }
    if v.truthy() {
        set.insert(v.py_str());
    }
}

/// Read every lease row of the store at `location` (a SQLite file or a
/// PostgreSQL URL), read-only; a store that cannot be read is an error,
/// never "no leases".
pub fn load(location: &Path) -> Result<Vec<Lease>> {
    crate::store::open::engine(location)?.read_leases()
}

/// The lease store at `location` opened for apply's fence.
pub fn open_fence(location: &Path) -> Result<Box<dyn FenceSource>> {
    crate::store::open::engine(location)?.fence_source()
}

/// What apply holds the lease store to while it writes: the seed's
/// external-state token, a digest over every column of every active lease
/// (the seed's token leaves `owner_worker_identity` out, so re-pointing a
/// lease at a target would not move it), and a version that changes when
/// another connection commits to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// `externalfp-…`, byte-identical to the seed's.
    pub token: String,
    /// `sha256:<hex>` over the full content of the active leases.
    pub digest: String,
    /// The store's version when the leases were read ([`FenceSource`]).
    pub version: String,
    /// A SQLite store's header, read before the version
    /// ([`FenceSource::header`]): unchanged, it proves the leases are too.
    header: Option<[u8; 10]>,
}

impl Fence {
    /// Read the active leases and fence them. The version is read first,
    /// so a commit racing the read shows as a changed version later.
    pub fn read(source: &mut dyn FenceSource) -> Result<(Fence, Vec<Lease>)> {
        let header = source.header();
        let version = source.version()?;
        let active = source.read_active()?;
        let fence = Fence {
            header,
            ..Fence::of(&active, version)
        };
        Ok((fence, active))
    }

    /// The fence of active leases read elsewhere (in apply's own
    /// PostgreSQL transaction), with the version read in that same snapshot.
    pub fn of(active: &[Lease], version: String) -> Fence {
        Fence {
            token: crate::fingerprint::external_state_fingerprint(active.iter()),
            digest: full_digest(active),
            version,
            header: None,
        }
    }

    /// Whether the active leases may have changed since this fence: cheap
    /// (the version) when nobody committed, a full re-read and comparison
    /// when someone did. Returns the fence now in force, or the new one
    /// that differs.
    pub fn recheck(
        &self,
        source: &mut dyn FenceSource,
    ) -> Result<std::result::Result<Fence, Fence>> {
        let header = source.header();
        if header.is_some() && header == self.header {
            return Ok(Ok(self.clone()));
        }
        if source.version()? == self.version {
            // No commit since the fence; the header read just before the
            // version vouches from now on.
            return Ok(Ok(Fence {
                header,
                ..self.clone()
            }));
        }
        self.recheck_fully(source)
    }

    /// Re-read the active leases whatever the version says and compare.
    pub fn recheck_fully(
        &self,
        source: &mut dyn FenceSource,
    ) -> Result<std::result::Result<Fence, Fence>> {
        let (now, _) = Fence::read(source)?;
        Ok(if now.token == self.token && now.digest == self.digest {
            Ok(now)
        } else {
            Err(now)
        })
    }
}

/// sha256 over every column (name, storage class and canonical text) of
/// every given lease, independent of row order.
pub fn full_digest(leases: &[Lease]) -> String {
    use sha2::{Digest, Sha256};
    let mut units: Vec<String> = leases
        .iter()
        .map(|l| {
            let mut out = String::new();
            for (name, v) in l.fields() {
                out.push_str(name);
                out.push('\u{1f}');
                out.push_str(v.kind());
                out.push('\u{1f}');
                out.push_str(&v.canon());
                out.push('\u{1e}');
            }
            out
        })
        .collect();
    units.sort();
    let mut h = Sha256::new();
    for u in &units {
        h.update(u.len().to_string().as_bytes());
        h.update(b":");
        h.update(u.as_bytes());
    }
    format!("sha256:{}", crate::fingerprint::hex(&h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::Connection;
    use std::collections::BTreeMap;

    fn store(dir: &Path, journal: &str) -> std::path::PathBuf {
        let path = dir.join(format!("leases-{journal}.sqlite"));
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(&format!(
            "PRAGMA journal_mode = {journal}; {}",
            crate::store::leases::create_sql()
        ))
        .unwrap();
        path
    }

    fn commit(path: &Path, sql: &str) {
        Connection::open(path).unwrap().execute(sql, []).unwrap();
    }

    /// The header's counter lets an unchanged store through cheaply; every
    /// commit by another connection is still seen, whether or not it
    /// changes the active leases, in both journal modes.
    #[test]
    fn every_commit_by_another_connection_reaches_the_fence() {
        let dir = tempfile::tempdir().unwrap();
        for journal in ["delete", "wal"] {
            let path = store(dir.path(), journal);
            commit(
                &path,
                "INSERT INTO workflow_leases (lease_id, status, owner_pid) VALUES ('l-1', 'active', 7)",
            );
            let mut source = open_fence(&path).unwrap();
            let (fence, active) = Fence::read(&mut *source).unwrap();
            assert_eq!(active.len(), 1);
            assert_eq!(fence.header.is_some(), journal == "delete", "{journal}");
            // Nothing committed: the fence stands.
            let same = fence.recheck(&mut *source).unwrap().unwrap();
            assert_eq!(same, fence);
            // A commit that leaves the active leases as they were: the
            // full comparison runs and the fence stands, with the new
            // header vouching from then on.
            commit(
                &path,
                "INSERT INTO workflow_leases (lease_id, status) VALUES ('l-2', 'released')",
            );
            let moved_on = fence.recheck(&mut *source).unwrap().unwrap();
            assert_eq!(moved_on.token, fence.token);
            assert_ne!(moved_on.version, fence.version, "{journal}");
            if journal == "delete" {
                assert_ne!(moved_on.header, fence.header);
            }
            let again = moved_on.recheck(&mut *source).unwrap().unwrap();
            assert_eq!(again.header, moved_on.header);
            // A commit that takes a lease, after the header vouched.
            commit(
                &path,
                "INSERT INTO workflow_leases (lease_id, status, owner_pid) VALUES ('l-3', 'active', 8)",
            );
            let now = again.recheck(&mut *source).unwrap().unwrap_err();
            assert_ne!(now.digest, again.digest, "{journal}");
        }
    }

    fn lease(fields: &[(&str, Value)]) -> Lease {
        let mut all: BTreeMap<String, Value> = fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        all.insert("status".into(), Value::Text("active".into()));
        Lease::from_fields(all)
    }

    /// The schema's statement of the lease rule is the code's: the same
    /// columns feed each set, and only a status of exactly "active" counts,
    /// whatever expires_at says.
    #[test]
    fn the_schema_states_the_lease_rule_the_code_follows() {
        let schema = include_str!("../../policies/schema.cedarschema");
        let stated = |set: &str| -> Vec<String> {
            let tag = format!("{set} from:");
            let line = schema
                .lines()
                .find_map(|l| {
                    l.trim()
                        .strip_prefix("//")?
                        .trim()
                        .strip_prefix(tag.as_str())
                })
                .unwrap_or_else(|| panic!("the schema states no {tag:?}"));
            line.split(',').map(|c| c.trim().to_string()).collect()
        };
        let names = |cols: &[LeaseCol]| -> Vec<String> {
            cols.iter().map(|c| c.name().to_string()).collect()
        };
        assert_eq!(
            stated("lease_worker_identities"),
            names(WORKER_IDENTITY_COLUMNS)
        );
        assert_eq!(stated("lease_session_ids"), names(SESSION_COLUMNS));
        assert_eq!(stated("lease_pids"), names(PID_COLUMNS));
        assert!(schema.contains("status is the text \"active\", exactly"));
        assert!(schema.contains("expires_at and every other column are ignored"));
        for (status, counts) in [
            ("active", true),
            (" active", false),
            ("ACTIVE", false),
            ("expired", false),
        ] {
            let mut all: BTreeMap<String, Value> = BTreeMap::new();
            all.insert("status".into(), Value::Text(status.into()));
            all.insert("owner_pid".into(), Value::Int(7));
            all.insert(
                "expires_at".into(),
                Value::Text("2000-01-01T00:00:00Z".into()),
            );
            let p = Protections::from_leases([&Lease::from_fields(all)]);
            assert_eq!(p.pids.contains("7"), counts, "{status:?}");
        }
    }

    /// A lease names a session or identity by its canonical text, and
    /// still by the seed's `str()`: `42.0` protects `42` and `"42.0"`.
    #[test]
    fn a_lease_names_rows_by_canonical_text_and_by_the_seeds_str() {
        let cases: &[(Value, &[&str])] = &[
            (Value::Real(42.0), &["42", "42.0"]),
            (Value::Int(42), &["42"]),
            (Value::Text("42".into()), &["42"]),
            (Value::Text("42.0".into()), &["42.0"]),
            (Value::Real(1e16), &["10000000000000000", "1e+16"]),
            (Value::Real(0.5), &["0.5"]),
            (Value::Bool(true), &["true", "True"]),
            (Value::Int(0), &["0"]),
            (Value::Real(-0.0), &["0"]),
            (Value::Text("".into()), &[]),
            (Value::Null, &[]),
        ];
        for (v, want) in cases {
            let p = Protections::from_leases([&lease(&[
                ("owner_session_id", v.clone()),
                ("owner_worker_identity", v.clone()),
            ])]);
            let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
            assert_eq!(p.session_ids, want, "{v:?}");
            assert_eq!(p.worker_identities, want, "{v:?}");
        }
    }

    /// Protections follow the lease's kind as well as its canonical text
    /// (`42` and `42.0` protect different sets of rows), so a change of
    /// kind alone must move the fence: the digest covers the kind, though
    /// the seed's token does not.
    #[test]
    fn a_change_of_kind_alone_moves_the_fence() {
        let int = [lease(&[("owner_session_id", Value::Int(42))])];
        let real = [lease(&[("owner_session_id", Value::Real(42.0))])];
        let (a, b) = (Fence::of(&int, "v".into()), Fence::of(&real, "v".into()));
        assert_eq!(a.token, b.token);
        assert_ne!(a.digest, b.digest);
        assert_ne!(
            Protections::from_leases(&int),
            Protections::from_leases(&real)
        );
    }

    /// A store switched to WAL mode after the fence was read no longer
    /// vouches by its header: the counter is not kept in that mode.
    #[test]
    fn a_store_switched_to_wal_is_checked_by_its_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = store(dir.path(), "delete");
        let mut source = open_fence(&path).unwrap();
        let (fence, _) = Fence::read(&mut *source).unwrap();
        assert!(fence.header.is_some());
        Connection::open(&path)
            .unwrap()
            .execute_batch("PRAGMA journal_mode = wal")
            .unwrap();
        assert_eq!(source.header(), None);
        let writer = Connection::open(&path).unwrap();
        writer
            .execute(
                "INSERT INTO workflow_leases (lease_id, status, owner_pid) VALUES ('l-9', 'active', 9)",
                [],
            )
            .unwrap();
        let now = fence.recheck(&mut *source).unwrap().unwrap_err();
        assert_ne!(now.digest, fence.digest);
    }
}

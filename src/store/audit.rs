//! The audit table: one row per retired worker, written by apply in the
//! same transaction as the retirement. Its columns and its migration live
//! here; the checks that make it tell the truth are `super::untrusted_objects`
//! (before writing) and apply's change counts (after).

use crate::value::Val;
use rusqlite::Connection;

/// The audit table.
pub const TABLE: &str = "retirement_audit";

/// Audit columns after the key, with their SQL types. Columns past the
/// first nine were added later; an older audit table gains them (NULL in its
/// old rows).
pub const COLUMNS: &[(&str, &str)] = &[
    ("worker_identity", "TEXT NOT NULL"),
    ("retired_at", "TEXT NOT NULL"),
    ("retired_by", "TEXT NOT NULL"),
    ("retirement_reason", "TEXT NOT NULL"),
    ("registry_fingerprint", "TEXT NOT NULL"),
    ("candidate_fingerprint", "TEXT NOT NULL"),
    ("policy_fingerprint", "TEXT NOT NULL"),
    ("external_state_fingerprint", "TEXT NOT NULL"),
    ("evidence", "TEXT NOT NULL"),
    // Who, with what, from where (added with the security review).
    ("apply_id", "TEXT"),
    ("profiles_sha256", "TEXT"),
    ("os_uid", "INTEGER"),
    ("host_id", "TEXT"),
    ("program_version", "TEXT"),
    ("policy_source", "TEXT"),
    ("canonical_repository", "TEXT"),
    ("lease_store", "TEXT"),
    ("lease_digest", "TEXT"),
    // Rows whose heartbeat alone moved between plan and apply (tolerated).
    ("heartbeats_tolerated", "INTEGER"),
    // Rows added or changed beside the targets since the plan, none of
    // them a candidate of it (semantics §13).
    ("rows_changed_since_plan", "INTEGER"),
];

/// The key column.
pub const KEY: &str = "audit_id";

/// Create the audit table, or add the columns an older one lacks.
pub fn create_or_migrate(conn: &Connection) -> rusqlite::Result<()> {
    match super::table_columns(conn, TABLE)? {
        None => {
            let cols: Vec<String> = COLUMNS.iter().map(|(n, t)| format!("{n} {t}")).collect();
            conn.execute_batch(&format!(
                "CREATE TABLE {TABLE} ({KEY} INTEGER PRIMARY KEY AUTOINCREMENT, {})",
                cols.join(", ")
            ))
        }
        Some(existing) => {
            for (name, ty) in COLUMNS
                .iter()
                .filter(|(n, _)| !existing.iter().any(|c| c == n))
            {
                let ty = ty.trim_end_matches(" NOT NULL");
                conn.execute_batch(&format!(
                    "ALTER TABLE {TABLE} ADD COLUMN {} {ty}",
                    super::quote_ident(name)
                ))?;
            }
            Ok(())
        }
    }
}

/// One audit row: the retirement, the tokens it was decided under, and who,
/// with what, from where.
#[derive(Debug, Clone)]
pub struct AuditRow<'a> {
    /// The retired worker.
    pub worker_identity: &'a str,
    /// When.
    pub retired_at: &'a str,
    /// The operator's profile.
    pub retired_by: &'a str,
    /// The reason code (`eligible`).
    pub retirement_reason: &'a str,
    /// The plan's registry token.
    pub registry_fingerprint: &'a str,
    /// The plan's candidate token.
    pub candidate_fingerprint: &'a str,
    /// The policy set's fingerprint.
    pub policy_fingerprint: &'a str,
    /// The lease token at the write.
    pub external_state_fingerprint: &'a str,
    /// The row's evidence, as JSON.
    pub evidence: &'a str,
    /// This apply's id (one per transaction).
    pub apply_id: &'a str,
    /// sha256 of the profiles.json that allowed it.
    pub profiles_sha256: &'a str,
    /// The operating-system user.
    pub os_uid: i64,
    /// This host, when known.
    pub host_id: Option<&'a str>,
    /// fleet-retire's version.
    pub program_version: &'a str,
    /// The policy set, for a person.
    pub policy_source: &'a str,
    /// The repository binding required.
    pub canonical_repository: Option<&'a str>,
    /// The lease store's path.
    pub lease_store: &'a str,
    /// The digest of every active lease column at the write.
    pub lease_digest: &'a str,
    /// Rows whose heartbeat alone moved since the plan.
    pub heartbeats_tolerated: i64,
    /// Rows added or changed beside the targets since the plan.
    pub rows_changed_since_plan: i64,
}

impl<'a> AuditRow<'a> {
    /// The values in [`COLUMNS`] order, borrowed.
    pub fn vals(&self) -> [Val<'a>; COLUMNS.len()] {
        let text = Val::Text;
        [
            text(self.worker_identity),
            text(self.retired_at),
            text(self.retired_by),
            text(self.retirement_reason),
            text(self.registry_fingerprint),
            text(self.candidate_fingerprint),
            text(self.policy_fingerprint),
            text(self.external_state_fingerprint),
            text(self.evidence),
            text(self.apply_id),
            text(self.profiles_sha256),
            Val::Int(self.os_uid),
            self.host_id.map_or(Val::Null, text),
            text(self.program_version),
            text(self.policy_source),
            self.canonical_repository.map_or(Val::Null, text),
            text(self.lease_store),
            text(self.lease_digest),
            Val::Int(self.heartbeats_tolerated),
            Val::Int(self.rows_changed_since_plan),
        ]
    }

    /// The values in [`COLUMNS`] order, as SQLite stores them.
    pub fn values(&self) -> Vec<rusqlite::types::Value> {
        self.vals()
            .into_iter()
            .map(super::registry::sql_value)
            .collect()
    }
}

/// Write one audit row.
pub fn insert(conn: &Connection, row: &AuditRow) -> rusqlite::Result<()> {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let sql = SQL.get_or_init(|| {
        format!(
            "INSERT INTO {TABLE} ({}) VALUES ({})",
            COLUMNS
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", "),
            (1..=COLUMNS.len())
                .map(|i| format!("?{i}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    });
    conn.prepare_cached(sql)?
        .execute(rusqlite::params_from_iter(row.values()))
        .map(|_| ())
}

/// How many audit rows carry this apply's id.
pub fn count_for(conn: &Connection, apply_id: &str) -> rusqlite::Result<usize> {
    conn.query_row(
        &format!("SELECT count(*) FROM {TABLE} WHERE apply_id = ?1"),
        [apply_id],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n as usize)
}

/// The answer for a registry with no audit table, asked about an apply:
/// no apply ever committed there, so it is not the registry that apply
/// wrote to (an empty answer would read as "not committed").
pub fn absent(shown: &str) -> crate::error::Error {
    crate::error::Error::Registry {
        shown: shown.to_string(),
        message: format!(
            "has no {TABLE} table, so no apply ever committed here: this is not the registry \
             the apply wrote to; pass the same --registry the apply had"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_has_a_value_for_every_column() {
        let row = AuditRow {
            worker_identity: "w",
            retired_at: "t",
            retired_by: "p",
            retirement_reason: "eligible",
            registry_fingerprint: "r",
            candidate_fingerprint: "c",
            policy_fingerprint: "f",
            external_state_fingerprint: "e",
            evidence: "{}",
            apply_id: "a",
            profiles_sha256: "s",
            os_uid: 0,
            host_id: None,
            program_version: "v",
            policy_source: "built-in",
            canonical_repository: Some("o/r"),
            lease_store: "l",
            lease_digest: "d",
            heartbeats_tolerated: 0,
            rows_changed_since_plan: 0,
        };
        assert_eq!(row.values().len(), COLUMNS.len());
        let conn = Connection::open_in_memory().unwrap();
        create_or_migrate(&conn).unwrap();
        insert(&conn, &row).unwrap();
        assert_eq!(count_for(&conn, "a").unwrap(), 1);
    }
}

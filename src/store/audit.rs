//! The audit table: one row per retired worker, written by apply in the
//! same transaction as the retirement. Its columns and its migration live
//! here; the checks that make it tell the truth are `super::untrusted_objects`
//! (before writing) and apply's change counts (after).

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
                conn.execute_batch(&format!("ALTER TABLE {TABLE} ADD COLUMN {name} {ty}"))?;
            }
            Ok(())
        }
    }
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

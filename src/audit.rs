//! The audit table, and the checks that make it tell the truth.
//!
//! Apply writes one `retirement_audit` row per retired worker in the same
//! transaction as the retirement. A registry file is data an attacker with
//! write access to it can shape, so before writing apply refuses a registry
//! that could make its writes do something other than what it reports: any
//! trigger (one on `worker_registrations` retired live rows alongside the
//! target), any view (a view named `retirement_audit` swallowed the audit
//! rows), a registry or audit object that is not a plain table, or an audit
//! table with columns that are not ours. After writing it checks that the
//! statements changed exactly the rows it meant to, and that its audit rows
//! are there, before it commits.

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

/// Why a registry cannot be written safely, if it cannot.
pub fn untrusted_objects(
    conn: &Connection,
    registry_table: &str,
) -> rusqlite::Result<Option<String>> {
    let mut problems = Vec::new();
    let mut stmt = conn.prepare(
        "SELECT type, name, tbl_name FROM sqlite_master WHERE type IN ('trigger', 'view') ORDER BY name",
    )?;
    let objects: Vec<(String, String, String)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (kind, name, table) in objects {
        problems.push(if kind == "trigger" {
            format!("trigger {name:?} on {table:?}")
        } else {
            format!("view {name:?}")
        });
    }
    for table in [registry_table, TABLE] {
        let kind: Option<String> = conn
            .query_row(
                "SELECT type FROM sqlite_master WHERE name = ?1 COLLATE NOCASE",
                [table],
                |r| r.get(0),
            )
            .ok();
        if let Some(kind) = kind.filter(|k| k != "table") {
            problems.push(format!("{table:?} is a {kind}, not a table"));
        }
    }
    if let Some(existing) = crate::evidence::registry::table_columns(conn, TABLE)? {
        let foreign: Vec<&String> = existing
            .iter()
            .filter(|c| *c != KEY && !COLUMNS.iter().any(|(n, _)| n == c))
            .collect();
        if !foreign.is_empty() || !existing.iter().any(|c| c == KEY) {
            problems.push(format!(
                "table {TABLE:?} has columns that are not fleet-retire's ({})",
                existing.join(", ")
            ));
        }
    }
    Ok((!problems.is_empty()).then(|| {
        format!(
            "the registry holds objects that could make apply's writes differ from its report: {}. \
             Nothing was written. A registry needs none of them: inspect and drop them \
             (sqlite3 REGISTRY '.schema'), then apply again",
            problems.join("; ")
        )
    }))
}

/// Create the audit table, or add the columns an older one lacks.
pub fn create_or_migrate(conn: &Connection) -> rusqlite::Result<()> {
    match crate::evidence::registry::table_columns(conn, TABLE)? {
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

//! Row versions of a PostgreSQL registry: which rows changed since a
//! snapshot, without reading the registry (docs/apply.md, "A million rows
//! on PostgreSQL").
//!
//! A row's `xmin` names the subtransaction that wrote it, and a snapshot
//! lists only top-level transactions, so `xmin` cannot say whether a
//! snapshot saw a row. The registry therefore keeps a change record,
//! `fleet_retire_changes`: a key per registry row (`i:` and its worker
//! identity) and per audit row (`a:` and its id), with the top-level id
//! (`xid8`) of the last transaction that inserted, updated or deleted it.
//! Row triggers whose text is ours keep it, enabled `ALWAYS` (they fire
//! under `session_replication_role = replica` too), from a function that
//! runs with the writer's own rights, reads only a row's key column and
//! refuses any table but ours, with a pinned `search_path`; every writer
//! holds `SELECT, INSERT, UPDATE` on the record and nothing more. A
//! `TRUNCATE` stamps `t:` and the table. Guard triggers on the record
//! refuse deleting or renaming a key and stamp every write with its
//! writer's own id, so a writer can only mark a row changed.
//!
//! The rows changed since a snapshot are then those whose stamp that
//! snapshot does not see (`pg_visible_in_snapshot`). What the triggers
//! cannot see is DDL (a trigger disabled, a table rewritten): every catalog
//! row that shapes our tables and functions is stamped by PostgreSQL itself
//! with the transaction that last wrote it, so those `xmin`s, taken
//! together ([`catalog_stamp`]), move with any DDL, and apply compares them
//! before it trusts the record. A different server (a failover, a restart)
//! is told by its start time: snapshots of one server mean nothing on
//! another, and apply then reads the whole registry.

use super::quote_ident;
use crate::error::{Error, Result, Store};
use crate::store::audit;
use crate::store::registry::TABLE;
use postgres::GenericClient;

mod legacy;

/// The change record.
pub const CHANGES: &str = "fleet_retire_changes";
const STAMP_FN: &str = "fleet_retire_stamp";
const GUARD_FN: &str = "fleet_retire_changes_guard";

/// The lowest server (`server_version_num`) with `xid8` snapshots.
const SINCE: i32 = 130_000;

/// A trigger of ours: name, table, `tgtype` bits, function. None takes
/// arguments: the stamp tells the tables apart by their oids.
struct Trigger {
    name: &'static str,
    table: &'static str,
    tgtype: i16,
    function: &'static str,
}

// pg_trigger.tgtype: ROW 1, BEFORE 2, INSERT 4, DELETE 8, UPDATE 16, TRUNCATE 32.
const TRIGGERS: [Trigger; 6] = [
    Trigger {
        name: "fleet_retire_stamp",
        table: TABLE,
        tgtype: 1 | 4 | 8 | 16,
        function: STAMP_FN,
    },
    Trigger {
        name: "fleet_retire_stamp_truncate",
        table: TABLE,
        tgtype: 32,
        function: STAMP_FN,
    },
    Trigger {
        name: "fleet_retire_stamp",
        table: audit::TABLE,
        tgtype: 1 | 4 | 8 | 16,
        function: STAMP_FN,
    },
    Trigger {
        name: "fleet_retire_stamp_truncate",
        table: audit::TABLE,
        tgtype: 32,
        function: STAMP_FN,
    },
    Trigger {
        name: "fleet_retire_guard",
        table: CHANGES,
        tgtype: 1 | 2 | 4 | 8 | 16,
        function: GUARD_FN,
    },
    Trigger {
        name: "fleet_retire_guard_truncate",
        table: CHANGES,
        tgtype: 2 | 32,
        function: GUARD_FN,
    },
];

/// The tables whose shape the catalog stamp covers.
pub const TABLES: [&str; 3] = [TABLE, audit::TABLE, CHANGES];

/// The setting both functions run with.
const CONFIG: &str = "search_path=pg_catalog, pg_temp";

/// Our schema, as an identifier and as a string literal.
struct Schema {
    ident: String,
    literal: String,
}

/// The first lines of both functions: refuse to run on any table but
/// `tables` in our schema (someone may attach a trigger of their own to a
/// table of theirs that calls our function).
fn only_on(schema: &Schema, tables: &[&str]) -> String {
    let on = tables
        .iter()
        .map(|t| format!("TG_TABLE_NAME = '{t}'"))
        .collect::<Vec<_>>()
        .join(" OR ");
    format!(
        "IF TG_TABLE_SCHEMA IS DISTINCT FROM {} OR NOT ({on}) THEN\n\
         RAISE EXCEPTION 'fleet-retire: % runs on fleet-retire''s own tables only, not on %.%', \
         TG_NAME, TG_TABLE_SCHEMA, TG_TABLE_NAME;\nEND IF;\n",
        schema.literal
    )
}

/// The body of the stamping function. It runs with the rights of whoever
/// writes (no `SECURITY DEFINER`), and reads nothing of a row but its key
/// column (`worker_identity`, text; `audit_id`, bigint): no value of a
/// type someone else chose is converted.
fn stamp_body(schema: &Schema) -> String {
    let upsert = |key: &str| {
        format!(
            "INSERT INTO {}.{CHANGES} (key, xid) VALUES ({key}, pg_current_xact_id()) \
             ON CONFLICT (key) DO UPDATE SET xid = excluded.xid;",
            schema.ident
        )
    };
    let key_of = |row: &str, into: &str| {
        format!(
            "IF kind = 'i' THEN {into} := {row}.worker_identity; \
             ELSE {into} := {row}.{}::pg_catalog.text; END IF;",
            audit::KEY
        )
    };
    format!(
        "\nDECLARE kind text; old_key text; new_key text;\nBEGIN\n{}\
         IF TG_TABLE_NAME = '{TABLE}' THEN kind := 'i'; ELSE kind := 'a'; END IF;\n\
         IF TG_LEVEL = 'STATEMENT' THEN\n{}\nRETURN NULL;\nEND IF;\n\
         IF TG_OP <> 'INSERT' THEN\n{}\n{}\nEND IF;\n\
         IF TG_OP <> 'DELETE' THEN\n{}\n\
         IF TG_OP = 'INSERT' OR new_key IS DISTINCT FROM old_key THEN\n{}\nEND IF;\nEND IF;\n\
         RETURN NULL;\nEND\n",
        only_on(schema, &[TABLE, audit::TABLE]),
        upsert("'t:' || kind"),
        key_of("OLD", "old_key"),
        upsert("kind || coalesce(':' || old_key, '')"),
        key_of("NEW", "new_key"),
        upsert("kind || coalesce(':' || new_key, '')"),
    )
}

/// The body of the guard on the change record.
fn guard_body(schema: &Schema) -> String {
    format!(
        "\nBEGIN\n{}\
         IF TG_OP IN ('DELETE', 'TRUNCATE') OR (TG_OP = 'UPDATE' AND NEW.key IS DISTINCT FROM OLD.key) THEN\n\
         RAISE EXCEPTION 'fleet-retire: the change record keeps every key; it is never deleted, truncated or renamed';\n\
         END IF;\n\
         NEW.xid := pg_current_xact_id();\nRETURN NEW;\nEND\n",
        only_on(schema, &[CHANGES])
    )
}

fn err<'a>(label: &'a str, doing: &'static str) -> impl Fn(postgres::Error) -> Error + 'a {
    Error::postgres(Store::Registry, label, doing)
}

/// The schema our tables live in (the session's, pinned at connect).
fn schema(client: &mut impl GenericClient, label: &str) -> Result<Schema> {
    let row = client
        .query_one(
            "SELECT pg_catalog.current_schema()::text, \
             pg_catalog.quote_literal(pg_catalog.current_schema())",
            &[],
        )
        .map_err(err(label, "cannot read the current schema"))?;
    Ok(Schema {
        ident: quote_ident(&row.get::<_, String>(0)),
        literal: row.get(1),
    })
}

/// Whether this server can keep versions (PostgreSQL 13 or later).
pub fn supported(client: &mut impl GenericClient, label: &str) -> Result<bool> {
    let row = client
        .query_one(
            "SELECT pg_catalog.current_setting('server_version_num')::int",
            &[],
        )
        .map_err(err(label, "cannot read the server's version"))?;
    Ok(row.get::<_, i32>(0) >= SINCE)
}

/// Install the change record, its functions and the triggers (in the
/// caller's transaction). The record is written with the rights of whoever
/// writes our tables: every role that may insert into or update the
/// registry or the audit is granted `SELECT, INSERT, UPDATE` on it (the
/// guard keeps every key and stamps every write with its writer's own
/// transaction, so a writer can only mark a row changed), and nobody but
/// the owner keeps any other right on it, or `EXECUTE` on its functions.
pub fn install(tx: &mut impl GenericClient, label: &str) -> Result<()> {
    let s = schema(tx, label)?;
    let function = |name: &str, body: &str| {
        format!(
            "CREATE OR REPLACE FUNCTION {}.{name}() RETURNS trigger LANGUAGE plpgsql SECURITY INVOKER \
             SET search_path = pg_catalog, pg_temp AS $fleet_retire${body}$fleet_retire$",
            s.ident
        )
    };
    let mut sql = vec![
        format!(
            "CREATE TABLE IF NOT EXISTS {}.{CHANGES} (key text PRIMARY KEY, xid pg_catalog.xid8 NOT NULL)",
            s.ident
        ),
        format!(
            "CREATE INDEX IF NOT EXISTS fleet_retire_changes_by_xid ON {}.{CHANGES} (xid)",
            s.ident
        ),
        function(STAMP_FN, &stamp_body(&s)),
        function(GUARD_FN, &guard_body(&s)),
        rights_sql(&s.ident),
    ];
    for t in &TRIGGERS {
        sql.extend(trigger_sql(t, &s.ident));
    }
    tx.batch_execute(&sql.join(";\n"))
        .map_err(err(label, "cannot install the row-version bookkeeping"))
}

/// The rights on the record and its functions, set as [`install`] says.
fn rights_sql(s: &str) -> String {
    let writers = format!(
        "SELECT DISTINCT a.grantee FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a \
         WHERE c.relnamespace = {s_lit}::pg_catalog.regnamespace AND c.relname IN ('{TABLE}', '{}') \
         AND a.privilege_type IN ('INSERT', 'UPDATE') AND a.grantee <> c.relowner AND a.grantee <> 0",
        audit::TABLE,
        s_lit = format_args!("'{}'", s.replace('\'', "''"))
    );
    format!(
        "REVOKE ALL ON {s}.{CHANGES} FROM PUBLIC;\n\
         REVOKE ALL ON FUNCTION {s}.{STAMP_FN}(), {s}.{GUARD_FN}() FROM PUBLIC;\n\
         DO $fleet_retire$ DECLARE g oid; f text; BEGIN\n\
         FOR g IN SELECT DISTINCT a.grantee FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a \
         WHERE c.oid = '{s}.{CHANGES}'::pg_catalog.regclass AND a.grantee <> c.relowner AND a.grantee <> 0 LOOP\n\
         EXECUTE pg_catalog.format('REVOKE ALL ON {s}.{CHANGES} FROM %I', g::pg_catalog.regrole::text); END LOOP;\n\
         FOREACH f IN ARRAY ARRAY['{s}.{STAMP_FN}()', '{s}.{GUARD_FN}()'] LOOP\n\
         FOR g IN SELECT DISTINCT a.grantee FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a \
         WHERE p.oid = f::pg_catalog.regprocedure AND a.grantee <> p.proowner AND a.grantee <> 0 LOOP\n\
         EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM %I', f, g::pg_catalog.regrole::text); END LOOP; END LOOP;\n\
         FOR g IN {writers} LOOP\n\
         EXECUTE pg_catalog.format('GRANT SELECT, INSERT, UPDATE ON {s}.{CHANGES} TO %I', g::pg_catalog.regrole::text); END LOOP;\n\
         END $fleet_retire$"
    )
}

/// The statements that (re)create one of our triggers.
fn trigger_sql(t: &Trigger, s: &str) -> [String; 3] {
    let events = match t.tgtype {
        29 => "AFTER INSERT OR UPDATE OR DELETE",
        31 => "BEFORE INSERT OR UPDATE OR DELETE",
        32 => "AFTER TRUNCATE",
        _ => "BEFORE TRUNCATE",
    };
    let each = if t.tgtype & 1 == 1 {
        "ROW"
    } else {
        "STATEMENT"
    };
    [
        format!("DROP TRIGGER IF EXISTS {} ON {s}.{}", t.name, t.table),
        format!(
            "CREATE TRIGGER {} {events} ON {s}.{} FOR EACH {each} EXECUTE FUNCTION {s}.{}()",
            t.name, t.table, t.function
        ),
        format!(
            "ALTER TABLE {s}.{} ENABLE ALWAYS TRIGGER {}",
            t.table, t.name
        ),
    ]
}

/// Every trigger on our three tables that is not exactly one of ours
/// (name, events, function and its text, no arguments, enabled `ALWAYS`,
/// run with its caller's rights), as `trigger "name" on "table"`; and
/// whether all of ours are there. A trigger the version before this one
/// installed (a `SECURITY DEFINER` stamp) is neither: apply installs ours
/// over it when its role owns the tables, and meanwhile reads the whole
/// registry.
pub fn triggers(client: &mut impl GenericClient, label: &str) -> Result<(Vec<String>, bool)> {
    let s = schema(client, label)?;
    let rows = client
        .query(
            "SELECT t.tgname::text, c.relname::text, t.tgtype, t.tgargs, t.tgenabled::text, \
             t.tgqual IS NULL AND t.tgconstraint = 0 AND t.tgattr::text = '', \
             p.proname::text, p.pronamespace = c.relnamespace, l.lanname::text, p.prosrc, \
             p.prosecdef, pg_catalog.array_to_string(p.proconfig, '|'), p.pronargs = 0 \
             FROM pg_catalog.pg_trigger t \
             JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid \
             JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid \
             JOIN pg_catalog.pg_language l ON l.oid = p.prolang \
             WHERE NOT t.tgisinternal \
             AND c.relnamespace = pg_catalog.current_schema()::pg_catalog.regnamespace \
             AND c.relname = ANY($1) ORDER BY 2, 1",
            &[&&TABLES[..]],
        )
        .map_err(err(label, "cannot inspect the triggers"))?;
    let mut foreign = Vec::new();
    let mut found = 0;
    for r in rows {
        let (name, table): (String, String) = (r.get(0), r.get(1));
        let ours = TRIGGERS.iter().find(|t| t.name == name && t.table == table);
        let common = |t: &Trigger| {
            r.get::<_, i16>(2) == t.tgtype
                && r.get::<_, String>(4) == "A"
                && r.get::<_, bool>(5)
                && r.get::<_, String>(6) == t.function
                && r.get::<_, bool>(7)
                && r.get::<_, String>(8) == "plpgsql"
                && r.get::<_, Option<String>>(11).as_deref() == Some(CONFIG)
                && r.get::<_, bool>(12)
        };
        let (args, body, definer): (Vec<u8>, String, bool) = (r.get(3), r.get(9), r.get(10));
        let current = ours.is_some_and(|t| {
            let want = if t.function == GUARD_FN {
                guard_body(&s)
            } else {
                stamp_body(&s)
            };
            common(t) && args.is_empty() && body == want && !definer
        });
        let legacy = ours.is_some_and(|t| common(t) && legacy::matches(t, &s.ident, &args, &body));
        if current {
            found += 1;
        } else if !legacy {
            foreign.push(format!("trigger {name:?} on {table:?}"));
        }
    }
    Ok((foreign, found == TRIGGERS.len()))
}

/// Every catalog row that shapes our tables and functions, with the
/// transaction that last wrote it: any DDL on them moves it.
pub fn catalog_stamp(client: &mut impl GenericClient, label: &str) -> Result<String> {
    let row = client
        .query_one(
            "WITH rel AS (SELECT c.oid FROM pg_catalog.pg_class c \
             WHERE c.relnamespace = pg_catalog.current_schema()::pg_catalog.regnamespace \
             AND c.relname = ANY($1)) \
             SELECT coalesce(pg_catalog.string_agg(s, ',' ORDER BY s), '') FROM ( \
             SELECT 'c' || c.oid || '@' || c.xmin FROM pg_catalog.pg_class c JOIN rel USING (oid) \
             UNION ALL SELECT 'a' || a.attrelid || '.' || a.attnum || '@' || a.xmin \
             FROM pg_catalog.pg_attribute a JOIN rel ON a.attrelid = rel.oid \
             UNION ALL SELECT 'd' || d.oid || '@' || d.xmin FROM pg_catalog.pg_attrdef d JOIN rel ON d.adrelid = rel.oid \
             UNION ALL SELECT 't' || t.oid || '@' || t.xmin FROM pg_catalog.pg_trigger t JOIN rel ON t.tgrelid = rel.oid \
             UNION ALL SELECT 'r' || w.oid || '@' || w.xmin FROM pg_catalog.pg_rewrite w JOIN rel ON w.ev_class = rel.oid \
             UNION ALL SELECT 'o' || o.oid || '@' || o.xmin FROM pg_catalog.pg_policy o JOIN rel ON o.polrelid = rel.oid \
             UNION ALL SELECT 'k' || k.oid || '@' || k.xmin FROM pg_catalog.pg_constraint k JOIN rel ON k.conrelid = rel.oid \
             UNION ALL SELECT 'i' || i.indexrelid || '@' || i.xmin FROM pg_catalog.pg_index i JOIN rel ON i.indrelid = rel.oid \
             UNION ALL SELECT 'n' || n.oid || '@' || n.xmin FROM pg_catalog.pg_namespace n \
             WHERE n.oid = pg_catalog.current_schema()::pg_catalog.regnamespace \
             UNION ALL SELECT 'p' || p.oid || '@' || p.xmin FROM pg_catalog.pg_proc p \
             WHERE p.pronamespace = pg_catalog.current_schema()::pg_catalog.regnamespace AND p.proname = ANY($2) \
             ) x(s)",
            &[&&TABLES[..], &&[STAMP_FN, GUARD_FN][..]],
        )
        .map_err(err(label, "cannot read the catalog's stamp"))?;
    Ok(row.get(0))
}

/// The server this session is on: its start time and this database's oid
/// (a failover or restart moves it).
pub fn server(client: &mut impl GenericClient, label: &str) -> Result<String> {
    let row = client
        .query_one(
            "SELECT pg_catalog.pg_postmaster_start_time()::text || ' db ' || d.oid::text \
             || CASE WHEN pg_catalog.pg_is_in_recovery() THEN ' standby' ELSE '' END \
             FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database()",
            &[],
        )
        .map_err(err(label, "cannot tell which server this is"))?;
    Ok(row.get(0))
}

/// This transaction's snapshot, as text.
pub fn snapshot(client: &mut impl GenericClient, label: &str) -> Result<String> {
    let row = client
        .query_one("SELECT pg_catalog.pg_current_snapshot()::text", &[])
        .map_err(err(label, "cannot read the snapshot"))?;
    Ok(row.get(0))
}

/// The keys stamped by transactions `snapshot` does not see.
pub fn changed_keys(
    client: &mut impl GenericClient,
    snapshot: &str,
    label: &str,
) -> Result<Vec<String>> {
    let rows = client
        .query(
            &format!(
                "SELECT key FROM {CHANGES} WHERE xid >= pg_catalog.pg_snapshot_xmin($1::text::pg_catalog.pg_snapshot) \
                 AND NOT pg_catalog.pg_visible_in_snapshot(xid, $1::text::pg_catalog.pg_snapshot) ORDER BY key"
            ),
            &[&snapshot],
        )
        .map_err(err(label, "cannot read the change record"))?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// A key this transaction stamped; for an audit key, its row's apply id
/// and worker identity (`None` for a registry key or an audit row no
/// longer there).
pub struct OwnKey {
    /// `i:` and a worker identity, or `a:` and an audit row's id.
    pub key: String,
    /// The audit row's apply id.
    pub apply_id: Option<String>,
    /// The worker the audit row names.
    pub worker_identity: Option<String>,
}

/// The keys this transaction stamped, each audit row looked up by its own
/// key (the audit table's primary key): under SERIALIZABLE this reads the
/// index pages of the rows this transaction wrote and nothing of other
/// applies' rows, where a search of the audit table by apply id would
/// scan it and conflict with every apply inserting meanwhile. A key on
/// several audit rows comes back once per row (and is counted so).
pub fn own_keys(client: &mut impl GenericClient, label: &str) -> Result<Vec<OwnKey>> {
    let rows = client
        .query(
            &format!(
                "SELECT c.key, a.apply_id::text, a.worker_identity::text \
                 FROM {CHANGES} c LEFT JOIN LATERAL (SELECT x.apply_id, x.worker_identity \
                 FROM {table} x WHERE x.{key} = \
                 CASE WHEN c.key ~ '^a:[0-9]{{1,18}}$' THEN pg_catalog.substr(c.key, 3)::bigint END) a ON true \
                 WHERE c.xid = pg_catalog.pg_current_xact_id()",
                table = audit::TABLE,
                key = audit::KEY
            ),
            &[],
        )
        .map_err(err(label, "cannot read this transaction's change record"))?;
    Ok(rows
        .iter()
        .map(|r| OwnKey {
            key: r.get(0),
            apply_id: r.get(1),
            worker_identity: r.get(2),
        })
        .collect())
}

/// `registry versions`: in one transaction, the registry's shape checked
/// as apply checks it, then the record installed; `false` when it was
/// whole already.
pub fn install_checked(url: &super::PgUrl) -> Result<bool> {
    let label = url.to_string();
    let mut client = super::connect_to(url, Store::Registry)?;
    if !supported(&mut client, &label)? {
        return Err(super::registry_error(
            &label,
            "keeps no change record before PostgreSQL 13 (`pg_current_snapshot`, `xid8`); \
             apply reads the whole registry inside its transaction there",
        ));
    }
    let mut tx = client
        .transaction()
        .map_err(err(&label, "cannot begin the install"))?;
    if let Some(why) = not_ours(&mut tx, false, &label)? {
        return Err(super::registry_error(&label, why));
    }
    if vouches(&mut tx, &label)?.is_none() {
        // Whole already; a writer granted rights on our tables since is
        // granted its rights on the record.
        let s = schema(&mut tx, &label)?;
        tx.batch_execute(&rights_sql(&s.ident)).map_err(err(
            &label,
            "cannot grant the writers their rights on the record",
        ))?;
        tx.commit()
            .map_err(err(&label, "cannot commit the grants"))?;
        return Ok(super::scope::create_indexes(&mut client, &label, true)? > 0);
    }
    if let Some(why) = super::untrusted_objects(&mut tx, &label)? {
        return Err(super::registry_error(&label, why));
    }
    super::migrate_audit_in(&mut tx, &label)?;
    install(&mut tx, &label).map_err(|e| {
        super::registry_error(
            &label,
            format!("{e}; connect as the role that owns worker_registrations and retirement_audit"),
        )
    })?;
    if let Some(why) = vouches(&mut tx, &label)? {
        return Err(super::registry_error(
            &label,
            format!(
                "the change record cannot vouch for the rows after its install: {why}. Nothing \
                 was installed; drop the table {CHANGES} (it holds only stamps) and run \
                 `fleet-retire registry versions` again as the tables' owner"
            ),
        ));
    }
    tx.commit()
        .map_err(err(&label, "cannot commit the install"))?;
    // The host scope's indexes, each built without holding up the writers
    // (`CREATE INDEX CONCURRENTLY`, outside any transaction).
    super::scope::create_indexes(&mut client, &label, true)?;
    Ok(true)
}

/// Why the change record, though its triggers are ours, cannot vouch for
/// the rows: the record's table not of our shape (`key text` in the
/// default collation, `xid xid8 NOT NULL`, its only unique index the key,
/// logged), a right on it beyond a writer's (see [`grants_problem`]), a
/// function of ours that a role other than its owner may execute, or that
/// is owned by another role than one of the tables it is attached to, a
/// worker identity that is not `text` (its stamp's key would not read back
/// as the row's), or a server in recovery (a standby's snapshot lists no
/// transaction in progress).
pub fn shape_problem(client: &mut impl GenericClient, label: &str) -> Result<Option<String>> {
    let row = client
        .query_one(
            &format!(
                "WITH t AS (SELECT c.oid, c.relowner, c.relpersistence, c.relacl \
                 FROM pg_catalog.pg_class c WHERE c.relname = '{CHANGES}' \
                 AND c.relnamespace = pg_catalog.current_schema()::pg_catalog.regnamespace), \
                 f AS (SELECT p.proowner, p.proacl FROM pg_catalog.pg_proc p \
                 WHERE p.proname IN ('{STAMP_FN}', '{GUARD_FN}') \
                 AND p.pronamespace = pg_catalog.current_schema()::pg_catalog.regnamespace) \
                 SELECT pg_catalog.pg_is_in_recovery(), \
                 (SELECT pg_catalog.string_agg(a.attname || ' ' || pg_catalog.format_type(a.atttypid, a.atttypmod) \
                    || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END \
                    || CASE WHEN a.attcollation NOT IN (0, 100, 950) THEN ' collate ' || a.attcollation ELSE '' END, \
                    ', ' ORDER BY a.attnum) \
                  FROM pg_catalog.pg_attribute a, t WHERE a.attrelid = t.oid AND a.attnum > 0 AND NOT a.attisdropped), \
                 (SELECT t.relpersistence::text FROM t), \
                 (SELECT pg_catalog.string_agg(pg_catalog.pg_get_indexdef(i.indexrelid), '; ' ORDER BY 1) \
                  FROM pg_catalog.pg_index i, t WHERE i.indrelid = t.oid AND i.indisunique), \
                 (SELECT count(*) FROM t, pg_catalog.aclexplode(t.relacl) a WHERE a.grantee <> t.relowner \
                  AND (a.grantee = 0 OR a.privilege_type NOT IN ('SELECT', 'INSERT', 'UPDATE'))), \
                 (SELECT count(*) FROM f, pg_catalog.pg_class c WHERE c.relname IN ('{TABLE}', '{audit}', '{CHANGES}') \
                  AND c.relnamespace = pg_catalog.current_schema()::pg_catalog.regnamespace AND f.proowner <> c.relowner), \
                 (SELECT count(*) FROM f, pg_catalog.aclexplode(coalesce(f.proacl, pg_catalog.acldefault('f', f.proowner))) a \
                  WHERE a.grantee <> f.proowner), \
                 (SELECT pg_catalog.format_type(a.atttypid, a.atttypmod) FROM pg_catalog.pg_attribute a \
                  WHERE a.attrelid = (SELECT c.oid FROM pg_catalog.pg_class c WHERE c.relname = '{TABLE}' \
                  AND c.relnamespace = pg_catalog.current_schema()::pg_catalog.regnamespace) \
                  AND a.attname = 'worker_identity' AND NOT a.attisdropped)",
                audit = audit::TABLE
            ),
            &[],
        )
        .map_err(err(label, "cannot inspect the change record"))?;
    let in_recovery: bool = row.get(0);
    let columns: Option<String> = row.get(1);
    let persistence: Option<String> = row.get(2);
    let unique: Option<String> = row.get(3);
    let (granted, foreign_owner, executable): (i64, i64, i64) =
        (row.get(4), row.get(5), row.get(6));
    let identity: Option<String> = row.get(7);
    let unique_ok = unique.as_deref().is_some_and(|u| {
        !u.contains(';')
            && u.starts_with("CREATE UNIQUE INDEX")
            && u.ends_with(" USING btree (key)")
    });
    Ok(if in_recovery {
        Some("the server is a standby in recovery".into())
    } else if columns.as_deref() != Some("key text not null, xid xid8 not null") {
        Some(format!(
            "the change record's columns are {:?}, not ours",
            columns.unwrap_or_default()
        ))
    } else if persistence.as_deref() != Some("p") || !unique_ok {
        Some("the change record is unlogged, or keyed otherwise than by `key` alone".into())
    } else if granted > 0 {
        Some(format!(
            "the change record grants rights beyond SELECT, INSERT and UPDATE, or grants to \
             PUBLIC: revoke them (REVOKE ALL ON {CHANGES} FROM …) or run `fleet-retire registry \
             versions` as its owner"
        ))
    } else if foreign_owner > 0 {
        Some(
            "a function of the change record is owned by another role than a table it is \
             attached to"
                .into(),
        )
    } else if executable > 0 {
        Some(format!(
            "a role other than its owner may execute {STAMP_FN} or {GUARD_FN}: run \
             `fleet-retire registry versions` as their owner, which revokes it"
        ))
    } else if identity.as_deref() != Some("text") {
        Some("worker_identity is not of type text".into())
    } else {
        None
    })
}

/// What `registry copy`, `registry versions` or apply's install would use
/// but did not make: a table of ours (the lease table too, `with_leases`)
/// or a function of ours that
/// exists and is owned by another role than the one connected (a role
/// that owns a table can alter it and run code as whoever writes it; we
/// never adopt an object someone else made).
pub fn not_ours(
    client: &mut impl GenericClient,
    with_leases: bool,
    label: &str,
) -> Result<Option<String>> {
    let mut tables = vec![TABLE, audit::TABLE, CHANGES];
    if with_leases {
        tables.push(crate::store::leases::TABLE);
    }
    let rows = client
        .query(
            "SELECT CASE c.relkind WHEN 'r' THEN 'table' ELSE 'relation' END || ' ' \
             || pg_catalog.quote_ident(c.relname), c.relowner::pg_catalog.regrole::text \
             FROM pg_catalog.pg_class c \
             WHERE c.relnamespace = pg_catalog.current_schema()::pg_catalog.regnamespace \
             AND c.relname = ANY($1) AND c.relowner <> (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user) \
             UNION ALL SELECT 'function ' || pg_catalog.quote_ident(p.proname), p.proowner::pg_catalog.regrole::text \
             FROM pg_catalog.pg_proc p \
             WHERE p.pronamespace = pg_catalog.current_schema()::pg_catalog.regnamespace \
             AND p.proname = ANY($2) AND p.proowner <> (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user) \
             ORDER BY 1",
            &[
                &tables,
                &&[STAMP_FN, GUARD_FN][..],
            ],
        )
        .map_err(err(label, "cannot read who owns the registry's tables"))?;
    let who = client
        .query_one("SELECT current_user::text", &[])
        .map_err(err(label, "cannot read the role connected"))?
        .get::<_, String>(0);
    Ok((!rows.is_empty()).then(|| {
        let named: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "{} is owned by {}",
                    r.get::<_, String>(0),
                    r.get::<_, String>(1)
                )
            })
            .collect();
        format!(
            "{}, not by {who}, the role connected; fleet-retire never adopts an object another \
             role made (its owner could alter it and run code as whoever writes it). Nothing was \
             written. Connect as that object's owner if it is the fleet's owner role, or have a \
             superuser drop it or `ALTER ... OWNER TO {who}`, then run this again",
            named.join("; ")
        )
    }))
}

/// Whether the record vouches here: our triggers all there and nothing
/// else, and no [`shape_problem`]; the reason when it does not.
pub fn vouches(client: &mut impl GenericClient, label: &str) -> Result<Option<String>> {
    let (foreign, whole) = triggers(client, label)?;
    if !foreign.is_empty() || !whole {
        return Ok(Some(
            "the change record's triggers are not all there as installed".into(),
        ));
    }
    shape_problem(client, label)
}

/// A right on the change record beyond a writer's (`SELECT`, `INSERT`,
/// `UPDATE`, which let a role only mark a row changed), or any right
/// granted to `PUBLIC`: a role that may put a trigger on the record, or
/// delete from it, could hide a change. Refused like a foreign trigger.
pub fn grants_problem(client: &mut impl GenericClient, label: &str) -> Result<Option<String>> {
    let row = client
        .query_one(
            &format!(
                "SELECT pg_catalog.string_agg(DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' \
                 ELSE a.grantee::pg_catalog.regrole::text END || ' (' || a.privilege_type || ')', ', ') \
                 FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a \
                 WHERE c.relname = '{CHANGES}' \
                 AND c.relnamespace = pg_catalog.current_schema()::pg_catalog.regnamespace \
                 AND a.grantee <> c.relowner \
                 AND (a.grantee = 0 OR a.privilege_type NOT IN ('SELECT', 'INSERT', 'UPDATE'))"
            ),
            &[],
        )
        .map_err(err(label, "cannot inspect the change record's grants"))?;
    Ok(row.get::<_, Option<String>>(0).map(|roles| {
        format!(
            "table {CHANGES:?} grants {roles}: writers may hold only SELECT, INSERT and UPDATE on \
             it, and PUBLIC nothing (revoke the rest, or run `fleet-retire registry versions` as \
             its owner)"
        )
    }))
}

//! The change record's triggers as the version before this one installed
//! them: a `SECURITY DEFINER` stamp that converted the whole row to JSON,
//! told the tables apart by its arguments, and so ran code of a type's
//! owner's choosing with the record's owner's rights (docs/security.md,
//! row 50.1). They are recognised only so that an upgrade is not refused
//! as a foreign trigger: such a record never vouches, and apply (as the
//! tables' owner) or `registry versions` installs ours over it.

use super::{Trigger, CHANGES, GUARD_FN};

/// Whether a trigger of ours by name has the arguments and function text
/// the previous version gave it.
pub(super) fn matches(t: &Trigger, schema: &str, args: &[u8], body: &str) -> bool {
    if t.function == GUARD_FN {
        return args.is_empty() && body == guard_body();
    }
    let (kind, column) = match (t.table, t.tgtype) {
        (crate::store::registry::TABLE, 32) => ("i", ""),
        (crate::store::registry::TABLE, _) => ("i", "worker_identity"),
        (_, 32) => ("a", ""),
        _ => ("a", crate::store::audit::KEY),
    };
    args == format!("{kind}\0{column}\0").as_bytes() && body == stamp_body(schema)
}

fn stamp_body(schema: &str) -> String {
    let upsert = |key: &str| {
        format!(
            "INSERT INTO {schema}.{CHANGES} (key, xid) VALUES ({key}, pg_current_xact_id()) \
             ON CONFLICT (key) DO UPDATE SET xid = excluded.xid;"
        )
    };
    let key =
        |row: &str| format!("TG_ARGV[0] || coalesce(':' || (to_jsonb({row}) ->> TG_ARGV[1]), '')");
    format!(
        "\nBEGIN\n\
         IF TG_LEVEL = 'STATEMENT' THEN\n{}\nRETURN NULL;\nEND IF;\n\
         IF TG_OP IN ('UPDATE', 'DELETE') THEN\n{}\nEND IF;\n\
         IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND \
         (to_jsonb(OLD) ->> TG_ARGV[1]) IS DISTINCT FROM (to_jsonb(NEW) ->> TG_ARGV[1])) THEN\n{}\nEND IF;\n\
         RETURN NULL;\nEND\n",
        upsert("'t:' || TG_ARGV[0]"),
        upsert(&key("OLD")),
        upsert(&key("NEW")),
    )
}

fn guard_body() -> String {
    "\nBEGIN\n\
     IF TG_OP IN ('DELETE', 'TRUNCATE') OR (TG_OP = 'UPDATE' AND NEW.key IS DISTINCT FROM OLD.key) THEN\n\
     RAISE EXCEPTION 'fleet-retire: the change record keeps every key; it is never deleted, truncated or renamed';\n\
     END IF;\n\
     NEW.xid := pg_current_xact_id();\nRETURN NEW;\nEND\n"
        .to_string()
}

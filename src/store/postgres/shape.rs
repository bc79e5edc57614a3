//! The shape checks of a PostgreSQL registry and lease store: what the
//! database could run or hide inside apply's reads and writes (triggers,
//! rules, row-level security, views, event triggers, code called by
//! constraints, defaults and indexes), each refused before it can act
//! (docs/security.md, rows 12, 30.1, 41.3, 41.4).

use super::{registry_error, table_columns};
use crate::error::{Error, Result, Store};
use postgres::GenericClient;

/// Why the registry database could make apply's writes differ from what
/// it reports, if it could: a trigger or rule on the registry or audit
/// table, row-level security on either (rows apply cannot see), or either
/// being something other than a plain table.
pub fn untrusted_objects(client: &mut impl GenericClient, label: &str) -> Result<Option<String>> {
    let err = Error::postgres(Store::Registry, label, "cannot inspect the schema");
    // The change record (`super::versions`) is checked as our tables are.
    let tables = super::versions::TABLES;
    // Triggers and rules: either could turn apply's writes into others.
    // The change record's own triggers are allowed exactly as installed.
    let mut problems = super::versions::triggers(client, label)?.0;
    problems.extend(super::versions::grants_problem(client, label)?);
    for r in client
        .query(
            "SELECT rulename::text, tablename::text FROM pg_rules \
             WHERE schemaname = pg_catalog.current_schema() AND tablename = ANY($1) ORDER BY 1",
            &[&&tables[..]],
        )
        .map_err(err)?
    {
        problems.push(format!(
            "rule {:?} on {:?}",
            r.get::<_, String>(0),
            r.get::<_, String>(1)
        ));
    }
    for r in client
        .query(
            "SELECT relname::text, relkind::text, relrowsecurity FROM pg_class \
             WHERE relnamespace = pg_catalog.current_schema()::regnamespace AND relname = ANY($1) ORDER BY 1",
            &[&&tables[..]],
        )
        .map_err(err)?
    {
        let (name, kind, rls): (String, String, bool) = (r.get(0), r.get(1), r.get(2));
        if kind != "r" {
            problems.push(format!("{name:?} is not a plain table (relkind {kind})"));
        }
        if rls {
            problems.push(format!(
                "{name:?} has row-level security, which can hide rows from apply"
            ));
        }
    }
    problems.extend(code_that_writes_can_run(client, &tables, label)?);
    problems.extend(columns_of_foreign_types(
        client,
        &tables,
        Store::Registry,
        label,
    )?);
    if let Some(existing) =
        table_columns(client, crate::store::audit::TABLE, Store::Registry, label)?
    {
        let foreign: Vec<&String> = existing
            .iter()
            .map(|(n, _)| n)
            .filter(|c| {
                *c != crate::store::audit::KEY
                    && !crate::store::audit::COLUMNS.iter().any(|(n, _)| n == c)
            })
            .collect();
        if !foreign.is_empty() {
            problems.push(format!(
                "table {:?} has columns that are not fleet-retire's ({})",
                crate::store::audit::TABLE,
                foreign
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    Ok((!problems.is_empty()).then(|| {
        format!(
            "the registry database holds objects that could make apply's writes differ from \
             its report: {}. Nothing was written. A registry needs none of them: inspect them \
             (psql: \\d {}) and drop them, then apply again",
            problems.join("; "),
            crate::store::registry::TABLE
        )
    }))
}

/// Our tables (by name, in our schema) as a CTE named `ours`.
const OURS: &str = "WITH ours AS (SELECT c.oid FROM pg_catalog.pg_class c \
     WHERE c.relnamespace = pg_catalog.current_schema()::pg_catalog.regnamespace \
     AND c.relname = ANY($1))";

/// Where a write to our tables could run code that is not PostgreSQL's own:
/// an inheritance child or parent (a trigger on a child fires for rows
/// written through the parent); a foreign key into or out of our tables
/// (a cascade writes another table, whose triggers are its own); and any
/// constraint, column default, generated column or index expression that
/// calls a function or operator outside `pg_catalog`, or one of
/// `pg_catalog`'s that is volatile or runs SQL it is given as text or by a
/// relation's name (`query_to_xml`, `table_to_xml`, `ts_stat`, …): such a
/// call runs any function it names while only `pg_catalog` appears in the
/// catalog's dependencies (docs/security.md, row 41.12).
fn code_that_writes_can_run(
    client: &mut impl GenericClient,
    tables: &[&str],
    label: &str,
) -> Result<Vec<String>> {
    let err = Error::postgres(Store::Registry, label, "cannot inspect the schema");
    let queries = [
        format!(
            "{OURS} SELECT pg_catalog.format('inheritance: %s inherits from %s', \
             i.inhrelid::pg_catalog.regclass, i.inhparent::pg_catalog.regclass) \
             FROM pg_catalog.pg_inherits i \
             WHERE i.inhparent IN (SELECT oid FROM ours) OR i.inhrelid IN (SELECT oid FROM ours) \
             ORDER BY 1"
        ),
        format!(
            "{OURS} SELECT pg_catalog.format('foreign key %I from %s to %s', k.conname, \
             k.conrelid::pg_catalog.regclass, k.confrelid::pg_catalog.regclass) \
             FROM pg_catalog.pg_constraint k WHERE k.contype = 'f' \
             AND (k.conrelid IN (SELECT oid FROM ours) OR k.confrelid IN (SELECT oid FROM ours)) \
             ORDER BY 1"
        ),
        format!(
            "{OURS}, objs AS ( \
               SELECT 'pg_catalog.pg_attrdef'::pg_catalog.regclass AS cls, d.oid AS obj \
                 FROM pg_catalog.pg_attrdef d WHERE d.adrelid IN (SELECT oid FROM ours) \
               UNION ALL SELECT 'pg_catalog.pg_constraint'::pg_catalog.regclass, k.oid \
                 FROM pg_catalog.pg_constraint k WHERE k.conrelid IN (SELECT oid FROM ours) \
               UNION ALL SELECT 'pg_catalog.pg_class'::pg_catalog.regclass, x.indexrelid \
                 FROM pg_catalog.pg_index x WHERE x.indrelid IN (SELECT oid FROM ours)) \
             SELECT pg_catalog.format('%s calls %s', pg_catalog.pg_describe_object(o.cls, o.obj, 0), \
               pg_catalog.pg_describe_object(dep.refclassid, dep.refobjid, 0)) \
             FROM objs o JOIN pg_catalog.pg_depend dep ON dep.classid = o.cls AND dep.objid = o.obj \
             WHERE (dep.refclassid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND EXISTS ( \
                 SELECT 1 FROM pg_catalog.pg_proc p WHERE p.oid = dep.refobjid \
                 AND p.pronamespace <> 'pg_catalog'::pg_catalog.regnamespace)) \
                OR (dep.refclassid = 'pg_catalog.pg_operator'::pg_catalog.regclass AND EXISTS ( \
                 SELECT 1 FROM pg_catalog.pg_operator p WHERE p.oid = dep.refobjid \
                 AND p.oprnamespace <> 'pg_catalog'::pg_catalog.regnamespace)) \
             ORDER BY 1"
        ),
        // PostgreSQL records no dependency on its own (pinned) functions,
        // so those are found in the stored expression trees themselves:
        // every function and operator an expression calls.
        format!(
            "{OURS}, exprs AS ( \
               SELECT pg_catalog.format('constraint %I', k.conname) AS what, k.conbin::pg_catalog.text AS tree \
                 FROM pg_catalog.pg_constraint k WHERE k.conrelid IN (SELECT oid FROM ours) AND k.conbin IS NOT NULL \
               UNION ALL SELECT pg_catalog.format('default of %s column %s', d.adrelid::pg_catalog.regclass, d.adnum), \
                 d.adbin::pg_catalog.text FROM pg_catalog.pg_attrdef d WHERE d.adrelid IN (SELECT oid FROM ours) \
               UNION ALL SELECT pg_catalog.format('index %s', x.indexrelid::pg_catalog.regclass), \
                 pg_catalog.concat(x.indexprs::pg_catalog.text, ' ', x.indpred::pg_catalog.text) \
                 FROM pg_catalog.pg_index x WHERE x.indrelid IN (SELECT oid FROM ours)), \
             called AS ( \
               SELECT e.what, m[1]::pg_catalog.oid AS fn FROM exprs e, \
                 pg_catalog.regexp_matches(e.tree, ':(?:funcid|opfuncid) ([0-9]+)', 'g') AS m \
               UNION SELECT e.what, o.oprcode::pg_catalog.oid FROM exprs e, \
                 pg_catalog.regexp_matches(e.tree, ':opno ([0-9]+)', 'g') AS m \
                 JOIN pg_catalog.pg_operator o ON o.oid = m[1]::pg_catalog.oid) \
             SELECT DISTINCT pg_catalog.format('%s calls %s', c.what, p.oid::pg_catalog.regprocedure) \
             FROM called c JOIN pg_catalog.pg_proc p ON p.oid = c.fn \
             WHERE p.provolatile = 'v' \
               OR p.proname::pg_catalog.text OPERATOR(pg_catalog.~) '(to_xml|xmlschema|^ts_stat$)' \
             ORDER BY 1"
        ),
    ];
    let mut problems = Vec::new();
    for sql in &queries {
        for r in client.query(sql.as_str(), &[&tables]).map_err(err)? {
            problems.push(r.get::<_, String>(0));
        }
    }
    Ok(problems)
}

/// Why the lease table cannot be trusted to show every lease, if it
/// cannot: it must be a plain table (not a view, a partitioned or foreign
/// table), without row-level security (a policy can hide leases from the
/// controller's role alone while workers still see theirs), and without a
/// rule or a trigger of any enabled state (`ENABLE ALWAYS` and `ENABLE
/// REPLICA` ones fire whatever `session_replication_role` says). A lease
/// this program does not see protects nothing (docs/security.md, "the
/// lease store's shape").
pub(super) fn lease_shape_problem(
    client: &mut impl GenericClient,
    label: &str,
) -> Result<Option<String>> {
    let err = Error::postgres(Store::Leases, label, "cannot inspect the lease table");
    let table = crate::store::leases::TABLE;
    let mut problems = Vec::new();
    for r in client
        .query(
            "SELECT c.relkind::text, c.relrowsecurity, c.relforcerowsecurity FROM pg_catalog.pg_class c \
             WHERE c.relnamespace = pg_catalog.current_schema()::pg_catalog.regnamespace \
             AND c.relname = $1",
            &[&table],
        )
        .map_err(err)?
    {
        let (kind, rls, forced): (String, bool, bool) = (r.get(0), r.get(1), r.get(2));
        if kind != "r" {
            problems.push(format!("{table:?} is not a plain table (relkind {kind})"));
        }
        if rls || forced {
            problems.push(format!(
                "{table:?} has row-level security, which can hide leases from this role"
            ));
        }
    }
    problems.extend(columns_of_foreign_types(
        client,
        &[table],
        Store::Leases,
        label,
    )?);
    for (kind, sql) in [
        (
            "trigger",
            "SELECT t.tgname::text FROM pg_catalog.pg_trigger t \
             JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid \
             WHERE NOT t.tgisinternal \
             AND c.relnamespace = pg_catalog.current_schema()::pg_catalog.regnamespace \
             AND c.relname = $1 ORDER BY 1",
        ),
        (
            "rule",
            "SELECT rulename::text FROM pg_catalog.pg_rules \
             WHERE schemaname = pg_catalog.current_schema() AND tablename = $1 ORDER BY 1",
        ),
    ] {
        for r in client.query(sql, &[&table]).map_err(err)? {
            problems.push(format!("{kind} {:?} on {table:?}", r.get::<_, String>(0)));
        }
    }
    Ok((!problems.is_empty()).then(|| {
        format!(
            "the lease table could show fewer leases than the workers hold: {}. The lease \
             store must hold `{table}` as a plain table of PostgreSQL's own column types, with \
             no row-level security, rule or trigger; inspect it (psql: \\d+ {table}) and remove what is named, or point \
             --leases at the control plane's own lease store",
            problems.join("; ")
        )
    }))
}

/// Event triggers that could fire inside apply's transaction (on the DDL
/// of its migrations) and run code no shape check of a table names: any
/// not disabled, whatever `session_replication_role` says.
pub fn enabled_event_triggers(client: &mut impl GenericClient, label: &str) -> Result<Vec<String>> {
    Ok(client
        .query(
            "SELECT pg_catalog.format('event trigger %I on %s (enabled %s)', evtname, evtevent, \
             evtenabled) FROM pg_catalog.pg_event_trigger WHERE evtenabled <> 'D' ORDER BY 1",
            &[],
        )
        .map_err(Error::postgres(
            Store::Registry,
            label,
            "cannot inspect the event triggers",
        ))?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// Before and after the DDL of a migration (adding a missing column or
/// table, inside apply's or a copy's transaction): an enabled event trigger
/// would fire on it and run code inside the transaction, before the effect
/// check's first image, that no shape check of a table names. One found
/// before refuses the DDL; one found after (created meanwhile) may have run,
/// so it refuses too and the rollback undoes whatever it did. Only a
/// migration is refused: with every column present no DDL runs, and no
/// event trigger fires on apply's reads and writes.
pub(super) fn no_event_trigger(tx: &mut impl GenericClient, label: &str, when: &str) -> Result<()> {
    let found = enabled_event_triggers(tx, label)?;
    if found.is_empty() {
        return Ok(());
    }
    Err(registry_error(
        label,
        format!(
            "{} would fire on the columns or table this command must add (found {when} adding \
             them), running code inside its transaction; nothing was written. Disable it for \
             the migration (ALTER EVENT TRIGGER … DISABLE; psql: \\dy lists them), or add the \
             missing columns yourself, then run the command again",
            found.join("; ")
        ),
    ))
}

/// Columns of `tables` whose type is a domain or is not one of
/// PostgreSQL's own (`pg_catalog`): such a type can bring its own `=` (or
/// any operator), which an exact type match prefers to `pg_catalog`'s
/// whatever the pinned `search_path` says, so a comparison in our reads
/// (`status = 'active'`) would run code of the database's choosing and
/// could hide a lease. `information_schema` reports a domain over text as
/// `text`, so the catalog is asked directly.
fn columns_of_foreign_types(
    client: &mut impl GenericClient,
    tables: &[&str],
    store: Store,
    label: &str,
) -> Result<Vec<String>> {
    let rows = client
        .query(
            "SELECT pg_catalog.format('column %I of %I has type %s, %s', a.attname, c.relname, \
               t.oid::pg_catalog.regtype, CASE WHEN t.typtype = 'd' THEN 'a domain' \
               ELSE 'not one of PostgreSQL''s own' END) \
             FROM pg_catalog.pg_attribute a \
             JOIN pg_catalog.pg_class c ON c.oid = a.attrelid \
             JOIN pg_catalog.pg_type t ON t.oid = a.atttypid \
             WHERE c.relnamespace = pg_catalog.current_schema()::pg_catalog.regnamespace \
             AND c.relname = ANY($1) AND a.attnum > 0 AND NOT a.attisdropped \
             AND (t.typtype = 'd' OR t.typnamespace <> 'pg_catalog'::pg_catalog.regnamespace) \
             ORDER BY 1",
            &[&tables],
        )
        .map_err(Error::postgres(
            store,
            label,
            "cannot inspect the column types",
        ))?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Why the controller's tables (`store::controller`), where they exist,
/// could run code of someone else's as whoever writes them, one phrase
/// each; empty when each is absent or plainly ours. The controller writes
/// its lease every retry period and its budget inside apply's transaction,
/// so a table of our name that another role made (its owner can add a
/// trigger at any time, run as the controller's role: issue 50's rule,
/// `versions::not_ours`), or that carries a trigger, a rule, row-level
/// security, a grant of `TRIGGER`, or code in a default, constraint or
/// column type, is refused, never adopted. Their owner must be the
/// registry table's (the role connected when there is none yet).
pub fn controller_untrusted(client: &mut impl GenericClient, label: &str) -> Result<Vec<String>> {
    let err = Error::postgres(
        Store::Registry,
        label,
        "cannot inspect the controller's tables",
    );
    let tables: Vec<&str> = crate::store::controller::TABLES
        .iter()
        .map(|(t, _)| *t)
        .collect();
    let owner = format!(
        "{OURS} SELECT pg_catalog.format('%I is owned by %s, not by %s, the owner of %I', \
             c.relname, c.relowner::pg_catalog.regrole, w.o::pg_catalog.regrole, $2::text) \
             FROM pg_catalog.pg_class c JOIN ours USING (oid), \
             (SELECT COALESCE((SELECT r.relowner FROM pg_catalog.pg_class r \
               WHERE r.relname = $2 \
               AND r.relnamespace = pg_catalog.current_schema()::pg_catalog.regnamespace), \
              (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user)) AS o) w \
             WHERE c.relowner <> w.o ORDER BY 1"
    );
    let registry = crate::store::registry::TABLE;
    let mut problems: Vec<String> = client
        .query(owner.as_str(), &[&tables, &registry])
        .map_err(err)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let queries = [
        "SELECT pg_catalog.format('trigger %I on %I', t.tgname, c.relname) \
         FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid \
         WHERE NOT t.tgisinternal AND c.relname = ANY($1) \
         AND c.relnamespace = pg_catalog.current_schema()::pg_catalog.regnamespace ORDER BY 1"
            .into(),
        "SELECT pg_catalog.format('rule %I on %I', rulename, tablename) FROM pg_catalog.pg_rules \
         WHERE schemaname = pg_catalog.current_schema() AND tablename = ANY($1) ORDER BY 1"
            .into(),
        format!(
            "{OURS} SELECT pg_catalog.format('%I has row-level security', c.relname) \
             FROM pg_catalog.pg_class c JOIN ours USING (oid) \
             WHERE c.relrowsecurity ORDER BY 1"
        ),
        format!(
            "{OURS} SELECT DISTINCT pg_catalog.format('%s may put triggers on %I', \
             CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::pg_catalog.regrole::text END, \
             c.relname) FROM pg_catalog.pg_class c JOIN ours USING (oid), \
             pg_catalog.aclexplode(c.relacl) a \
             WHERE a.privilege_type = 'TRIGGER' AND a.grantee <> c.relowner ORDER BY 1"
        ),
    ];
    for q in &queries {
        for r in client.query(q.as_str(), &[&tables]).map_err(err)? {
            problems.push(r.get(0));
        }
    }
    problems.extend(code_that_writes_can_run(client, &tables, label)?);
    problems.extend(columns_of_foreign_types(
        client,
        &tables,
        Store::Registry,
        label,
    )?);
    Ok(problems)
}

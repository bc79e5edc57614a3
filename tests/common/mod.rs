//! Shared helpers for integration tests: real SQLite files, the real binary.
#![allow(dead_code)]

pub mod controller;
pub mod hosts;
pub mod interleave;
pub mod patroni;
pub mod pgproxy;
pub mod pgside;
pub mod reports;
pub mod roles;
pub mod scoped;

use rusqlite::{params_from_iter, Connection};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The built `fleet-retire` binary.
pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fleet-retire"))
}

/// Run the binary and return its output.
pub fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("run fleet-retire")
}

/// stdout + stderr as text.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Every column of the registry schema (docs/semantics.md §5).
pub const COLUMNS: &[(&str, &str)] = &[
    ("worker_identity", "TEXT PRIMARY KEY"),
    ("client_name", "TEXT"),
    ("client_instance_id", "TEXT"),
    ("instance_id_source", "TEXT"),
    ("instance_id_provenance", "TEXT"),
    ("session_id", "TEXT"),
    ("generation_id", "TEXT"),
    ("role", "TEXT"),
    ("profile", "TEXT"),
    ("namespace", "TEXT"),
    ("remote", "TEXT"),
    ("repository_binding", "TEXT"),
    ("authenticated_account", "TEXT"),
    ("fleet_run_id", "TEXT"),
    ("transport", "TEXT"),
    ("process_identity", "TEXT"),
    ("pid", "INTEGER"),
    ("started_at", "TEXT"),
    ("last_heartbeat_at", "TEXT"),
    ("heartbeat_ttl_seconds", "REAL"),
    ("fencing_epoch", "INTEGER"),
    ("status", "TEXT"),
    ("host_id", "TEXT"),
    ("boot_id", "TEXT"),
    ("process_start_time", "TEXT"),
    ("token_fingerprint", "TEXT"),
    ("startup_revision", "TEXT"),
    ("loaded_revision", "TEXT"),
    ("parity_revision", "TEXT"),
    ("live_revision", "TEXT"),
    ("retired_at", "TEXT"),
    ("retired_by", "TEXT"),
    ("retirement_reason", "TEXT"),
];

pub fn sql_value(v: &Value) -> rusqlite::types::Value {
    use rusqlite::types::Value as S;
    match v {
        Value::Null => S::Null,
        Value::Bool(b) => S::Integer(*b as i64),
        Value::Number(n) if n.is_i64() => S::Integer(n.as_i64().unwrap()),
        Value::Number(n) => S::Real(n.as_f64().unwrap()),
        Value::String(s) => S::Text(s.clone()),
        other => S::Text(other.to_string()),
    }
}

/// Create a registry holding `rows` (JSON objects; missing columns NULL),
/// with only the given columns (None: all of them).
pub fn registry_with_columns(path: &Path, columns: Option<&[&str]>, rows: &[Value]) {
    let conn = Connection::open(path).unwrap();
    let cols: Vec<(&str, &str)> = COLUMNS
        .iter()
        .copied()
        .filter(|(n, _)| columns.is_none_or(|c| c.contains(n)))
        .collect();
    let ddl: Vec<String> = cols.iter().map(|(n, t)| format!("{n} {t}")).collect();
    conn.execute_batch(&format!(
        "CREATE TABLE worker_registrations ({});",
        ddl.join(", ")
    ))
    .unwrap();
    for row in rows {
        let names: Vec<&str> = cols.iter().map(|(n, _)| *n).collect();
        let marks: Vec<String> = (1..=names.len()).map(|i| format!("?{i}")).collect();
        let values: Vec<rusqlite::types::Value> = names
            .iter()
            .map(|n| sql_value(row.get(*n).unwrap_or(&Value::Null)))
            .collect();
        conn.execute(
            &format!(
                "INSERT INTO worker_registrations ({}) VALUES ({})",
                names.join(", "),
                marks.join(", ")
            ),
            params_from_iter(values),
        )
        .unwrap();
    }
}

/// Create a registry with every column.
pub fn registry(path: &Path, rows: &[Value]) {
    registry_with_columns(path, None, rows)
}

/// Create a lease store holding `leases`.
pub fn leases(path: &Path, leases: &[Value]) {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch(&fleet_retire::store::leases::create_sql())
        .unwrap();
    for l in leases {
        let names = fleet_retire::store::leases::COLUMNS;
        let values: Vec<rusqlite::types::Value> = names
            .iter()
            .map(|n| sql_value(l.get(*n).unwrap_or(&Value::Null)))
            .collect();
        conn.execute(
            "INSERT INTO workflow_leases VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12)",
            params_from_iter(values),
        )
        .unwrap();
    }
}

/// This machine's host id and boot id, read independently of the program.
pub fn host_and_boot() -> (String, String) {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap()
        .trim()
        .to_string();
    (host, boot)
}

/// Field 22 of /proc/<pid>/stat, read independently of the program.
pub fn start_time(pid: u32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 1..];
    format!("ticks-{}", after.split_whitespace().nth(19).unwrap())
}

/// A stale-looking, otherwise eligible row registered on this machine.
pub fn stale_row(id: &str, pid: i64, start: &str) -> Value {
    let (host, boot) = host_and_boot();
    json!({
        "worker_identity": id,
        "client_name": "codex",
        "client_instance_id": "inst-codex-20260730T100000Z-abc123def456",
        "instance_id_source": "launcher",
        "session_id": format!("sess-{id}"),
        "generation_id": format!("gen-{id}"),
        "role": "author", "profile": "author-prgs", "namespace": "author",
        "remote": "prgs", "repository_binding": "prgs/gitea-tools",
        "pid": pid,
        "started_at": "2026-01-01T00:00:00Z",
        "last_heartbeat_at": "2026-01-01T00:10:00Z",
        "heartbeat_ttl_seconds": 900.0,
        "fencing_epoch": 1,
        "status": "active",
        "host_id": host, "boot_id": boot, "process_start_time": start,
    })
}

/// A temp dir with a registry, an empty lease store and a profiles.json
/// granting the controller everything.
pub struct Stores {
    pub dir: tempfile::TempDir,
    pub registry: PathBuf,
    pub leases: PathBuf,
    pub profiles: PathBuf,
}

impl Stores {
    pub fn new(rows: &[Value]) -> Stores {
        let dir = tempfile::tempdir().unwrap();
        let registry = dir.path().join("registry.sqlite");
        let lease_path = dir.path().join("leases.sqlite");
        let profiles = dir.path().join("profiles.json");
        self::registry(&registry, rows);
        self::leases(&lease_path, &[]);
        std::fs::write(
            &profiles,
            json!({"profiles": {
                "controller-prgs": {"role": "controller",
                    "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]},
                "author-prgs": {"role": "author",
                    "allowed_operations": ["gitea.read", "gitea.worker_registry.retire"]},
                "reader": {"role": "controller", "allowed_operations": ["gitea.write"]}
            }})
            .to_string(),
        )
        .unwrap();
        Stores {
            dir,
            registry,
            leases: lease_path,
            profiles,
        }
    }

    /// `plan` arguments for these stores.
    pub fn plan_args(&self, profile: &str) -> Vec<String> {
        vec![
            "plan".into(),
            "--registry".into(),
            self.registry.display().to_string(),
            "--leases".into(),
            self.leases.display().to_string(),
            "--canonical-repository".into(),
            "prgs/gitea-tools".into(),
            "--profiles".into(),
            self.profiles.display().to_string(),
            "--profile".into(),
            profile.into(),
        ]
    }

    /// `--format json apply` arguments for these stores (the plan or token
    /// flags come after).
    pub fn apply_args(&self, profile: &str) -> Vec<String> {
        vec![
            "--format".into(),
            "json".into(),
            "apply".into(),
            "--registry".into(),
            self.registry.display().to_string(),
            "--leases".into(),
            self.leases.display().to_string(),
            "--profiles".into(),
            self.profiles.display().to_string(),
            "--profile".into(),
            profile.into(),
        ]
    }

    /// Run `plan --format json` and parse it.
    pub fn plan_json(&self) -> Value {
        let mut args = self.plan_args("controller-prgs");
        args.extend(["--format".into(), "json".into()]);
        let out = bin().args(&args).output().unwrap();
        assert!(out.status.success(), "plan failed: {}", text(&out));
        serde_json::from_slice(&out.stdout).expect("plan prints JSON")
    }
}

/// Plan with `--out`; the saved file's path and its JSON.
pub fn save_plan(stores: &Stores) -> (PathBuf, Value) {
    let out_path = stores.dir.path().join("plan.json");
    let mut args = stores.plan_args("controller-prgs");
    args.extend(["--out".into(), out_path.display().to_string()]);
    let out = bin().args(&args).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let plan: Value = serde_json::from_str(&std::fs::read_to_string(&out_path).unwrap()).unwrap();
    (out_path, plan)
}

/// Apply a saved plan through the binary; its exit code and JSON report.
pub fn apply_cli(
    stores: &Stores,
    plan: &Path,
    profile: &str,
    extra: &[&str],
) -> (Option<i32>, Value) {
    let out = bin()
        .args(stores.apply_args(profile))
        .arg(plan)
        .args(extra)
        .output()
        .unwrap();
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("apply printed no JSON: {}", text(&out)));
    (out.status.code(), report)
}

/// The primary reason of each preserved worker, and the candidates.
pub fn verdicts(plan: &Value) -> (Vec<String>, Vec<(String, String)>) {
    let candidates = plan["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["worker_identity"].as_str().unwrap().to_string())
        .collect();
    let preserved = plan["preserved"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["worker_identity"].as_str().unwrap().to_string(),
                p["reason_code"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    (candidates, preserved)
}

/// A `sleep` child process.
pub fn spawn_sleeper() -> std::process::Child {
    Command::new("sleep")
        .arg("120")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// A process that existed and is gone: its pid and real start time.
pub fn dead_process() -> (i64, String) {
    let mut child = spawn_sleeper();
    let pid = child.id();
    let start = start_time(pid);
    child.kill().unwrap();
    child.wait().unwrap();
    (pid as i64, start)
}

/// Apply through the library, with test seams.
pub struct Lib {
    pub stores: Stores,
    pub policies: fleet_retire::policy::Policies,
    pub probe: fleet_retire::evidence::probe::SystemProbe,
}

impl Lib {
    pub fn new(stores: Stores) -> Lib {
        Lib {
            stores,
            policies: fleet_retire::policy::Policies::load(
                &fleet_retire::policy::PolicySource::Embedded,
            )
            .unwrap(),
            probe: fleet_retire::evidence::probe::SystemProbe::new("/proc"),
        }
    }

    pub fn request(&self) -> fleet_retire::apply::Request {
        let plan = self.stores.plan_json();
        fleet_retire::apply::Request {
            registry_fingerprint: plan["registry_fingerprint"].as_str().unwrap().into(),
            candidate_fingerprint: plan["candidate_fingerprint"].as_str().unwrap().into(),
            policy_fingerprint: plan["policy_fingerprint"].as_str().unwrap().into(),
            workers: plan["candidate_worker_identities"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect(),
            canonical_repository: Some("prgs/gitea-tools".into()),
            max_retire: 100,
            planned: None,
            first: None,
            scope: None,
            skip_fleet_summary: false,
            controller: None,
        }
    }

    pub fn run(
        &self,
        req: &fleet_retire::apply::Request,
        hooks: fleet_retire::apply::Hooks,
    ) -> fleet_retire::apply::Report {
        let ctx = fleet_retire::apply::Context {
            registry: &self.stores.registry,
            leases: &self.stores.leases,
            profiles: &self.stores.profiles,
            profile: "controller-prgs",
            proc_root: std::path::Path::new("/proc"),
            policies: &self.policies,
            probe: &self.probe,
            busy_timeout: std::time::Duration::from_secs(5),
        };
        fleet_retire::apply::apply(req, &ctx, hooks).unwrap()
    }
}

impl Lib {
    /// Apply through the library with `write` committed in the window
    /// between its judgement outside the lock and the lock itself.
    #[allow(dead_code)]
    pub fn run_with_writer(
        &self,
        req: &fleet_retire::apply::Request,
        write: impl FnOnce(),
    ) -> fleet_retire::apply::Report {
        let mut write = Some(write);
        let mut hook = || {
            if let Some(w) = write.take() {
                w()
            }
        };
        self.run(
            req,
            fleet_retire::apply::Hooks {
                after_prejudge: Some(&mut hook),
                ..Default::default()
            },
        )
    }
}

/// A child process killed (and reaped) when the guard drops, so a failing
/// assertion leaves nothing running.
pub struct KillOnDrop(pub std::process::Child);

impl KillOnDrop {
    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether the cvc5 solver runs here (`CVC5` names it, else `cvc5` on the
/// path); pair with [`skip_unless`].
pub fn cvc5_available() -> bool {
    Command::new(std::env::var("CVC5").unwrap_or_else(|_| "cvc5".into()))
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Fail under CI (where every tool is installed by .ci/run), skip with a
/// message elsewhere. Returns true when the caller should return early.
pub fn skip_unless(available: bool, what: &str) -> bool {
    if available {
        return false;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{what} is required under CI=true; .ci/run installs it");
    }
    eprintln!("skipped: {what} is not available here");
    true
}

/// Whether the registry's row-version bookkeeping is there and has never
/// counted a write: its clock at 0, no row stamped.
fn bookkeeping_untouched(conn: &Connection) -> bool {
    conn.query_row(
        "SELECT (SELECT version FROM fleet_retire_clock) = 0 \
         AND NOT EXISTS (SELECT 1 FROM fleet_retire_changes)",
        [],
        |r| r.get::<_, bool>(0),
    )
    .unwrap_or(false)
}

/// Every object of the registry (schema and rows), in a stable order.
///
/// The row-version bookkeeping installed and never written (docs/apply.md,
/// "The first apply": the first apply into a registry without it installs
/// it on its own, before it judges, whatever that apply ends in) is left
/// out, so a registry before its first apply and after a refused one
/// compare equal. Bookkeeping that counted anything (a stamp a rolled-back
/// apply leaked, say) is dumped with its rows.
pub fn dump(path: &Path) -> String {
    let conn =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut out = String::new();
    let untouched = bookkeeping_untouched(&conn);
    let objects: Vec<(String, String, Option<String>)> = conn
        .prepare("SELECT type, name, sql FROM sqlite_master ORDER BY type, name")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .filter(|(_, name, _): &(String, String, Option<String>)| {
            !(untouched && name.starts_with("fleet_retire_"))
        })
        .collect();
    for (kind, name, sql) in objects {
        out.push_str(&format!("{kind} {name}: {}\n", sql.unwrap_or_default()));
        if kind != "table" {
            continue;
        }
        let mut stmt = conn
            .prepare(&format!("SELECT * FROM \"{name}\" ORDER BY rowid"))
            .unwrap();
        let n = stmt.column_count();
        let rows: Vec<String> = stmt
            .query_map([], |r| {
                Ok((0..n)
                    .map(|i| format!("{:?}", r.get_ref(i).unwrap()))
                    .collect::<Vec<_>>()
                    .join("|"))
            })
            .unwrap()
            .map(Result::unwrap)
            .collect();
        out.push_str(&rows.join("\n"));
        out.push('\n');
    }
    out
}

/// Insert one row, given as JSON (types as in fixtures), into a registry.
pub fn insert_row(conn: &Connection, row: &Value) {
    let cols: Vec<String> = row.as_object().unwrap().keys().cloned().collect();
    conn.execute(
        &format!(
            "INSERT INTO worker_registrations ({}) VALUES ({})",
            cols.join(", "),
            (1..=cols.len())
                .map(|i| format!("?{i}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        params_from_iter(cols.iter().map(|c| match &row[c] {
            Value::String(s) => rusqlite::types::Value::Text(s.clone()),
            Value::Number(n) if n.is_i64() => rusqlite::types::Value::Integer(n.as_i64().unwrap()),
            Value::Number(n) => rusqlite::types::Value::Real(n.as_f64().unwrap()),
            _ => rusqlite::types::Value::Null,
        })),
    )
    .unwrap();
}

/// A `fleet-retire demo` child with piped output, killed on drop.
pub fn spawn_demo() -> KillOnDrop {
    KillOnDrop(
        bin()
            .arg("demo")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    )
}

/// Stores with three dead, eligible workers and one running one.
/// The running worker is killed when the guard drops, even when an
/// assertion fails first.
pub fn fleet() -> (Stores, KillOnDrop) {
    let live = KillOnDrop(spawn_sleeper());
    let live_start = start_time(live.id());
    let mut rows = Vec::new();
    for i in 1..=3 {
        let (pid, start) = dead_process();
        rows.push(stale_row(&format!("w-dead-{i}"), pid, &start));
    }
    rows.push(stale_row("w-running", live.id() as i64, &live_start));
    (Stores::new(&rows), live)
}

/// Make the host scope's indexes on a SQLite registry, as `registry
/// create` and `registry versions` do: `serve` plans this host's scope by
/// default, which needs them.
#[allow(dead_code)]
pub fn scope_indexes(registry: &Path) {
    fleet_retire::store::sqlite::scope::install_indexes(registry).unwrap();
}

/// The status of one worker's row.
#[allow(dead_code)]
pub fn status_of(registry: &Path, worker: &str) -> String {
    rusqlite::Connection::open(registry)
        .unwrap()
        .query_row(
            "SELECT status FROM worker_registrations WHERE worker_identity = ?1",
            [worker],
            |r| r.get(0),
        )
        .unwrap()
}

/// A database of its own in the test PostgreSQL cluster, dropped on drop.
/// The cluster's URL comes from FLEET_RETIRE_TEST_POSTGRES (`.ci/run`
/// starts one with `.ci/pg-cluster`).
pub struct PgDb {
    /// The database's URL.
    pub url: String,
    admin: String,
    name: String,
}

/// A fresh database named after `tag`, or `None` (with a note on stderr)
/// when no cluster is configured. Under `CI=true` a missing cluster fails.
pub fn postgres(tag: &str) -> Option<PgDb> {
    let Ok(admin) = std::env::var("FLEET_RETIRE_TEST_POSTGRES") else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but FLEET_RETIRE_TEST_POSTGRES is not set: .ci/run starts a PostgreSQL \
             cluster for these tests"
        );
        eprintln!(
            "skipped: PostgreSQL test `{tag}` (set FLEET_RETIRE_TEST_POSTGRES, e.g. from \
             `.ci/pg-cluster start /tmp/pg`)"
        );
        return None;
    };
    Some(PgDb::create(
        admin,
        format!("fr_{tag}_{}", std::process::id()),
    ))
}

impl PgDb {
    /// Where its server listens, `HOST:PORT`.
    pub fn host_port(&self) -> String {
        let after = self
            .url
            .split_once('@')
            .map_or(self.url.as_str(), |(_, h)| h);
        after.split('/').next().unwrap().to_string()
    }

    /// Its URL with the server's port replaced by `port` (a proxy's),
    /// followed by `query`.
    pub fn at_port(&self, port: u16, query: &str) -> String {
        let (user, _) = self.url.split_once('@').unwrap();
        format!("{user}@127.0.0.1:{port}/{}{query}", self.name)
    }

    /// A connection to this database.
    pub fn client(&self) -> ::postgres::Client {
        ::postgres::Client::connect(&self.url, ::postgres::NoTls).unwrap()
    }

    /// A fresh, empty database `name` in the cluster at `admin`.
    fn create(admin: String, name: String) -> PgDb {
        let mut client = ::postgres::Client::connect(&admin, ::postgres::NoTls)
            .unwrap_or_else(|e| panic!("cannot connect to the test cluster {admin}: {e}"));
        client
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .unwrap();
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .unwrap();
        let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
        PgDb {
            url: format!("{base}/{name}"),
            admin,
            name,
        }
    }

    /// Another fresh database beside this one.
    pub fn sibling(&self, suffix: &str) -> PgDb {
        PgDb::create(self.admin.clone(), format!("{}_{suffix}", self.name))
    }
}

impl Drop for PgDb {
    fn drop(&mut self) {
        if let Ok(mut c) = ::postgres::Client::connect(&self.admin, ::postgres::NoTls) {
            let _ = c.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

/// `fleet-retire serve` for these stores as the controller's launcher
/// starts it: an author worker with `identity` and `session`.
pub fn serve_command(stores: &Stores, identity: &str, session: &str) -> Command {
    let mut command = bin();
    command
        .arg("serve")
        .env("FLEET_RETIRE_REGISTRY", &stores.registry)
        .env("FLEET_RETIRE_LEASES", &stores.leases)
        .env("GITEA_MCP_CONFIG", &stores.profiles)
        .env("GITEA_MCP_PROFILE", "controller-prgs")
        .env("GITEA_MCP_NAMESPACE", "author")
        .env("FLEET_RETIRE_CANONICAL_REPOSITORY", "prgs/gitea-tools")
        .env("GITEA_MCP_WORKER_IDENTITY", identity)
        .env("GITEA_MCP_CLIENT_SESSION", session)
        .env("FLEET_RETIRE_PLAN_DIR", stores.dir.path().join("plans"));
    command
}

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Start `command` with its output piped, killed on drop (for
/// [`wait_with_deadline`]).
pub fn spawn_piped(command: &mut Command) -> KillOnDrop {
    KillOnDrop(
        command
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    )
}

/// `args` with the values of `--registry` and `--leases` replaced by
/// `location`.
pub fn stores_at(mut args: Vec<String>, location: &str) -> Vec<String> {
    for i in 0..args.len().saturating_sub(1) {
        if args[i] == "--registry" || args[i] == "--leases" {
            args[i + 1] = location.to_string();
        }
    }
    args
}

/// A `serve` on `stores` heartbeating every second, its standard input
/// held open (it stops when that closes), killed on drop.
pub fn serve_heartbeating(stores: &Stores, identity: &str, session: &str) -> KillOnDrop {
    KillOnDrop(
        serve_command(stores, identity, session)
            .env("FLEET_RETIRE_HEARTBEAT_INTERVAL", "1")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// The fleet of [`fleet`] copied into a fresh PostgreSQL database, registry
/// and leases both there; `None` when no cluster is configured.
pub fn pg_fleet(tag: &str) -> Option<(Stores, KillOnDrop, PgDb)> {
    let db = postgres(tag)?;
    let (mut stores, live) = fleet();
    let roles = db.documented_roles();
    fleet_retire::copy::copy(&stores.registry, Some(&stores.leases), &roles.owner).unwrap();
    db.grant_documented(&roles);
    stores.registry = PathBuf::from(&roles.apply);
    stores.leases = PathBuf::from(&roles.apply);
    Some((stores, live, db))
}

/// Every row of the registry and audit tables, as text, for "nothing
/// changed" comparisons.
pub fn pg_dump(db: &PgDb) -> String {
    let mut c = db.client();
    let mut out = String::new();
    for (table, key) in [
        ("worker_registrations", "worker_identity"),
        ("retirement_audit", "audit_id"),
        ("workflow_leases", "lease_id"),
    ] {
        let exists: bool = c
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
            .unwrap()
            .get(0);
        if !exists {
            out.push_str(&format!("{table}: none\n"));
            continue;
        }
        for r in c
            .query(
                &format!("SELECT t::text FROM {table} t ORDER BY {key}"),
                &[],
            )
            .unwrap()
        {
            out.push_str(&format!("{table}: {}\n", r.get::<_, String>(0)));
        }
    }
    out
}

pub fn pg_statuses(db: &PgDb) -> Vec<(String, String)> {
    db.client()
        .query(
            "SELECT worker_identity, status FROM worker_registrations ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Run `tests/mcp_client/<script>` with python3 and `args`: a client of the
/// official Python MCP SDK, which this project did not write. `None` when
/// python3 or its `mcp` package is missing (see [`skip_unless`]); a script
/// still running after `limit` is killed and the test fails.
pub fn run_mcp_client(
    script: &str,
    args: &[&std::ffi::OsStr],
    limit: std::time::Duration,
) -> Option<Output> {
    let sdk = Command::new("python3")
        .args(["-c", "import mcp.client.stdio"])
        .output()
        .is_ok_and(|o| o.status.success());
    if skip_unless(sdk, "python3 with the `mcp` package") {
        return None;
    }
    let child = Command::new("python3")
        .arg(Path::new("tests/mcp_client").join(script))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(child.wait_with_output()));
    match finished.recv_timeout(limit) {
        Ok(out) => Some(out.unwrap()),
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("{script} was still running after {limit:?}; killed it");
        }
    }
}

// --- One test body, both engines: the fleet on SQLite or PostgreSQL, and
// what a test reads and writes beside the program, said once for each. ---

/// Where a test keeps its registry and leases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// Two SQLite files in the test's temp dir.
    Sqlite,
    /// One fresh database of the test cluster (FLEET_RETIRE_TEST_POSTGRES).
    Postgres,
}

/// A test's own way into its stores, beside the program: the SQLite files,
/// or the PostgreSQL database (dropped when this drops).
pub enum StoreAccess {
    /// The registry file and the lease file.
    Sqlite { registry: PathBuf, leases: PathBuf },
    /// The database holding the registry, audit and lease tables.
    Postgres(PgDb),
}

/// The SQLite `stores` as they are, on `engine`: unchanged for SQLite; for
/// PostgreSQL copied (`registry copy`) into a fresh database named after
/// `tag`, with only the registry columns the SQLite file has, and the
/// stores pointed there. `None` when no cluster is configured.
pub fn onto(engine: Engine, tag: &str, mut stores: Stores) -> Option<(Stores, StoreAccess)> {
    if engine == Engine::Sqlite {
        let access = StoreAccess::Sqlite {
            registry: stores.registry.clone(),
            leases: stores.leases.clone(),
        };
        return Some((stores, access));
    }
    let db = postgres(tag)?;
    let roles = db.documented_roles();
    fleet_retire::copy::copy(&stores.registry, Some(&stores.leases), &roles.owner).unwrap();
    db.grant_documented(&roles);
    // A registry of an older shape is migrated by its owner (docs/multi-host.md).
    let url = match drop_columns_sqlite_lacks(&db, &stores.registry) {
        0 => roles.apply,
        _ => roles.owner,
    };
    stores.registry = PathBuf::from(&url);
    stores.leases = PathBuf::from(&url);
    Some((stores, StoreAccess::Postgres(db)))
}

/// Drop the registry columns `copy` created in `db` that the SQLite file
/// at `sqlite` does not have, so both hold a registry of the same shape.
/// How many it dropped.
fn drop_columns_sqlite_lacks(db: &PgDb, sqlite: &Path) -> usize {
    let conn = Connection::open(sqlite).unwrap();
    let present: Vec<String> = conn
        .prepare("SELECT name FROM pragma_table_info('worker_registrations')")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut client = db.client();
    let lacking: Vec<&str> = COLUMNS
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| !present.iter().any(|p| p == n))
        .collect();
    for name in &lacking {
        client
            .batch_execute(&format!(
                "ALTER TABLE worker_registrations DROP COLUMN {name}"
            ))
            .unwrap();
    }
    lacking.len()
}

/// The fleet of [`fleet`] (three dead workers, one running) on `engine`;
/// `None` when that engine is PostgreSQL and no cluster is configured.
pub fn fleet_on(engine: Engine, tag: &str) -> Option<(Stores, KillOnDrop, StoreAccess)> {
    let (stores, live) = fleet();
    let (stores, access) = onto(engine, tag, stores)?;
    Some((stores, live, access))
}

/// Another connection's write lock on the registry, held until
/// [`WriteLock::release`]: it stops writers, not readers.
pub enum WriteLock {
    /// `BEGIN IMMEDIATE` on the file.
    Sqlite(Connection),
    /// `LOCK TABLE worker_registrations IN EXCLUSIVE MODE` in an open
    /// transaction.
    Postgres(::postgres::Client),
}

impl WriteLock {
    /// Commit the holder's transaction, which wrote nothing.
    pub fn release(self) {
        match self {
            WriteLock::Sqlite(conn) => conn.execute_batch("COMMIT").unwrap(),
            WriteLock::Postgres(mut client) => client.batch_execute("COMMIT").unwrap(),
        }
    }
}

impl StoreAccess {
    /// Every registration's identity, status and `retired_by`, by identity.
    pub fn statuses(&self) -> Vec<(String, String, Option<String>)> {
        let sql = "SELECT worker_identity, status, retired_by FROM worker_registrations \
                   ORDER BY worker_identity";
        match self {
            StoreAccess::Sqlite { registry, .. } => Connection::open(registry)
                .unwrap()
                .prepare(sql)
                .unwrap()
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .unwrap()
                .map(Result::unwrap)
                .collect(),
            StoreAccess::Postgres(db) => db
                .client()
                .query(sql, &[])
                .unwrap()
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect(),
        }
    }

    /// The status of one worker's row.
    pub fn status_of(&self, worker: &str) -> String {
        let (_, status, _) = self
            .statuses()
            .into_iter()
            .find(|(id, _, _)| id == worker)
            .unwrap_or_else(|| panic!("no row for {worker}"));
        status
    }

    /// Each audit row's worker and registry token, in the order written;
    /// none when there is no audit table.
    /// One integer column of every audit row, in order.
    pub fn audit_counts(&self, column: &str) -> Vec<Option<i64>> {
        match self {
            StoreAccess::Sqlite { registry, .. } => Connection::open(registry)
                .unwrap()
                .prepare(&format!(
                    "SELECT {column} FROM retirement_audit ORDER BY audit_id"
                ))
                .unwrap()
                .query_map([], |r| r.get(0))
                .unwrap()
                .map(Result::unwrap)
                .collect(),
            StoreAccess::Postgres(db) => db
                .client()
                .query(
                    &format!("SELECT {column}::bigint FROM retirement_audit ORDER BY audit_id"),
                    &[],
                )
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect(),
        }
    }

    pub fn audit_rows(&self) -> Vec<(String, String)> {
        let sql = "SELECT worker_identity, registry_fingerprint FROM retirement_audit \
                   ORDER BY audit_id";
        match self {
            StoreAccess::Sqlite { registry, .. } => {
                let conn = Connection::open(registry).unwrap();
                let exists: i64 = conn
                    .query_row(
                        "SELECT count(*) FROM sqlite_master WHERE name = 'retirement_audit'",
                        [],
                        |r| r.get(0),
                    )
                    .unwrap();
                if exists == 0 {
                    return Vec::new();
                }
                let mut stmt = conn.prepare(sql).unwrap();
                stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                    .unwrap()
                    .map(Result::unwrap)
                    .collect()
            }
            StoreAccess::Postgres(db) => {
                let mut client = db.client();
                let exists: bool = client
                    .query_one("SELECT to_regclass('retirement_audit') IS NOT NULL", &[])
                    .unwrap()
                    .get(0);
                if !exists {
                    return Vec::new();
                }
                client
                    .query(sql, &[])
                    .unwrap()
                    .iter()
                    .map(|r| (r.get(0), r.get(1)))
                    .collect()
            }
        }
    }

    /// The registry side as text, for "nothing changed": on SQLite the
    /// whole file ([`dump`]); on PostgreSQL the registry and audit tables
    /// ([`pg_registry_dump`]), without the lease table beside them.
    pub fn dump(&self) -> String {
        match self {
            StoreAccess::Sqlite { registry, .. } => dump(registry),
            StoreAccess::Postgres(db) => pg_registry_dump(db),
        }
    }

    /// Set one worker's `last_heartbeat_at`, as the worker would.
    /// Set a row's status by hand (as an operator's SQL would).
    pub fn set_status(&self, worker: &str, status: &str) {
        match self {
            StoreAccess::Sqlite { registry, .. } => {
                Connection::open(registry)
                    .unwrap()
                    .execute(
                        "UPDATE worker_registrations SET status = ?1 WHERE worker_identity = ?2",
                        [status, worker],
                    )
                    .unwrap();
            }
            StoreAccess::Postgres(db) => {
                db.client()
                    .execute(
                        "UPDATE worker_registrations SET status = $1 WHERE worker_identity = $2",
                        &[&status, &worker],
                    )
                    .unwrap();
            }
        }
    }

    pub fn set_heartbeat(&self, worker: &str, at: &str) {
        match self {
            StoreAccess::Sqlite { registry, .. } => {
                Connection::open(registry)
                    .unwrap()
                    .execute(
                        "UPDATE worker_registrations SET last_heartbeat_at = ?1 \
                         WHERE worker_identity = ?2",
                        [at, worker],
                    )
                    .unwrap();
            }
            StoreAccess::Postgres(db) => {
                db.client()
                    .execute(
                        "UPDATE worker_registrations SET last_heartbeat_at = $1 \
                         WHERE worker_identity = $2",
                        &[&at, &worker],
                    )
                    .unwrap();
            }
        }
    }

    /// Run one statement written for both engines (plain SQL, no
    /// parameters), as an operator's or another writer's SQL would.
    pub fn execute(&self, sql: &str) {
        match self {
            StoreAccess::Sqlite { registry, .. } => {
                Connection::open(registry)
                    .unwrap()
                    .execute_batch(sql)
                    .unwrap();
            }
            StoreAccess::Postgres(db) => db.client().batch_execute(sql).unwrap(),
        }
    }

    /// Insert one registration, given as JSON (types as in fixtures).
    pub fn insert_row(&self, row: &Value) {
        self.insert("worker_registrations", row)
    }

    /// Insert one lease, given as JSON; the columns it leaves out are NULL.
    pub fn insert_lease(&self, lease: &Value) {
        self.insert("workflow_leases", lease)
    }

    /// Insert `object`'s keys as columns of `table` (the lease table when
    /// it is `workflow_leases`, else the registry).
    fn insert(&self, table: &str, object: &Value) {
        match self {
            StoreAccess::Sqlite { registry, leases } => {
                let path = if table == "workflow_leases" {
                    leases
                } else {
                    registry
                };
                let cols: Vec<&String> = object.as_object().unwrap().keys().collect();
                let marks: Vec<String> = (1..=cols.len()).map(|i| format!("?{i}")).collect();
                let sql = format!(
                    "INSERT INTO {table} ({}) VALUES ({})",
                    cols.iter()
                        .map(|c| c.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    marks.join(", ")
                );
                let values = cols.iter().map(|c| sql_value(&object[c.as_str()]));
                Connection::open(path)
                    .unwrap()
                    .execute(&sql, params_from_iter(values))
                    .unwrap();
            }
            StoreAccess::Postgres(db) => {
                let sql = format!(
                    "INSERT INTO {table} SELECT * FROM json_populate_record(NULL::{table}, $1::text::json)"
                );
                db.client().execute(&sql, &[&object.to_string()]).unwrap();
            }
        }
    }

    /// Take the registry's write lock from another connection.
    pub fn hold_write_lock(&self) -> WriteLock {
        match self {
            StoreAccess::Sqlite { registry, .. } => {
                let conn = Connection::open(registry).unwrap();
                conn.execute_batch("BEGIN IMMEDIATE").unwrap();
                WriteLock::Sqlite(conn)
            }
            StoreAccess::Postgres(db) => {
                let mut client = db.client();
                client
                    .batch_execute("BEGIN; LOCK TABLE worker_registrations IN EXCLUSIVE MODE")
                    .unwrap();
                WriteLock::Postgres(client)
            }
        }
    }
}

/// The registry and audit tables of `db` as text, for "nothing changed"
/// comparisons: each table's columns, indexes and triggers, then its rows
/// in key order (a missing table says so).
pub fn pg_registry_dump(db: &PgDb) -> String {
    let mut c = db.client();
    let mut out = String::new();
    for (table, key) in [
        ("worker_registrations", "worker_identity"),
        ("retirement_audit", "audit_id"),
    ] {
        let exists: bool = c
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
            .unwrap()
            .get(0);
        if !exists {
            out.push_str(&format!("table {table}: none\n"));
            continue;
        }
        let objects = c
            .query(
                "SELECT 'column ' || column_name || ' ' || data_type FROM information_schema.columns \
                   WHERE table_schema = current_schema() AND table_name = $1 \
                 UNION ALL SELECT 'index ' || indexdef FROM pg_indexes \
                   WHERE schemaname = current_schema() AND tablename = $1 \
                 UNION ALL SELECT 'trigger ' || tgname FROM pg_trigger \
                   WHERE tgrelid = $1::regclass AND NOT tgisinternal \
                 ORDER BY 1",
                &[&table],
            )
            .unwrap();
        for r in objects {
            out.push_str(&format!("table {table}: {}\n", r.get::<_, String>(0)));
        }
        for r in c
            .query(
                &format!("SELECT t::text FROM {table} t ORDER BY {key}"),
                &[],
            )
            .unwrap()
        {
            out.push_str(&format!("{table}: {}\n", r.get::<_, String>(0)));
        }
    }
    out
}

/// Apply a saved plan through the binary, as [`apply_cli`], but give up
/// after `deadline`: the child is killed and the test fails saying so,
/// rather than waiting forever on a lock.
pub fn apply_cli_within(
    stores: &Stores,
    plan: &Path,
    extra: &[&str],
    deadline: std::time::Duration,
) -> (Option<i32>, Value) {
    let child = bin()
        .args(stores.apply_args("controller-prgs"))
        .arg(plan)
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || sender.send(child.wait_with_output().unwrap()));
    let Ok(out) = receiver.recv_timeout(deadline) else {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        panic!("apply {extra:?} was still running after {deadline:?}: killed");
    };
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("apply printed no JSON: {}", text(&out)));
    (out.status.code(), report)
}

/// Stores holding a registry of `rows` rows from the shared realistic
/// generator (`../shared/bench/gen_registry.py`, bound to this machine)
/// when it is here, otherwise from [`plain_fleet`]; the lease store beside
/// it, and the profiles of [`Stores::new`].
pub fn realistic_stores(rows: usize) -> Stores {
    let stores = Stores::new(&[]);
    std::fs::remove_file(&stores.registry).unwrap();
    std::fs::remove_file(&stores.leases).unwrap();
    let generator = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/bench/gen_registry.py");
    let made = generator.is_file()
        && Command::new("python3")
            .arg(&generator)
            .args(["--rows", &rows.to_string(), "--out"])
            .arg(stores.dir.path())
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    if !made {
        eprintln!("{} is not here: a plainer registry", generator.display());
        plain_fleet(stores.dir.path(), rows);
    }
    stores
}

/// `rows` rows of launches of five workers: most stale with dead pids,
/// a tenth released, some live-looking, some on another host, no leases.
/// (For tests that need many rows; `tests/serve_agents.rs` uses it when
/// the shared realistic generator is not here.)
pub fn plain_fleet(dir: &Path, rows: usize) {
    let (host, boot) = host_and_boot();
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    let conn = fleet_retire::worker::open(&dir.join("registry.sqlite")).unwrap();
    let tx = conn.unchecked_transaction().unwrap();
    {
        let mut insert = tx
            .prepare(
                "INSERT INTO worker_registrations (worker_identity, client_name, client_instance_id,
                 instance_id_source, session_id, generation_id, role, profile, namespace, remote,
                 repository_binding, pid, started_at, last_heartbeat_at, heartbeat_ttl_seconds,
                 fencing_epoch, status, host_id, boot_id, process_start_time)
                 VALUES (?1, 'codex', ?2, 'launcher', ?3, ?4, ?5, ?6, ?5, 'prgs', 'prgs/gitea-tools',
                 ?7, '2026-01-01T00:00:00Z', ?8, 900, 1, ?9, ?10, ?11, ?12)",
            )
            .unwrap();
        let namespaces = ["author", "reviewer", "merger", "controller", "reconciler"];
        for i in 0..rows {
            let ns = namespaces[i % 5];
            let status = if i % 10 == 0 { "released" } else { "active" };
            let heartbeat = if i % 97 == 0 {
                now.as_str()
            } else {
                "2026-01-01T00:10:00Z"
            };
            let row_host = if i % 13 == 0 {
                "elsewhere"
            } else {
                host.as_str()
            };
            rusqlite::Statement::execute(
                &mut insert,
                rusqlite::params![
                    format!("w-{ns}-{i:06}"),
                    format!("inst-codex-20260101T000000Z-{:012x}", i / 5),
                    format!("sess-{:08}", i / 5),
                    format!("gen-{i:08}"),
                    ns,
                    format!("{ns}-prgs"),
                    4_000_000 + (i as i64 % 190_000),
                    heartbeat,
                    status,
                    row_host,
                    boot,
                    format!("ticks-{i}"),
                ],
            )
            .unwrap();
        }
    }
    tx.commit().unwrap();
    leases(&dir.join("leases.sqlite"), &[]);
}

/// Wait for a child, killing it if the deadline passes; its output is read
/// as it comes, so a chatty child never blocks on a full pipe.
pub fn wait_with_deadline(
    mut child: KillOnDrop,
    limit: std::time::Duration,
) -> std::process::Output {
    use std::io::Read;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(
        child
            .0
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .0
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let started = std::time::Instant::now();
    while child.0.try_wait().unwrap().is_none() && started.elapsed() < limit {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.0.kill();
    std::process::Output {
        status: child.0.wait().unwrap(),
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// A JUnit report as Python's `junitparser` reads it: per suite its name and
/// counts, per case its name and result (`passed`, `failure`, `error`), as
/// JSON. `None` (a skip) when junitparser is not installed, except under
/// `CI=true`, where `.ci/run` installs it.
#[allow(dead_code)]
pub fn junit_read(xml: &[u8]) -> Option<Value> {
    let script = r#"
import json, sys
from junitparser import JUnitXml, Failure, Error
xml = JUnitXml.fromstring(sys.stdin.buffer.read())
suites = []
for s in xml:
    cases = []
    for c in s:
        kinds = [type(r).__name__.lower() for r in c.result]
        cases.append({"name": c.name, "classname": c.classname, "time": c.time,
                      "result": kinds[0] if kinds else "passed",
                      "message": c.result[0].message if c.result else None})
    suites.append({"name": s.name, "tests": s.tests, "failures": s.failures,
                   "errors": s.errors, "cases": cases})
print(json.dumps({"tests": xml.tests, "failures": xml.failures, "errors": xml.errors,
                  "suites": suites}))
"#;
    let available = Command::new("python3")
        .args(["-c", "import junitparser"])
        .status()
        .is_ok_and(|s| s.success());
    if skip_unless(
        available,
        "python3 with junitparser (pip install junitparser)",
    ) {
        return None;
    }
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), xml).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "junitparser refused the report: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(xml)
    );
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

/// A policy folder (`DIR/policies`) of the built-in set plus one hold
/// policy that does not open with the status test: the host scope's
/// precondition (`policy::scope_check`) fails on it, naming it.
pub fn policies_failing_the_scope_precondition(dir: &Path) -> PathBuf {
    let folder = dir.join("policies");
    std::fs::create_dir(&folder).unwrap();
    for name in [
        "schema.cedarschema",
        "capabilities.cedar",
        "retirement.cedar",
    ] {
        let mut text = fleet_retire::policy::embedded(name).to_string();
        if name == "retirement.cedar" {
            text.push_str(
                "\n@id(\"hold-fails-on-old-heartbeats\")\n\
                 @reason(\"conflicting_identity_evidence\")\n@order(\"10\")\n\
                 @description(\"fails on a past heartbeat\")\n\
                 forbid (principal, action == FleetRetire::Action::\"hold_session_id\", resource)\n\
                 when { resource.heartbeat_age_us + 9223372036854775807 > 0 };\n",
            );
        }
        std::fs::write(folder.join(name), text).unwrap();
    }
    folder
}

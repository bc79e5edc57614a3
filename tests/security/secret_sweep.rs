//! "A secret is never printed" (docs/security.md, row 50.6). Finding 6 of
//! the fourth review: `plan --out` printed the command that applies the
//! plan with the lease store's URL as it was given, password and all,
//! beside the registry's masked one — finding 30.3 again, in a place its
//! test did not look. So this test looks everywhere: a PostgreSQL role's
//! password goes to every command that takes a store, every way it can be
//! given (in the registry's URL, in the lease store's, percent-encoded,
//! raw, as `?password=`, through `FLEET_RETIRE_REGISTRY`,
//! `FLEET_RETIRE_LEASES` and `PGPASSWORD`) and in URLs that fail (a
//! database that does not exist, a port nothing listens on, URLs the
//! driver cannot read as meant), in every output format each command
//! writes, and `serve` is driven over MCP. Every piece of the password is
//! looked for in what each command prints and logs, in every answer of
//! `serve`, in every file under the test's folder (saved plans, captured
//! cases, kept plans) and in every row of the database (the audit rows).

#[path = "secret_sweep_controller.rs"]
mod controller;

use crate::common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The role's password: every character a URL gives a meaning to (`/`,
/// `?`, `@`, `#`, `&`, `=`) and a percent-escape (`%2F`) of its own.
const PASSWORD: &str = "Kq7vX/Rz9wY?Lm3xZ@Tp5yW#Hd2jV%2FNc8bU&Gh6tM=Pv3kA";
/// A second password, written raw in a URL's user part: the driver takes
/// the user part up to the first `@` and decodes `%`, so this one holds
/// every other character a URL gives a meaning to.
const RAW: &str = "Wb4nQ/Gs6kR?Fj8rS#Yx3eT&Jc5pN=Dq2wE";
const REPO: &str = "prgs/gitea-tools";
const PROFILE: &str = "controller-prgs";
/// The variables a command may take a store or a password from: each run
/// starts without them, and a case sets the ones it means.
const STORE_ENV: [&str; 7] = [
    "FLEET_RETIRE_REGISTRY",
    "FLEET_RETIRE_LEASES",
    "FLEET_RETIRE_CANONICAL_REPOSITORY",
    "PGPASSWORD",
    "GITEA_MCP_CONFIG",
    "GITEA_MCP_PROFILE",
    "GITEA_MCP_WORKER_IDENTITY",
];

/// `s` with every byte but ASCII letters and digits percent-encoded.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b if b.is_ascii_alphanumeric() => char::from(b).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// `%XX` decoded, as the driver decodes a URL's user part.
fn decode(s: &str) -> String {
    let mut out = Vec::new();
    let mut rest = s.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        let hex = tail
            .get(..2)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b, hex) {
            (b'%', Some(x)) => {
                out.push(x);
                rest = &tail[2..];
            }
            _ => {
                out.push(b);
                rest = tail;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Every piece of the passwords that would give one away: each whole, as
/// percent-encoded and as a driver would decode it, and every run of
/// letters and digits of four or more between their other characters.
fn fragments() -> Vec<String> {
    let mut out = Vec::new();
    for secret in [PASSWORD, RAW] {
        for form in [secret.to_string(), encode(secret), decode(secret)] {
            out.extend(
                form.split(|c: char| !c.is_ascii_alphanumeric())
                    .filter(|piece| piece.len() >= 4)
                    .map(str::to_string),
            );
            out.push(form);
        }
    }
    out.sort();
    out.dedup();
    out
}

/// What the sweep ran, every piece of a password it found where, and every
/// run that did not end as meant (so a sweep of failures that never reach
/// the store cannot pass).
struct Sweep {
    fragments: Vec<String>,
    leaks: Vec<String>,
    wrong: Vec<String>,
    runs: usize,
}

impl Sweep {
    fn new() -> Sweep {
        Sweep {
            fragments: fragments(),
            leaks: Vec::new(),
            wrong: Vec::new(),
            runs: 0,
        }
    }

    /// Record the fragments `text` holds, with where the first stands.
    fn look(&mut self, what: &str, text: &str) {
        let found: Vec<&String> = self
            .fragments
            .iter()
            .filter(|f| text.contains(f.as_str()))
            .collect();
        let Some(first) = found.first() else {
            return;
        };
        let at = text.find(first.as_str()).unwrap();
        let start = text[..at]
            .char_indices()
            .rev()
            .nth(80)
            .map_or(0, |(i, _)| i);
        let end = text[at..]
            .char_indices()
            .nth(120)
            .map_or(text.len(), |(i, _)| at + i);
        self.leaks.push(format!(
            "{what}: {} piece(s), e.g. {:?}",
            found.len(),
            &text[start..end]
        ));
    }

    /// Run `command` to its end, look at its output, and require one of
    /// `codes`; its output.
    fn expect(&mut self, what: &str, command: &mut Command, codes: &[i32]) -> String {
        let out = command.stdin(Stdio::null()).output().unwrap();
        self.runs += 1;
        let said = text(&out);
        self.look(what, &said);
        let code = out.status.code().unwrap_or(-1);
        if !codes.contains(&code) {
            self.wrong
                .push(format!("{what}: exit {code}, meant {codes:?}: {said}"));
        }
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Every file under `dir`, read as text.
    fn look_at_files(&mut self, dir: &Path) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                self.look_at_files(&path);
            } else {
                let bytes = std::fs::read(&path).unwrap_or_default();
                let what = format!("the file {}", path.display());
                self.look(&what, &String::from_utf8_lossy(&bytes));
            }
        }
    }

    fn absorb(&mut self, other: Sweep) {
        self.leaks.extend(other.leaks);
        self.wrong.extend(other.wrong);
        self.runs += other.runs;
    }

    fn finish(self) {
        assert!(
            self.leaks.is_empty() && self.wrong.is_empty(),
            "{} run(s); {} leak(s) of the password:\n{}\n\n{} run(s) that did not end as meant:\n{}",
            self.runs,
            self.leaks.len(),
            self.leaks.join("\n"),
            self.wrong.len(),
            self.wrong.join("\n\n")
        );
    }
}

/// The binary, with none of the store variables this test did not set, and
/// its debug log on (`FLEET_RETIRE_LOG`) so that the log is swept too.
fn clean(env: &[(&str, String)]) -> Command {
    let mut command = bin();
    for k in STORE_ENV {
        command.env_remove(k);
    }
    command.env("FLEET_RETIRE_LOG", "debug");
    for (k, v) in env {
        command.env(k, v);
    }
    command
}

/// A login role of the test cluster whose password is [`PASSWORD`],
/// dropped on drop (after the databases it owns, which are declared after
/// it). The cluster trusts loopback, so the password in a URL is accepted
/// and not checked: what this test is about is what is shown.
struct Role {
    admin: String,
    name: String,
}

impl Role {
    fn create(admin: &str) -> Role {
        let name = format!("fr_sweep_{}", std::process::id());
        let mut c = ::postgres::Client::connect(admin, ::postgres::NoTls).unwrap();
        c.batch_execute(&format!(
            "DROP ROLE IF EXISTS {name}; CREATE ROLE {name} LOGIN PASSWORD '{}'",
            PASSWORD.replace('\'', "''")
        ))
        .unwrap();
        Role {
            admin: admin.to_string(),
            name,
        }
    }

    /// Make `db` this role's (so it may create and change its tables).
    fn owns(&self, db: &PgDb) {
        let name = db.url.rsplit('/').next().unwrap();
        ::postgres::Client::connect(&self.admin, ::postgres::NoTls)
            .unwrap()
            .batch_execute(&format!("ALTER DATABASE {name} OWNER TO {}", self.name))
            .unwrap();
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        if let Ok(mut c) = ::postgres::Client::connect(&self.admin, ::postgres::NoTls) {
            let _ = c.batch_execute(&format!("DROP ROLE IF EXISTS {}", self.name));
        }
    }
}

/// The role's database, to write its URL every way.
struct Target {
    role: String,
    host_port: String,
    db: String,
}

impl Target {
    fn new(role: &Role, db: &PgDb) -> Target {
        Target {
            role: role.name.clone(),
            host_port: db.host_port(),
            db: db.url.rsplit('/').next().unwrap().to_string(),
        }
    }

    fn url(&self, user: &str, host_port: &str, db: &str, query: &str) -> String {
        format!("postgres://{user}@{host_port}/{db}{query}")
    }

    /// No password: the other store of a case, or with `PGPASSWORD`.
    fn bare(&self) -> String {
        self.url(&self.role, &self.host_port, &self.db, "")
    }

    fn encoded(&self) -> String {
        let user = format!("{}:{}", self.role, encode(PASSWORD));
        self.url(&user, &self.host_port, &self.db, "")
    }

    fn raw(&self) -> String {
        let user = format!("{}:{RAW}", self.role);
        self.url(&user, &self.host_port, &self.db, "")
    }

    fn in_query(&self) -> String {
        format!("{}?password={}", self.bare(), encode(PASSWORD))
    }

    /// The ways a working store is given its password.
    fn cases(&self) -> Vec<Case> {
        let flags = |name, registry: String, leases: String| Case {
            name,
            registry: Some(registry),
            leases: Some(leases),
            env: Vec::new(),
        };
        let mut by_env = flags(
            "in FLEET_RETIRE_REGISTRY and _LEASES",
            String::new(),
            String::new(),
        );
        (by_env.registry, by_env.leases) = (None, None);
        by_env.env = vec![
            ("FLEET_RETIRE_REGISTRY", self.encoded()),
            ("FLEET_RETIRE_LEASES", self.raw()),
        ];
        let mut by_pgpassword = flags("in PGPASSWORD", self.bare(), self.bare());
        by_pgpassword.env = vec![("PGPASSWORD", PASSWORD.to_string())];
        vec![
            flags("in --registry, encoded", self.encoded(), self.bare()),
            flags("in --leases, encoded", self.bare(), self.encoded()),
            flags("in both, raw", self.raw(), self.raw()),
            flags("in both, as ?password=", self.in_query(), self.in_query()),
            by_env,
            by_pgpassword,
        ]
    }

    /// URLs holding the password that cannot be used: each command must
    /// fail without showing it.
    fn broken(&self) -> Vec<(&'static str, String)> {
        let user = format!("{}:{}", self.role, encode(PASSWORD));
        let in_query = PASSWORD.replace('@', "%40");
        vec![
            (
                "a database that does not exist",
                self.url(&user, &self.host_port, &format!("{}_none", self.db), ""),
            ),
            (
                "a port nothing listens on",
                self.url(&user, &format!("127.0.0.1:{}", free_port()), &self.db, ""),
            ),
            (
                "an `@` left raw in the password",
                self.url(
                    &format!("{}:{PASSWORD}", self.role),
                    &self.host_port,
                    &self.db,
                    "",
                ),
            ),
            (
                "an `&` left raw in ?password=",
                format!("{}?password={in_query}", self.bare()),
            ),
            (
                "a port that is not a number",
                self.url(&user, "127.0.0.1:notaport", &self.db, ""),
            ),
            (
                "an sslmode this program does not know",
                self.url(&user, &self.host_port, &self.db, "?sslmode=bogus"),
            ),
        ]
    }
}

/// One way of giving the stores: the flags (none when not given) and the
/// environment.
struct Case {
    name: &'static str,
    registry: Option<String>,
    leases: Option<String>,
    env: Vec<(&'static str, String)>,
}

/// Which store flags a command takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Takes {
    Both,
    Registry,
}

impl Case {
    /// `fleet-retire --format FORMAT WORDS…` with this case's stores and
    /// environment, then `rest`.
    fn command(&self, format: &str, words: &[&str], takes: Takes, rest: &[String]) -> Command {
        let mut command = clean(&self.env);
        command.args(["--format", format]).args(words);
        if let Some(registry) = &self.registry {
            command.args(["--registry", registry]);
        }
        if let (Takes::Both, Some(leases)) = (takes, &self.leases) {
            command.args(["--leases", leases]);
        }
        command.args(rest);
        command
    }

    /// The registry's URL, wherever the case gives it (for `registry copy
    /// --to`, which has no variable).
    fn registry_url(&self) -> String {
        self.registry.clone().unwrap_or_else(|| {
            self.env
                .iter()
                .find(|(k, _)| *k == "FLEET_RETIRE_REGISTRY")
                .map(|(_, v)| v.clone())
                .unwrap()
        })
    }
}

/// What every run shares: the folder swept for files, the SQLite fleet
/// `registry copy` reads, and profiles.json.
struct Context {
    dir: PathBuf,
    sqlite_registry: String,
    sqlite_leases: String,
    profiles: String,
}

impl Context {
    /// `--canonical-repository`, `--profiles` and `--profile`, then `more`.
    fn operator(&self, more: &[&str]) -> Vec<String> {
        let mut args: Vec<String> = [
            "--canonical-repository",
            REPO,
            "--profiles",
            &self.profiles,
            "--profile",
            PROFILE,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(more.iter().map(|s| s.to_string()));
        args
    }

    fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

/// Tokens no plan has: an apply of them is refused once the stores are read.
fn stranger_tokens() -> Vec<String> {
    [
        "--registry-fingerprint",
        "registryfp-00000000000000000000000000000000",
        "--candidate-fingerprint",
        "candidatefp-00000000000000000000000000000000",
        "--policy-fingerprint",
        "policyfp-00000000000000000000000000000000",
        "--workers",
        "w-dead-1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[test]
#[cfg_attr(
    not(fr_postgres),
    ignore = "needs FLEET_RETIRE_TEST_POSTGRES (a PostgreSQL cluster: export FLEET_RETIRE_TEST_POSTGRES=$(.ci/pg-cluster start /tmp/pg))"
)]
fn a_secret_is_never_printed_by_any_command_output_file_or_audit_row() {
    let Ok(admin) = std::env::var("FLEET_RETIRE_TEST_POSTGRES") else {
        let _ = postgres("secret_sweep");
        return;
    };
    let role = Role::create(&admin);
    let db = postgres("secret_sweep").unwrap();
    role.owns(&db);
    let target = Target::new(&role, &db);
    let (stores, _live) = fleet();
    fleet_retire::copy::copy(&stores.registry, Some(&stores.leases), &target.bare()).unwrap();
    let ctx = Context {
        dir: stores.dir.path().to_path_buf(),
        sqlite_registry: stores.registry.display().to_string(),
        sqlite_leases: stores.leases.display().to_string(),
        profiles: stores.profiles.display().to_string(),
    };
    let mut sweep = Sweep::new();
    let cases = target.cases();
    let first_apply = plan_and_apply_once(&mut sweep, &cases[0], &ctx);
    help_and_usage(&mut sweep, &cases[4], &target, &ctx);
    let copies: Vec<PgDb> = (0..cases.len())
        .map(|i| {
            let fresh = db.sibling(&format!("copy{i}"));
            role.owns(&fresh);
            fresh
        })
        .collect();
    std::thread::scope(|scope| {
        // `policy diff` only reads, and spends its time in the solver:
        // beside the rest, which runs in order (an apply holds to the plan
        // saved just before it).
        let diffs = scope.spawn(|| {
            let mut diffs = Sweep::new();
            for case in &cases {
                policy_diff(&mut diffs, case, &["human", "json", "sarif"], 0);
            }
            diffs
        });
        for (i, case) in cases.iter().enumerate() {
            for format in ["human", "json"] {
                plans_and_applies(&mut sweep, case, &ctx, (i, format), &first_apply);
                readers(&mut sweep, case, &ctx, (i, format));
                writers(&mut sweep, case, &ctx, (i, format));
            }
            copy_into(&mut sweep, case, &ctx, &copies[i], &target);
            serve(&mut sweep, case, &ctx, &format!("{i}"), true);
            controller::once(
                &mut sweep,
                case,
                &ctx,
                &format!("password {}", case.name),
                &[0],
            );
        }
        sweep.absorb(diffs.join().unwrap());
    });
    controller::serving(&mut sweep, &cases[0], &ctx);
    controller::serving(&mut sweep, &cases[4], &ctx);
    // The broken URLs reach no table a run above holds to: all at once.
    let broken = target.broken();
    std::thread::scope(|scope| {
        let runs: Vec<_> = broken
            .iter()
            .enumerate()
            .map(|(n, (what, url))| {
                let (target, ctx) = (&target, &ctx);
                scope.spawn(move || {
                    let mut one = Sweep::new();
                    broken_url(&mut one, what, url, n, target, ctx);
                    one
                })
            })
            .collect();
        for run in runs {
            sweep.absorb(run.join().unwrap());
        }
    });
    for copy in &copies {
        sweep.look("a copied database's rows", &pg_dump(copy));
    }
    sweep.look_at_files(&ctx.dir);
    sweep.look("the database's rows", &pg_dump(&db));
    let audit = pg_audit(&db);
    assert!(audit.lines().count() >= 3, "no retirement was audited");
    sweep.look("the audit rows", &audit);
    eprintln!("secret sweep: {} runs", sweep.runs);
    sweep.finish();
}

/// Every audit row, as text.
fn pg_audit(db: &PgDb) -> String {
    db.client()
        .query("SELECT t::text FROM retirement_audit t", &[])
        .unwrap()
        .iter()
        .map(|r| r.get::<_, String>(0) + "\n")
        .collect()
}

/// The first plan, saved and applied through the password: it retires the
/// three dead workers. Its apply id, for `apply-status`.
fn plan_and_apply_once(sweep: &mut Sweep, case: &Case, ctx: &Context) -> String {
    let plan = ctx.file("first-plan.json");
    let mut command = case.command(
        "human",
        &["plan"],
        Takes::Both,
        &ctx.operator(&["--out", &plan]),
    );
    let shown = sweep.expect("the first plan --out", &mut command, &[0]);
    assert!(shown.contains("w-dead-1"), "{shown}");
    let mut command = case.command("json", &["apply", &plan], Takes::Both, &ctx.operator(&[]));
    let report: Value = serde_json::from_str(&sweep.expect("the first apply", &mut command, &[0]))
        .expect("apply's report is JSON");
    assert_eq!(report["retired_count"], 3, "{report}");
    report["apply_id"].as_str().unwrap().to_string()
}

/// `--help` of every command taking a store, with the stores in the
/// environment (clap shows a variable's value there unless told not to),
/// and command lines clap cannot read holding a URL.
fn help_and_usage(sweep: &mut Sweep, by_env: &Case, target: &Target, ctx: &Context) {
    let words: [&[&str]; 13] = [
        &["plan"],
        &["apply"],
        &["apply-status"],
        &["snapshot"],
        &["explain"],
        &["serve"],
        &["register"],
        &["heartbeat"],
        &["release"],
        &["fixture", "capture"],
        &["policy", "diff"],
        &["registry", "versions"],
        &["registry", "copy"],
    ];
    sweep.expect("man", clean(&by_env.env).arg("man"), &[0]);
    for w in words {
        for help in ["--help", "-h"] {
            let what = format!("{} {help}", w.join(" "));
            sweep.expect(&what, clean(&by_env.env).args(w).arg(help), &[0]);
        }
    }
    for format in ["human", "json"] {
        for stray in [&["plan"][..], &["snapshot"], &["apply-status"]] {
            let what = format!("{} given a URL where none is read ({format})", stray[0]);
            let mut command = clean(&[]);
            command
                .args(["--format", format])
                .args(stray)
                .arg(target.encoded());
            sweep.expect(&what, &mut command, &[1]);
        }
        let mut command = clean(&[]);
        command.args(["--format", format, "apply", &target.encoded()]);
        command.args(["--registry", &target.bare(), "--leases", &target.bare()]);
        command.args(ctx.operator(&[]));
        let what = format!("apply given the URL as its plan ({format})");
        sweep.expect(&what, &mut command, &[1]);
    }
}

/// Plan (with and without `--out`), apply the fresh plan, replay the
/// first one, apply tokens no plan has (refused), and ask `apply-status`
/// of the first apply and of one that never was.
fn plans_and_applies(
    sweep: &mut Sweep,
    case: &Case,
    ctx: &Context,
    (i, format): (usize, &str),
    first_apply: &str,
) {
    let tag = format!("{}, {format}", case.name);
    let plan = ctx.file(&format!("plan-{i}-{format}.json"));
    let both = Takes::Both;
    let runs: Vec<Run> = vec![
        ("plan", vec!["plan"], both, ctx.operator(&[]), &[0]),
        (
            "plan --out",
            vec!["plan"],
            both,
            ctx.operator(&["--out", &plan]),
            &[0],
        ),
        (
            "apply of a fresh plan",
            vec!["apply", &plan],
            both,
            ctx.operator(&[]),
            &[0],
        ),
        (
            "apply replaying the first plan",
            vec!["apply", "first-plan.json"],
            both,
            ctx.operator(&[]),
            &[0],
        ),
        (
            "apply of tokens no plan has",
            vec!["apply"],
            both,
            [ctx.operator(&[]), stranger_tokens()].concat(),
            &[2],
        ),
    ];
    for (what, words, takes, rest, codes) in runs {
        let mut command = case.command(format, &words, takes, &rest);
        command.current_dir(&ctx.dir);
        sweep.expect(&format!("{what}, {tag}"), &mut command, codes);
    }
    for (what, id, codes) in [
        ("apply-status of the first apply", first_apply, &[0][..]),
        (
            "apply-status of no apply",
            "0123456789abcdef0123456789abcdef",
            &[2],
        ),
    ] {
        let mut command = case.command(format, &["apply-status", id], Takes::Registry, &[]);
        sweep.expect(&format!("{what}, {tag}"), &mut command, codes);
    }
}

/// `snapshot`, `explain`, `fixture capture` (its case written to a file)
/// and `registry versions`.
fn readers(sweep: &mut Sweep, case: &Case, ctx: &Context, (i, format): (usize, &str)) {
    let tag = format!("{}, {format}", case.name);
    let captured = ctx.file(&format!("captured-{i}-{format}.json"));
    let runs: Vec<(&str, Vec<&str>, Takes, Vec<String>)> = vec![
        ("snapshot", vec!["snapshot"], Takes::Both, ctx.operator(&[])),
        (
            "explain",
            vec!["explain"],
            Takes::Both,
            ctx.operator(&["--worker", "w-dead-1"]),
        ),
        (
            "fixture capture",
            vec!["fixture", "capture"],
            Takes::Both,
            ctx.operator(&["--worker", "w-dead-1", "--out", &captured]),
        ),
        (
            "registry versions",
            vec!["registry", "versions"],
            Takes::Registry,
            Vec::new(),
        ),
    ];
    for (what, words, takes, rest) in runs {
        let mut command = case.command(format, &words, takes, &rest);
        sweep.expect(&format!("{what}, {tag}"), &mut command, &[0]);
    }
}

/// A worker's `register`, `heartbeat` and `release` (this test's process
/// is the worker: it is each command's parent), and `registry copy` onto
/// the registry, refused since its tables are not empty.
fn writers(sweep: &mut Sweep, case: &Case, ctx: &Context, (i, format): (usize, &str)) {
    let tag = format!("{}, {format}", case.name);
    let worker = format!("w-sweep-{i}-{format}");
    let register = ["--namespace", "author", "--repository-binding", REPO].map(String::from);
    for (what, rest) in [
        ("register", &register[..]),
        ("heartbeat", &[]),
        ("release", &[]),
    ] {
        let mut command = case.command(format, &[what], Takes::Registry, rest);
        command.env("GITEA_MCP_WORKER_IDENTITY", &worker);
        sweep.expect(&format!("{what}, {tag}"), &mut command, &[0]);
    }
    let mut command = clean(&case.env);
    command.args(["--format", format, "registry", "copy", "--from"]);
    command.args([&ctx.sqlite_registry, "--leases", &ctx.sqlite_leases]);
    command.args(["--to", &case.registry_url()]);
    sweep.expect(
        &format!("registry copy onto a full registry, {tag}"),
        &mut command,
        &[1],
    );
}

/// `policy diff --registry` in each format, ending in `code`.
fn policy_diff(sweep: &mut Sweep, case: &Case, formats: &[&str], code: i32) {
    for format in formats {
        let words = ["policy", "diff", "policies", "policies"];
        let rest = ["--canonical-repository", REPO].map(String::from);
        let mut command = case.command(format, &words, Takes::Both, &rest);
        sweep.expect(
            &format!("policy diff, {}, {format}", case.name),
            &mut command,
            &[code],
        );
    }
}

/// `registry copy` into an empty database of the role, through the case's
/// registry URL with its database swapped for that one.
fn copy_into(sweep: &mut Sweep, case: &Case, ctx: &Context, fresh: &PgDb, target: &Target) {
    let name = fresh.url.rsplit('/').next().unwrap();
    let to = case
        .registry_url()
        .replacen(&format!("/{}", target.db), &format!("/{name}"), 1);
    assert!(to.contains(name), "{to}");
    for format in ["json", "human"] {
        let mut command = clean(&case.env);
        command.args(["--format", format, "registry", "copy", "--from"]);
        command.args([
            &ctx.sqlite_registry,
            "--leases",
            &ctx.sqlite_leases,
            "--to",
            &to,
        ]);
        let codes: &[i32] = if format == "json" { &[0] } else { &[1] };
        sweep.expect(
            &format!("registry copy, {}, {format}", case.name),
            &mut command,
            codes,
        );
    }
}

/// A run of the binary: its name, words, the store flags it takes, the
/// arguments after them and the exit codes it may end with.
type Run<'a> = (&'a str, Vec<&'a str>, Takes, Vec<String>, &'a [i32]);

/// What runs against a broken store: as the registry (`leases_broken`
/// false) or as the lease store, which `snapshot` does not read.
fn broken_runs(ctx: &Context, leases_broken: bool) -> Vec<Run<'static>> {
    let snapshot: &[i32] = if leases_broken { &[0] } else { &[1] };
    let mut runs: Vec<Run<'static>> = vec![
        ("plan", vec!["plan"], Takes::Both, ctx.operator(&[]), &[1]),
        (
            "snapshot",
            vec!["snapshot"],
            Takes::Both,
            ctx.operator(&[]),
            snapshot,
        ),
        (
            "explain",
            vec!["explain"],
            Takes::Both,
            ctx.operator(&["--worker", "w-dead-1"]),
            &[1],
        ),
        (
            "fixture capture",
            vec!["fixture", "capture"],
            Takes::Both,
            ctx.operator(&["--worker", "w-dead-1"]),
            &[1],
        ),
        (
            "apply of a saved plan",
            vec!["apply", "first-plan.json"],
            Takes::Both,
            ctx.operator(&[]),
            &[1, 2],
        ),
        (
            "apply of tokens",
            vec!["apply"],
            Takes::Both,
            [ctx.operator(&[]), stranger_tokens()].concat(),
            &[1, 2],
        ),
    ];
    if !leases_broken {
        runs.push((
            "apply-status",
            vec!["apply-status", "0123456789abcdef0123456789abcdef"],
            Takes::Registry,
            Vec::new(),
            &[1],
        ));
        runs.push((
            "registry versions",
            vec!["registry", "versions"],
            Takes::Registry,
            Vec::new(),
            &[1],
        ));
    }
    runs
}

/// Every store command, with `url` as the registry and then as the lease
/// store (the other store working), in each format: each fails, and
/// `serve` too; and `plan` with `url` in the environment.
fn broken_url(
    sweep: &mut Sweep,
    what: &'static str,
    url: &str,
    n: usize,
    target: &Target,
    ctx: &Context,
) {
    for leases_broken in [false, true] {
        let (registry, leases) = match leases_broken {
            false => (url.to_string(), target.bare()),
            true => (target.bare(), url.to_string()),
        };
        let case = Case {
            name: what,
            registry: Some(registry),
            leases: Some(leases),
            env: Vec::new(),
        };
        let place = if leases_broken {
            "lease store"
        } else {
            "registry"
        };
        for format in ["human", "json"] {
            let tag = format!("{what} as the {place}, {format}");
            for (command_name, words, takes, rest, codes) in broken_runs(ctx, leases_broken) {
                let mut command = case.command(format, &words, takes, &rest);
                command.current_dir(&ctx.dir);
                sweep.expect(&format!("{command_name}, {tag}"), &mut command, codes);
            }
            if !leases_broken {
                broken_registry_writers(sweep, &case, ctx, &tag, format);
            }
        }
        policy_diff(sweep, &case, &["human", "json"], 1);
        controller::once(sweep, &case, ctx, &format!("{what} as the {place}"), &[1]);
        let tag = format!("broken{n}-{leases_broken}");
        serve(sweep, &case, ctx, &tag, false);
    }
    let by_env = Case {
        name: what,
        registry: None,
        leases: None,
        env: vec![
            ("FLEET_RETIRE_REGISTRY", url.to_string()),
            ("FLEET_RETIRE_LEASES", url.to_string()),
        ],
    };
    for format in ["human", "json"] {
        let mut command = by_env.command(format, &["plan"], Takes::Both, &ctx.operator(&[]));
        let what = format!("plan, {what} in the environment, {format}");
        sweep.expect(&what, &mut command, &[1]);
    }
}

/// `register` and `registry copy --to` on a registry URL that fails.
fn broken_registry_writers(sweep: &mut Sweep, case: &Case, ctx: &Context, tag: &str, format: &str) {
    let rest = ["--namespace", "author", "--repository-binding", REPO].map(String::from);
    let mut command = case.command(format, &["register"], Takes::Registry, &rest);
    command.env("GITEA_MCP_WORKER_IDENTITY", "w-sweep-never");
    sweep.expect(&format!("register, {tag}"), &mut command, &[1]);
    let mut command = clean(&[]);
    command.args([
        "--format",
        format,
        "registry",
        "copy",
        "--from",
        &ctx.sqlite_registry,
    ]);
    command.args(["--to", &case.registry_url()]);
    sweep.expect(&format!("registry copy, {tag}"), &mut command, &[1]);
}

/// A `serve` and the client's end of its stdio.
struct Mcp {
    child: KillOnDrop,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
    log: Option<std::thread::JoinHandle<String>>,
    /// Every line it wrote.
    transcript: String,
}

impl Mcp {
    fn start(mut command: Command) -> Mcp {
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = KillOnDrop(command.spawn().unwrap());
        let stdout = child.0.stdout.take().unwrap();
        let mut stderr = child.0.stderr.take().unwrap();
        let log = std::thread::spawn(move || {
            let mut log = String::new();
            let _ = stderr.read_to_string(&mut log);
            log
        });
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Mcp {
            stdin: child.0.stdin.take(),
            child,
            lines,
            log: Some(log),
            transcript: String::new(),
        }
    }

    fn send(&mut self, message: &Value) -> bool {
        let Some(stdin) = self.stdin.as_mut() else {
            return false;
        };
        writeln!(stdin, "{message}")
            .and_then(|()| stdin.flush())
            .is_ok()
    }

    /// A request and its answer, or `None` when the server has gone.
    fn call(&mut self, id: u64, method: &str, params: Value) -> Option<Value> {
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        if !self.send(&request) {
            return None;
        }
        loop {
            let line = self.lines.recv_timeout(Duration::from_secs(90)).ok()?;
            self.transcript.push_str(&line);
            self.transcript.push('\n');
            let message: Value = serde_json::from_str(&line).ok()?;
            if message["id"] == id {
                return Some(message);
            }
        }
    }

    /// Close its input and wait for it to end (killed after 30 s); what it
    /// wrote and logged.
    fn finish(mut self) -> String {
        drop(self.stdin.take());
        let started = Instant::now();
        while self.child.0.try_wait().unwrap().is_none()
            && started.elapsed() < Duration::from_secs(30)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.0.kill();
        let _ = self.child.0.wait();
        while let Ok(line) = self.lines.try_recv() {
            self.transcript.push_str(&line);
            self.transcript.push('\n');
        }
        let log = self
            .log
            .take()
            .map(|t| t.join().unwrap_or_default())
            .unwrap_or_default();
        format!("{}\n{log}", self.transcript)
    }
}

/// `serve` on the case's stores, driven over MCP (newline-delimited
/// JSON-RPC on its stdio): the tool list, every tool, the plan's resource,
/// an apply of tokens no plan has and a resource that does not exist.
/// What it answered and logged is swept. With `works` its plan succeeds;
/// otherwise the plan is a tool error, or the server ended at its start.
fn serve(sweep: &mut Sweep, case: &Case, ctx: &Context, tag: &str, works: bool) {
    let mut command = case.command("human", &["serve"], Takes::Both, &[]);
    command
        .env("GITEA_MCP_CONFIG", &ctx.profiles)
        .env("GITEA_MCP_PROFILE", PROFILE)
        .env("GITEA_MCP_NAMESPACE", "controller")
        .env("FLEET_RETIRE_CANONICAL_REPOSITORY", REPO)
        .env("GITEA_MCP_WORKER_IDENTITY", format!("w-sweep-serve-{tag}"))
        .env(
            "FLEET_RETIRE_PLAN_DIR",
            ctx.dir.join(format!("plans-{tag}")),
        );
    let what = format!("serve, {}", case.name);
    let mut mcp = Mcp::start(command);
    sweep.runs += 1;
    let init = json!({"protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "secret_sweep", "version": "0"}});
    let plan = mcp.call(0, "initialize", init).and_then(|_| {
        mcp.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        mcp.call(1, "tools/list", json!({}))?;
        mcp.call(2, "tools/call", tool("snapshot_instance_fleet", json!({})))?;
        let plan = mcp.call(
            3,
            "tools/call",
            tool("plan_stale_worker_retirement", json!({})),
        )?;
        let explain = json!({"worker_identity": "w-dead-1"});
        mcp.call(4, "tools/call", tool("explain_worker_retirement", explain))?;
        let stranger = json!({"registry_fingerprint": "registryfp-0000",
            "candidate_fingerprint": "candidatefp-0000", "policy_fingerprint": "policyfp-0000",
            "worker_identities": ["w-dead-1"]});
        mcp.call(
            5,
            "tools/call",
            tool("apply_stale_worker_retirement", stranger),
        )?;
        mcp.call(6, "resources/list", json!({}))?;
        let uri = plan
            .to_string()
            .split('"')
            .find(|s| s.starts_with("fleet-retire://plan/"))
            .map(str::to_string);
        let uri = uri.unwrap_or_else(|| "fleet-retire://plan/none".into());
        mcp.call(7, "resources/read", json!({"uri": uri}))?;
        mcp.call(
            8,
            "resources/read",
            json!({"uri": "fleet-retire://plan/none"}),
        )?;
        Some(plan)
    });
    let said = mcp.finish();
    sweep.look(&what, &said);
    let planned = plan.as_ref().is_some_and(|p| {
        p["result"]["isError"] != true
            && p["result"]["structuredContent"]["registry_fingerprint"].is_string()
    });
    if planned != works {
        sweep
            .wrong
            .push(format!("{what}: planned {planned}, meant {works}: {said}"));
    }
}

fn tool(name: &str, arguments: Value) -> Value {
    json!({"name": name, "arguments": arguments})
}

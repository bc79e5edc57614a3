//! The bench's registry: a fleet that never deletes a row, generated here
//! and written straight into PostgreSQL with `COPY`.
//!
//! Every host runs the same number of workers (`active` rows of its own,
//! launches of five namespace workers sharing an instance and a session;
//! three launches in five live, two dead and stale), and the rest of the
//! registry is history: restarts superseded, workers released or retired,
//! spread over every host, older than any active row (so written first, as
//! a real fleet wrote it). A larger registry is the same fleet run longer:
//! the hosts and their live workers stay, the history grows.
//!
//! The apply host (`APPLY_HOST`) runs only live launches; the apply part
//! adds its dead ones ([`add_dead`]) before each plan.
//!
//! Pids are drawn below 4,194,304 (a fleet's `pid_max`): on this machine
//! (`pid_max` 32,768) nearly all are dead, as a fleet's stale rows are.
//! The change record holds a key for every row, as it would after years
//! of triggers.

use std::io::Write;

/// The host whose scoped apply the bench measures.
pub const APPLY_HOST: &str = "h-3";
const NAMESPACES: [&str; 5] = ["author", "reviewer", "merger", "controller", "reconciler"];
const CLIENTS: [&str; 5] = ["codex", "claude_code", "gemini", "grok", "cursor"];
const COLUMNS: &str = "worker_identity, client_name, client_instance_id, instance_id_source, \
    instance_id_provenance, session_id, generation_id, role, profile, namespace, remote, \
    repository_binding, authenticated_account, transport, pid, started_at, last_heartbeat_at, \
    heartbeat_ttl_seconds, fencing_epoch, status, host_id, boot_id, process_start_time, \
    token_fingerprint, startup_revision, loaded_revision, retired_at, retired_by, \
    retirement_reason";

/// What to generate.
pub struct Shape {
    pub rows: u64,
    pub hosts: u64,
    /// Active rows per host.
    pub active: u64,
}

/// How a launch's latest registrations end.
#[derive(Clone, Copy, PartialEq)]
enum Fate {
    Live,
    Dead,
    Gone,
}

struct Gen {
    state: u64,
    now: i64,
    boot: String,
    serial: u64,
}

impl Gen {
    fn next(&mut self) -> u64 {
        // xorshift64*: deterministic, fast, good enough for a shape.
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn hex(&mut self, n: usize) -> String {
        format!("{:016x}", self.next())[..n].to_string()
    }

    fn iso(&self, at: i64) -> String {
        chrono::DateTime::from_timestamp(at, 0)
            .unwrap()
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string()
    }

    /// One launch of host `host`: `restarts` registrations per namespace,
    /// the latest of each ending as `fate` says, the earlier ones history.
    fn launch(&mut self, out: &mut dyn Write, host: &str, fate: Fate, restarts: u64) -> u64 {
        let client = CLIENTS[self.below(5) as usize];
        let minted = self.now - 86_400 * 30 - self.below(86_400 * 300) as i64;
        let stamp = chrono::DateTime::from_timestamp(minted, 0)
            .unwrap()
            .format("%Y%m%dT%H%M%SZ");
        let instance = format!("inst-{client}-{stamp}-{}", self.hex(12));
        let session = format!("sess-{}", self.hex(12));
        let mut written = 0;
        for ns in NAMESPACES {
            for generation in 0..restarts {
                let latest = generation + 1 == restarts;
                let status = match (latest, fate) {
                    (true, Fate::Live | Fate::Dead) => "active",
                    _ => {
                        ["superseded", "superseded", "released", "retired"][self.below(4) as usize]
                    }
                };
                let started = minted + generation as i64 * 3600;
                let (beat, ttl) = match (status, fate) {
                    // Live: beat at generation, fresh for two hours.
                    ("active", Fate::Live) => (self.now, 7200),
                    ("active", _) => (self.now - 3600 - self.below(86_400 * 40) as i64, 900),
                    _ => (started + 60 + self.below(86_400) as i64, 900),
                };
                let boot = if status == "active" || self.below(10) < 3 {
                    self.boot.clone()
                } else {
                    format!(
                        "0b00{:04x}-0000-4000-8000-{:012x}",
                        generation,
                        self.below(8)
                    )
                };
                self.serial += 1;
                let retired = if status == "retired" {
                    format!(
                        "{}\tcontroller-prgs\teligible_stale_orphan",
                        self.iso(beat + 7200)
                    )
                } else {
                    "\\N\t\\N\t\\N".into()
                };
                let (tag, generation_id, token) = (self.hex(6), self.hex(12), self.hex(16));
                let (pid, ticks) = (
                    300 + self.below(4_194_000),
                    10_000 + self.below(900_000_000),
                );
                let (started, beat, epoch) = (self.iso(started), self.iso(beat), generation + 1);
                let line = format!(
                    "w-{ns}-{:09}-{tag}\t{client}\t{instance}\tlauncher\ttrusted_launcher\t{session}\t\
                     gen-{generation_id}\t{ns}\t{ns}-prgs\t{ns}\tprgs\tprgs/gitea-tools\tbot-{ns}\tstdio\t\
                     {pid}\t{started}\t{beat}\t{ttl}\t{epoch}\t{status}\t{host}\t{boot}\tticks-{ticks}\t\
                     tokfp-{token}\trev-4f2a9c1\trev-4f2a9c1\t{retired}\n",
                    self.serial,
                );
                out.write_all(line.as_bytes()).unwrap();
                written += 1;
            }
        }
        written
    }
}

/// Rows written by `write` into the registry at `url` with one `COPY`;
/// `seed` tells runs apart (identities stay unique: each carries random
/// hex).
fn copy(url: &str, seed: u64, write: impl FnOnce(&mut Gen, &mut dyn Write) -> u64) -> u64 {
    let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap()
        .trim()
        .to_string();
    let mut g = Gen {
        state: 0x9E37_79B9_7F4A_7C15 ^ seed.wrapping_mul(0x1000_0000_01B3),
        now: chrono::Utc::now().timestamp(),
        boot,
        serial: seed * 1_000_000_000,
    };
    let sink = c
        .copy_in(&format!("COPY worker_registrations ({COLUMNS}) FROM STDIN"))
        .unwrap();
    let mut out = std::io::BufWriter::with_capacity(1 << 20, sink);
    let written = write(&mut g, &mut out);
    out.into_inner()
        .map_err(|e| e.to_string())
        .unwrap()
        .finish()
        .unwrap();
    written
}

/// Write the fleet of `shape` into the registry at `url` (tables made,
/// empty, no change record yet): the history first, then every host's
/// current launches. Returns the rows written (the shape's, rounded to
/// whole launches).
pub fn fill(url: &str, shape: &Shape) -> u64 {
    copy(url, 0, |g, out| {
        let history = shape.rows.saturating_sub(shape.hosts * shape.active);
        let mut written = 0;
        let mut launch = 0;
        while written < history {
            let host = format!("h-{}", launch % shape.hosts);
            let restarts = [1, 2, 3, 4, 6, 8, 10, 12][g.below(8) as usize];
            written += g.launch(out, &host, Fate::Gone, restarts);
            launch += 1;
        }
        // Every host's current launches, one round of hosts at a time.
        for round in 0..shape.active / 5 {
            for h in 0..shape.hosts {
                let host = format!("h-{h}");
                let fate = if round % 5 < 3 || host == APPLY_HOST {
                    Fate::Live
                } else {
                    Fate::Dead
                };
                written += g.launch(out, &host, fate, 1);
            }
        }
        written
    })
}

/// `n` (rounded up to whole launches) stale rows of `host`, dead
/// launches registered since the fill: candidates of its next plan.
pub fn add_dead(url: &str, host: &str, n: u64, seed: u64) -> u64 {
    copy(url, seed, |g, out| {
        (0..n.div_ceil(5))
            .map(|_| g.launch(out, host, Fate::Dead, 1))
            .sum()
    })
}

/// After [`fill`] and the change record's install: a key for every row,
/// then statistics for the planner.
pub fn stamp_and_analyze(url: &str) {
    let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
    c.batch_execute(
        "INSERT INTO fleet_retire_changes (key, xid) \
         SELECT 'i:' || worker_identity, pg_current_xact_id() FROM worker_registrations \
         ON CONFLICT (key) DO NOTHING",
    )
    .unwrap();
    c.batch_execute("VACUUM ANALYZE").unwrap();
}

/// Bytes the database at `url` takes.
pub fn size(url: &str) -> u64 {
    let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
    let n: i64 = c
        .query_one("SELECT pg_database_size(current_database())", &[])
        .unwrap()
        .get(0);
    n as u64
}

//! A host's scope (`plan --scope host`, issue 54): the rows one host's plan
//! reads, engine-neutral. Each engine's query is in its own folder
//! (`sqlite/scope.rs`, `postgres/scope.rs`); what it must fetch is stated
//! here, once.
//!
//! A host retires only its own rows, and only an active one (`status`
//! exactly `active`) can be a candidate. Its scope is:
//!
//! * **its own rows**: `host_id` exactly this host's id (the kernel's node
//!   name) and `status` exactly `active`, read whole;
//! * **its other rows** (any other status, NULL included): counted through
//!   the index, never read;
//! * **the peer rows**, every row whose first-stage answers or presence a
//!   verdict of its own rows depends on. The peer facts (`observe.rs`,
//!   `PeerFacts` and `identity_row_count`; docs/semantics.md §17) and the
//!   rows each needs:
//!
//!   | peer fact | rows it counts | fetched by |
//!   | --- | --- | --- |
//!   | `identity_row_count` | every row, any status, whose `worker_identity` has the same canonical text | `worker_identity` |
//!   | `shared_identity_evidence`, kind `session_id` | rows the `hold_session_id` action permits, with the same session | `session_id`, active rows |
//!   | … `generation_id` | … `hold_generation_id`, same generation | `generation_id`, active rows |
//!   | … `process_identity` | … `hold_process_identity`, same given identity, or the `pid-<pid>` a row without one derives | `process_identity`; `pid` for the derived one |
//!   | … `pid` | … `hold_pid`, same pid | `pid`, active rows |
//!   | `slot_active_claimants`, `slot_occupants` | rows `claim_instance_slot` permits in the same (instance, namespace) slot, and of them those `occupy_instance_slot` permits | `client_instance_id`, active rows (a superset: every namespace of the instance) |
//!   | lease protections | the active leases (read whole, as the seed's external token covers them all) | — |
//!
//! "Active rows" rests on the first stage's policies: a row holds evidence
//! or claims a slot only when its status is exactly `active`. That is
//! checked on the loaded policy set before a scoped read is trusted
//! (`policy::scope_assumptions`), and a set that does not show it is refused
//! for `--scope host`, so a policy that starts counting another row cannot
//! quietly meet a query that does not fetch it.
//!
//! Matching is by canonical text (docs/semantics.md §5), while an engine
//! compares stored values: each key is offered in every storage class whose
//! canonical text it could be (text, the integer or real it parses as, the
//! bytes whose `repr` it is),
//! so the query fetches a superset of the rows that match. What it fetches
//! beyond them is left out (`PeerKeys::finds`, the definition in Rust), so
//! an engine's indexed read and the scope taken from a read of every row
//! (`from_whole_read`, a scoped apply's read when the indexes cannot be
//! trusted under its lock) are the same rows, and so judged alike.

use crate::row::{Col, Row};
use crate::value::Val;
use std::collections::BTreeSet;

/// What one host's scoped read returned, in one snapshot.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// The host whose scope this is.
    pub host_id: String,
    /// Its active rows, in registry order.
    pub own: Vec<Row>,
    /// The peer rows (none of them one of `own`), in registry order.
    pub peers: Vec<Row>,
    /// Its rows that are not active, counted, not read.
    pub terminal: u64,
}

/// The keys the peer query matches, each as canonical text (docs above).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerKeys {
    /// `worker_identity` (rows of any status).
    pub identities: BTreeSet<String>,
    /// `session_id` (active rows).
    pub sessions: BTreeSet<String>,
    /// `generation_id` (active rows).
    pub generations: BTreeSet<String>,
    /// `process_identity` as given (active rows).
    pub process_identities: BTreeSet<String>,
    /// `pid` (active rows): the own rows' pids, and the pid of every
    /// `pid-<pid>` process identity, which a row without a given one
    /// derives from its pid.
    pub pids: BTreeSet<String>,
    /// `client_instance_id` of a named slot (active rows).
    pub instances: BTreeSet<String>,
}

impl PeerKeys {
    /// The keys of `own` (this host's active rows).
    pub fn of(own: &[Row]) -> PeerKeys {
        let mut keys = PeerKeys::default();
        let put = |set: &mut BTreeSet<String>, text: String| {
            if !text.is_empty() {
                set.insert(text);
            }
        };
        for row in own {
            put(&mut keys.identities, row.get(Col::WorkerIdentity).canon());
            put(&mut keys.sessions, row.get(Col::SessionId).canon());
            put(&mut keys.generations, row.get(Col::GenerationId).canon());
            put(&mut keys.pids, row.get(Col::Pid).canon());
            let process = if row.get(Col::ProcessIdentity).truthy() {
                row.get(Col::ProcessIdentity).canon()
            } else if !row.get(Col::Pid).is_null() {
                format!("pid-{}", row.get(Col::Pid).py_str())
            } else {
                String::new()
            };
            if let Some(pid) = process.strip_prefix("pid-") {
                put(&mut keys.pids, pid.to_string());
            }
            put(&mut keys.process_identities, process);
            let instance = row.get(Col::ClientInstanceId).canon();
            if !row.get(Col::Namespace).canon().is_empty() {
                put(&mut keys.instances, instance);
            }
        }
        keys
    }

    /// Each key column the peer query matches, whether it matches rows of
    /// any status (else active rows only), and the keys: the table above,
    /// as both engines' queries read it.
    pub fn columns(&self) -> [(Col, bool, &BTreeSet<String>); 6] {
        [
            (Col::WorkerIdentity, true, &self.identities),
            (Col::SessionId, false, &self.sessions),
            (Col::GenerationId, false, &self.generations),
            (Col::ProcessIdentity, false, &self.process_identities),
            (Col::Pid, false, &self.pids),
            (Col::ClientInstanceId, false, &self.instances),
        ]
    }

    /// Whether `row`, not one of the own rows, is a peer by these keys: a
    /// key column (`columns`) whose canonical text is one of its keys, on a
    /// row whose `status` is exactly `active` unless the column matches
    /// rows of any status. This is the definition; an engine's query
    /// fetches a superset of these rows (module docs), and what it fetched
    /// is kept only when this holds, so the indexed read and the scope
    /// taken from a whole read ([`from_whole_read`]) are the same rows.
    ///
    /// A row without a process identity of its own holds the one it
    /// derives from its pid (`pid-` and the pid as Python writes it, which
    /// for a whole real is not its canonical text: `pid-10.0` against
    /// `10`), so that one is compared too.
    pub fn finds(&self, row: &Row) -> bool {
        let active = is_active(row);
        let by_column = self.columns().iter().any(|(column, any_status_ok, keys)| {
            (*any_status_ok || active)
                && !keys.is_empty()
                && keys.contains(row.get(*column).canon_cow().as_ref())
        });
        by_column || (active && self.derives_a_process_identity(row))
    }

    /// Whether `row` has no process identity of its own and the one its pid
    /// derives is one of the keys.
    fn derives_a_process_identity(&self, row: &Row) -> bool {
        let pid = row.get(Col::Pid);
        !row.get(Col::ProcessIdentity).truthy()
            && !pid.is_null()
            && self
                .process_identities
                .contains(&format!("pid-{}", pid.py_str()))
    }

    /// Whether there is nothing to match.
    pub fn is_empty(&self) -> bool {
        self.identities.is_empty()
            && self.sessions.is_empty()
            && self.generations.is_empty()
            && self.process_identities.is_empty()
            && self.pids.is_empty()
            && self.instances.is_empty()
    }
}

/// Whether `row`'s `status` is exactly the text `active`.
fn is_active(row: &Row) -> bool {
    matches!(row.get(Col::Status), Val::Text("active"))
}

/// Whether `row` is one of host `host_id`'s rows: `host_id` exactly that
/// text (never a name with spaces around it, in another case, or of
/// another type).
fn is_hosts(row: &Row, host_id: &str) -> bool {
    matches!(row.get(Col::HostId), Val::Text(h) if h == host_id)
}

/// Host `host_id`'s scope taken from every row of the registry (`rows`, in
/// registry order), with the rows of the identities `also` among the
/// peers: what an engine's indexed read returns, by the definitions above,
/// computed here without an index. A scoped apply uses it under its lock
/// when the indexes cannot be trusted there (one dropped or replaced since
/// the plan): slower, never different.
pub fn from_whole_read(rows: Vec<Row>, host_id: &str, also: &[String]) -> Scope {
    let (own, others): (Vec<Row>, Vec<Row>) = rows
        .into_iter()
        .partition(|row| is_hosts(row, host_id) && is_active(row));
    let terminal = others.iter().filter(|row| is_hosts(row, host_id)).count() as u64;
    let mut keys = PeerKeys::of(&own);
    keys.identities.extend(also.iter().cloned());
    let peers = others.into_iter().filter(|row| keys.finds(row)).collect();
    Scope {
        host_id: host_id.to_string(),
        own,
        peers,
        terminal,
    }
}

/// The values whose canonical text `key` could be, for an engine that
/// compares stored values of any storage class (SQLite): the text itself,
/// the integer or the real it reads as (Python's `repr` of a real reads
/// back as that very real, and an integral real's text as an integer), and
/// the bytes whose `repr` it is.
pub fn stored_forms(key: &str) -> Vec<crate::value::Value> {
    use crate::value::Value;
    let mut forms = vec![Value::Text(key.into())];
    if let Some(bytes) = bytes_of_repr(key) {
        forms.push(Value::Blob(bytes.into()));
    }
    if let Ok(i) = key.parse::<i64>() {
        forms.push(Value::Int(i));
    }
    // An infinite real too: its canonical text is `inf` / `-inf`, which
    // a text elsewhere (a given `pid-inf`, whose pid is `inf`) can equal.
    // NaN is no stored value (SQLite stores NULL).
    if let Ok(f) = key.parse::<f64>() {
        if !f.is_nan() {
            forms.push(Value::Real(f));
        }
    }
    forms
}

/// The bytes whose canonical text (Python's `repr` of bytes: `b'…'`) is
/// exactly `key`, if any.
fn bytes_of_repr(key: &str) -> Option<Vec<u8>> {
    let body = key.strip_prefix('b')?;
    let quote = body.chars().next().filter(|q| *q == '\'' || *q == '"')?;
    let inner = body.strip_prefix(quote)?.strip_suffix(quote)?;
    let mut out = Vec::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(u8::try_from(c).ok()?);
            continue;
        }
        match chars.next()? {
            '\\' => out.push(b'\\'),
            't' => out.push(b'\t'),
            'n' => out.push(b'\n'),
            'r' => out.push(b'\r'),
            'x' => {
                let hex: String = chars.by_ref().take(2).collect();
                out.push(u8::from_str_radix(&hex, 16).ok()?);
            }
            q => out.push(u8::try_from(q).ok()?),
        }
    }
    // Only a text that is exactly the bytes' canonical text.
    (crate::value::Val::Blob(&out).canon() == key).then_some(out)
}

/// The integers whose canonical text `key` could be, for a column of an
/// integer type (PostgreSQL's `pid`): the integer it reads as, or the
/// integral real it reads as.
pub fn integer_form(key: &str) -> Option<i64> {
    if let Ok(i) = key.parse::<i64>() {
        return Some(i);
    }
    let f = key.parse::<f64>().ok()?;
    (f.is_finite() && f.fract() == 0.0 && f.abs() < 9.2e18).then_some(f as i64)
}

/// The indexes a scoped read goes through, each: its name, its columns,
/// and whether it holds only active rows (`status = 'active'`, the only
/// rows a peer of those kinds can be). `worker_identity` is the table's
/// key. Made by `registry create`, `registry copy`, `registry versions`
/// and the first apply's bookkeeping install; checked before every scoped
/// read (a missing one, or one of another shape, is named, never trusted:
/// the scoped plan stops, a scoped apply reads every row instead).
pub const INDEXES: [(&str, &str, bool); 6] = [
    ("fleet_retire_scope_host", "host_id, status", false),
    ("fleet_retire_scope_session", "session_id", true),
    ("fleet_retire_scope_generation", "generation_id", true),
    ("fleet_retire_scope_process", "process_identity", true),
    ("fleet_retire_scope_pid", "pid", true),
    ("fleet_retire_scope_instance", "client_instance_id", true),
];

/// The statement that creates one of [`INDEXES`] when it does not exist
/// (SQL both engines read alike; `CONCURRENTLY` is PostgreSQL's, outside
/// any transaction).
pub fn index_sql(name: &str, columns: &str, active_only: bool, concurrently: bool) -> String {
    format!(
        "CREATE INDEX {}IF NOT EXISTS {name} ON {} ({columns}){}",
        if concurrently { "CONCURRENTLY " } else { "" },
        crate::store::registry::TABLE,
        if active_only {
            " WHERE status = 'active'"
        } else {
            ""
        }
    )
}

/// Why an index of ours is not to be trusted, in words for the operator:
/// `found` is what the engine holds under its name (`None`: nothing).
pub fn index_words(name: &str, found: Option<&str>, expected: &str, fix: &str) -> String {
    match found {
        None => format!("the index {name} is missing ({fix})"),
        Some(found) => format!(
            "the index {name} is not ours: it is `{found}` where `{expected}` is expected \
             (drop it, then {fix})"
        ),
    }
}

/// The error a scoped read gives when the registry cannot be read through
/// its scope: what was found, and the way out.
pub fn unreadable_scope(why: &str) -> String {
    format!(
        "cannot be read by host scope: {why}. Plan without `--scope host` (the whole registry \
         is read then), or let `fleet-retire registry versions` / a newer `registry copy` \
         make the registry's indexes"
    )
}

/// Whether a registry error's message is [`unreadable_scope`]'s.
pub fn is_unreadable_scope(message: &str) -> bool {
    message.starts_with("cannot be read by host scope: ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scope taken from every row: this host's active rows (its name
    /// exactly), its other rows counted, and as peers exactly the rows that
    /// share a key, active unless by identity, or are requested.
    #[test]
    fn the_scope_from_a_whole_read_is_the_definition() {
        let row = |json: serde_json::Value| Row::from_json(json.as_object().unwrap()).unwrap();
        let rows = vec![
            row(serde_json::json!({"worker_identity": "own", "host_id": "h",
                "status": "active", "session_id": "s", "pid": 10})),
            row(
                serde_json::json!({"worker_identity": "gone", "host_id": "h",
                "status": "retired", "session_id": "s"}),
            ),
            row(
                serde_json::json!({"worker_identity": "peer-session", "host_id": "o",
                "status": "active", "session_id": "s"}),
            ),
            row(
                serde_json::json!({"worker_identity": "peer-pid", "host_id": " h",
                "status": "active", "process_identity": "pid-10"}),
            ),
            row(
                serde_json::json!({"worker_identity": "retired-session", "host_id": "o",
                "status": "retired", "session_id": "s"}),
            ),
            row(serde_json::json!({"worker_identity": "own", "host_id": "o",
                "status": "released"})),
            row(
                serde_json::json!({"worker_identity": "asked", "host_id": "o",
                "status": "retired"}),
            ),
            row(
                serde_json::json!({"worker_identity": "stranger", "host_id": "o",
                "status": "active", "session_id": "t", "pid": 11}),
            ),
        ];
        let scope = from_whole_read(rows, "h", &["asked".to_string()]);
        let ids = |rows: &[Row]| -> Vec<String> {
            rows.iter()
                .map(|r| r.get(Col::WorkerIdentity).canon())
                .collect()
        };
        assert_eq!(ids(&scope.own), ["own"]);
        assert_eq!(scope.terminal, 1);
        assert_eq!(
            ids(&scope.peers),
            ["peer-session", "peer-pid", "own", "asked"]
        );
    }

    /// A peer without a process identity shares the one its pid derives,
    /// written as Python writes the pid: a whole real (`pid-10.0`, whose
    /// canonical pid text is `10`) and a large one (`1e+16`) are peers.
    #[test]
    fn a_peer_whose_pid_derives_an_own_rows_process_identity_is_found() {
        let row = |json: serde_json::Value| Row::from_json(json.as_object().unwrap()).unwrap();
        for (given, pid) in [
            ("pid-10.0", serde_json::json!(10.0)),
            ("pid-1e+16", serde_json::json!(1e16)),
        ] {
            let rows = vec![
                row(serde_json::json!({"worker_identity": "own", "host_id": "h",
                    "status": "active", "process_identity": given, "pid": 7})),
                row(
                    serde_json::json!({"worker_identity": "peer", "host_id": "o",
                    "status": "active", "pid": pid}),
                ),
                row(
                    serde_json::json!({"worker_identity": "retired-peer", "host_id": "o",
                    "status": "retired", "pid": pid}),
                ),
            ];
            let scope = from_whole_read(rows, "h", &[]);
            let peers: Vec<String> = scope
                .peers
                .iter()
                .map(|r| r.get(Col::WorkerIdentity).canon())
                .collect();
            assert_eq!(peers, ["peer"], "{given}");
        }
    }

    /// Every key is offered in each storage class whose canonical text it
    /// is: a value of any class is found by its own canonical text.
    #[test]
    fn a_value_of_any_class_is_found_by_its_canonical_text() {
        let values = [
            Val::Int(42),
            Val::Int(-7),
            Val::Real(42.0),
            Val::Real(1e23),
            Val::Real(1e-5),
            Val::Real(-0.0),
            Val::Real(f64::INFINITY),
            Val::Real(f64::NEG_INFINITY),
            Val::Text("s-1"),
            Val::Text("42"),
            Val::Blob(b"ab'c\n\x00\\"),
            Val::Blob(b"say \"hi\""),
            Val::Blob(b"both ' and \""),
        ];
        for v in values {
            let forms = stored_forms(&v.canon());
            assert!(
                forms.iter().any(|f| f.as_val() == v
                    || (matches!(
                        (f.as_val(), v),
                        (Val::Int(_) | Val::Real(_), Val::Int(_) | Val::Real(_))
                    ) && f.as_val().canon() == v.canon())),
                "{v:?} not among {forms:?}"
            );
        }
    }
}

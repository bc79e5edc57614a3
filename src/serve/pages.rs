//! A plan as an agent reads it: a summary sized for a decision, and its
//! rows in pages, each result under [`RESULT_BOUND`] bytes whatever the
//! registry's size or its rows' contents.
//!
//! The plan tool answers with the tokens, the counts and the candidates an
//! apply can take (at most the server's `--max-retire`); preserved rows come
//! when asked, a page at a time, optionally of one reason code; the whole
//! document comes as `include: "all"` when it fits, and always as the
//! resource `fleet-retire://plan/<registry token>`, read a page at a time.
//! Every page is cut from a plan this server issued and keeps, by a cursor
//! sealed to that plan ([`super::cursor`]).

use super::cursor::{List, Position, Sealer};
use crate::plan::planned::PlannedRows;
use crate::plan::{Entry, Plan};
use serde_json::{json, Map, Value as Json};
use std::sync::Arc;

/// No result the server sends is larger (the JSON of its structured
/// content; its text summary is a paragraph).
pub const RESULT_BOUND: usize = 1 << 20;

/// The bytes of rows one page may hold, leaving room for the rest.
const ROWS_BUDGET: usize = 768 * 1024;

/// The bytes of rows one resource page may hold: a resource's text is
/// JSON inside a JSON string, where each quote and backslash is escaped
/// again, so its page holds at most half the bound of rows.
const RESOURCE_ROWS_BUDGET: usize = 448 * 1024;

/// Rows per page unless the caller asks otherwise, and the most it may ask.
pub(super) const DEFAULT_LIMIT: usize = 100;
/// See [`DEFAULT_LIMIT`].
pub(super) const MAX_LIMIT: usize = 1000;

/// An issued plan the server keeps for paging and for the apply that
/// follows it.
pub(super) struct KeptPlan {
    /// The plan, rows and verdicts.
    pub(super) plan: Plan,
    /// Its rows' digests, for the apply.
    pub(super) rows: Arc<PlannedRows>,
    /// The policy set's label.
    pub(super) policy_source: String,
    /// Which of this server's plans it is (1, 2, …).
    pub(super) issued: u64,
}

impl KeptPlan {
    /// The plan's key: its registry and candidate tokens and its number
    /// among this server's plans. Two plans of one registry token may
    /// differ in their verdicts (time passed between them, nothing was
    /// written), even with the same candidates (a preserved row moved from
    /// one reason to another), so a cursor or a resource names the one plan
    /// it was cut from (found by CI twice: a cursor of one plan paged the
    /// other, and a reason's pages held one row more than its count).
    pub(super) fn key(&self) -> String {
        format!(
            "{}.{}.{}",
            self.plan.registry_fingerprint, self.plan.candidate_fingerprint, self.issued
        )
    }

    /// The next plan's number in this server.
    pub(super) fn next_issued() -> u64 {
        static ISSUED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        ISSUED.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// The URI of the plan's full document, as a resource.
    pub(super) fn uri(&self) -> String {
        format!("fleet-retire://plan/{}", self.key())
    }
}

/// One page of rows.
pub(super) struct Page {
    /// The rows, as the plan document renders them.
    pub(super) rows: Vec<Json>,
    /// Rows of the list not on this or an earlier page.
    pub(super) remaining: usize,
    /// Where the next page starts, when there is one.
    pub(super) next: Option<Position>,
}

/// Render entries from `position.offset` until the page's limit or byte
/// budget is reached. A single row larger than the budget is shown by its
/// identity and verdict only, with a note to ask `explain` for the rest.
fn cut<'p>(
    plan: &'p Plan,
    list: impl Iterator<Item = &'p Entry>,
    total: usize,
    position: &Position,
    budget: usize,
) -> Page {
    let mut rows = Vec::new();
    let mut used = 0usize;
    for entry in list.skip(position.offset) {
        if rows.len() == position.limit {
            break;
        }
        let mut row = serde_json::to_value(plan.entry_json(entry)).expect("an entry serialises");
        let mut size = json_size(&row);
        if size > budget {
            row = oversized(plan, entry);
            size = json_size(&row);
        }
        if used.saturating_add(size) > budget && !rows.is_empty() {
            break;
        }
        used = used.saturating_add(size);
        rows.push(row);
    }
    let through = position.offset + rows.len();
    let next = (through < total).then(|| Position {
        offset: through,
        ..position.clone()
    });
    Page {
        rows,
        remaining: total.saturating_sub(through),
        next,
    }
}

/// The bytes of a value's JSON.
pub(super) fn json_size(value: &Json) -> usize {
    serde_json::to_vec(value).map_or(usize::MAX, |b| b.len())
}

/// Keep the first items of `list` whose JSON fits in `budget` bytes;
/// returns how many were dropped.
pub(super) fn keep_within(list: &mut Vec<Json>, budget: usize) -> usize {
    let mut used = 0usize;
    let keep = list
        .iter()
        .take_while(|item| {
            used = used.saturating_add(json_size(item));
            used <= budget
        })
        .count();
    let dropped = list.len() - keep;
    list.truncate(keep);
    dropped
}

/// A row too large to send whole: its identity (cut to 256 characters)
/// and its verdict.
fn oversized(plan: &Plan, entry: &Entry) -> Json {
    let identity: String = plan.identity(entry).chars().take(256).collect();
    json!({
        "worker_identity": identity,
        "reason_code": entry.reason().code(),
        "reason_codes": entry.reason_codes().iter().map(|r| r.code()).collect::<Vec<_>>(),
        "evidence_omitted": format!(
            "this row's evidence is over {ROWS_BUDGET} bytes; explain_worker_retirement shows it"
        ),
    })
}

/// A page of preserved rows (of one reason code, when the position names
/// one).
pub(super) fn preserved_page(kept: &KeptPlan, position: &Position) -> Page {
    let plan = &kept.plan;
    let wanted = position.reason_code.as_deref();
    let matches = move |e: &&Entry| wanted.is_none_or(|code| e.reason().code() == code);
    let total = plan.preserved().filter(matches).count();
    cut(
        plan,
        plan.preserved().filter(matches),
        total,
        position,
        ROWS_BUDGET,
    )
}

/// The summary result of a plan (tokens, counts, and the identities of the
/// candidates an apply can take; with `rows`, those candidates whole) and
/// the paragraph an agent reads first.
pub(super) fn summary(
    kept: &KeptPlan,
    max_retire: usize,
    rows: bool,
) -> (Map<String, Json>, String) {
    let plan = &kept.plan;
    let counts = Counts::of(plan);
    let first = Position {
        plan: kept.key(),
        list: List::Document,
        reason_code: None,
        offset: 0,
        limit: max_retire.max(1),
    };
    let shown = cut(
        plan,
        plan.candidates(),
        counts.candidates,
        &first,
        ROWS_BUDGET / 3,
    );
    // An identity over 1,024 characters is cut, as an oversized row is:
    // such a row cannot be retired through a tool call (an apply naming the
    // cut identity finds no candidate and retires nothing).
    let identities: Vec<Json> = plan
        .candidates()
        .take(shown.rows.len())
        .map(|e| {
            match plan.rows[e.index]
                .get(crate::row::Col::WorkerIdentity)
                .to_json()
            {
                Json::String(s) if s.len() > 1024 => {
                    json!(s.chars().take(1024).collect::<String>())
                }
                other => other,
            }
        })
        .collect();
    let text = counts.paragraph(kept, shown.rows.len(), max_retire);
    let mut body = Map::new();
    body.insert("outcome".into(), json!("planned"));
    body.insert("read_only".into(), json!(true));
    tokens_into(&mut body, kept);
    body.insert("assessed_count".into(), json!(counts.assessed));
    body.insert("candidate_count".into(), json!(counts.candidates));
    body.insert("preserved_count".into(), json!(counts.preserved()));
    body.insert("preserved_reason_counts".into(), json!(counts.reasons));
    body.insert("other_host_rows".into(), json!(counts.other_host));
    body.insert("candidate_worker_identities".into(), json!(identities));
    if rows {
        body.insert("candidates".into(), Json::Array(shown.rows));
    }
    body.insert("candidates_not_shown".into(), json!(shown.remaining));
    body.insert("resource_uri".into(), json!(kept.uri()));
    let (scope, read) = match &plan.scope {
        Some(s) => (
            json!(s),
            format!(
                "Scope: host {}'s ({} of its active rows judged, {} peer rows read for their \
                 verdicts; tokens host-scope:). ",
                crate::text::esc(&s.host_id),
                s.own_rows,
                s.peer_rows
            ),
        ),
        None => (
            json!({"kind": "registry"}),
            "Scope: the whole registry. ".to_string(),
        ),
    };
    body.insert("scope".into(), scope);
    (body, format!("{read}{text}"))
}

/// A plan's counts.
struct Counts {
    assessed: usize,
    candidates: usize,
    other_host: usize,
    reasons: std::collections::BTreeMap<&'static str, usize>,
}

impl Counts {
    fn of(plan: &Plan) -> Counts {
        Counts {
            assessed: plan.entries.len(),
            candidates: plan.candidates().count(),
            other_host: plan.other_host_rows(),
            reasons: plan.reason_counts(),
        }
    }

    fn preserved(&self) -> usize {
        self.assessed - self.candidates
    }

    /// The one paragraph an agent reads first.
    fn paragraph(&self, kept: &KeptPlan, shown: usize, max_retire: usize) -> String {
        let plan = &kept.plan;
        let mut reasons: Vec<(&&str, &usize)> = self.reasons.iter().collect();
        reasons.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let reasons: Vec<String> = reasons.iter().map(|(k, c)| format!("{c} {k}")).collect();
        let more = match self.candidates - shown {
            0 => String::new(),
            k => format!(
                " ({shown} named here, {k} more: this server retires at most {max_retire} per \
                 apply; retire them in batches with first: {max_retire} and these tokens, call \
                 after call)"
            ),
        };
        let to_retire = if self.candidates == 0 {
            "Nothing may be retired now.".to_string()
        } else {
            format!(
                "To retire, call apply_stale_worker_retirement with registry_fingerprint {}, \
                 candidate_fingerprint {}, policy_fingerprint {} and worker_identities from \
                 candidate_worker_identities (or first: N). To review the candidates whole, \
                 call this tool with include \"candidates\".",
                plan.registry_fingerprint, plan.candidate_fingerprint, plan.policy_fingerprint,
            )
        };
        format!(
            "{} rows assessed: {} may be retired{more}, {} preserved ({}); {} on other \
             hosts. {to_retire} Preserved rows: call this tool with preserved \
             {{\"reason_code\", \"limit\"}}; the whole document is the resource {}.",
            self.assessed,
            self.candidates,
            self.preserved(),
            reasons.join(", "),
            self.other_host,
            kept.uri(),
        )
    }
}

/// The plan's tokens, repository and policy source, which every plan
/// result and page carries.
pub(super) fn tokens_into(body: &mut Map<String, Json>, kept: &KeptPlan) {
    let plan = &kept.plan;
    body.insert(
        "registry_fingerprint".into(),
        json!(plan.registry_fingerprint),
    );
    body.insert(
        "candidate_fingerprint".into(),
        json!(plan.candidate_fingerprint),
    );
    body.insert("policy_fingerprint".into(), json!(plan.policy_fingerprint));
    body.insert("policy_source".into(), json!(kept.policy_source));
    body.insert(
        "canonical_repository".into(),
        json!(plan.facts.canonical_repository),
    );
}

/// The whole plan document, as `plan --format json` prints it, when it is
/// under `bound` bytes; otherwise its size so far, for the refusal.
pub(super) fn whole(kept: &KeptPlan, bound: usize) -> Result<Json, usize> {
    let mut out = Bounded {
        bytes: Vec::new(),
        bound,
    };
    if kept.plan.write_json(&mut out).is_err() {
        return Err(out.bytes.len());
    }
    serde_json::from_slice(&out.bytes).map_err(|_| out.bytes.len())
}

/// A writer that refuses to grow past its bound.
struct Bounded {
    bytes: Vec<u8>,
    bound: usize,
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > self.bound {
            return Err(std::io::Error::other("over the result bound"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One page of the whole document, as the resource serves it: the
/// document's head (without the candidate list, which the pages carry) on
/// the first page, then candidates and preserved rows in document order.
pub(super) fn document_page(kept: &KeptPlan, position: &Position, sealer: &Sealer) -> Json {
    let plan = &kept.plan;
    let candidates = plan.candidates().count();
    let mut body = Map::new();
    if position.offset == 0 {
        if let Ok(Json::Object(mut head)) = serde_json::to_value(plan.head()) {
            head.remove("candidate_worker_identities");
            body.extend(head);
        }
    }
    tokens_into(&mut body, kept);
    let page = cut(
        plan,
        plan.candidates().chain(plan.preserved()),
        plan.entries.len(),
        position,
        RESOURCE_ROWS_BUDGET,
    );
    let split = candidates
        .saturating_sub(position.offset)
        .min(page.rows.len());
    let mut rows = page.rows;
    let preserved = rows.split_off(split);
    body.insert("candidates".into(), Json::Array(rows));
    body.insert("preserved".into(), Json::Array(preserved));
    body.insert("rows_not_shown".into(), json!(page.remaining));
    if let Some(next) = &page.next {
        let cursor = sealer.seal(next);
        body.insert(
            "next_uri".into(),
            json!(format!("{}?cursor={cursor}", kept.uri())),
        );
        body.insert("next_cursor".into(), json!(cursor));
    }
    Json::Object(body)
}

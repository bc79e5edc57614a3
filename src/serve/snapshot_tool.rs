//! The snapshot tool: the fleet's counts, its instances and blockers, its
//! findings grouped by class with a few of each; any list of findings or
//! workers a page at a time. Each call takes the snapshot afresh (a
//! snapshot is an observation of this moment), so a page is a window on
//! the list as it is when the page is read.

use super::args::{audit_context, SnapshotArgs, SnapshotPage};
use super::cursor::{List, Position};
use super::pages::{DEFAULT_LIMIT, MAX_LIMIT, RESULT_BOUND};
use super::results::{error_result, success, tool_error};
use super::tools::{Call, FleetServer};
use crate::capability::Operation as Op;
use crate::evidence::probe::SystemProbe;
use crate::snapshot::{FindingClass, Options, Snapshot, WorkerList};
use rmcp::model::CallToolResult;
use serde_json::{json, Map, Value as Json};
use std::collections::BTreeMap;

/// Findings of each class shown in the summary.
const PER_CLASS: usize = 5;

/// Bytes of one list in a result.
const LIST_BUDGET: usize = 256 * 1024;

type Refusal = Box<CallToolResult>;

impl FleetServer {
    /// `snapshot_instance_fleet`.
    pub(super) fn snapshot(
        &self,
        a: SnapshotArgs,
        canonical: Option<String>,
        call: &Call,
    ) -> CallToolResult {
        match self.snapshot_steps(a, canonical, call) {
            Ok(r) | Err(r) => *r,
        }
    }

    fn snapshot_steps(
        &self,
        a: SnapshotArgs,
        canonical: Option<String>,
        call: &Call,
    ) -> std::result::Result<Refusal, Refusal> {
        self.capability(Op::Snapshot)?;
        let canonical = self.bound(canonical)?;
        let manifest = a.expected_manifest.as_deref().unwrap_or_default();
        if let Some(i) = crate::snapshot::entry_without_instance_id(manifest) {
            return Err(refuse(
                "invalid_manifest",
                format!("expected_manifest[{i}] needs a string client_instance_id"),
                "fix the manifest",
            ));
        }
        let page = a.page.as_ref().map(|p| self.page_asked(p)).transpose()?;
        let b = &self.binding;
        let rows =
            crate::evidence::registry::load(&b.registry).map_err(|e| Box::new(error_result(&e)))?;
        (call.progress)("read");
        let opts = Options::here(
            &b.proc_root,
            canonical,
            a.expected_revision,
            a.expected_manifest,
        );
        let snap = Snapshot::take(&rows, &opts, &SystemProbe::new(&b.proc_root));
        (call.progress)("measured");
        let audit = audit_context(&a.remote, &a.host, &a.org, &a.repo);
        let (mut body, text) = match page {
            Some(at) => self.page_of(&snap, &at),
            None => summary(&snap),
        };
        body.insert("audit_context".into(), audit);
        let result = Json::Object(body);
        if super::pages::json_size(&result).saturating_add(text.len()) > RESULT_BOUND {
            return Err(refuse(
                "result_too_large",
                format!("the result would be over {RESULT_BOUND} bytes"),
                "ask for fewer rows per page (limit)",
            ));
        }
        Ok(Box::new(success(text, result)))
    }

    /// The position a `page` request names, checked.
    fn page_asked(&self, p: &SnapshotPage) -> std::result::Result<Position, Refusal> {
        if matches!(p.list, List::Preserved | List::Document) {
            return Err(refuse(
                "invalid_page",
                "a snapshot pages findings, workers, live_workers, stale_workers or \
                 historical_workers"
                    .into(),
                "name one of those lists",
            ));
        }
        if let Some(c) = &p.classification {
            if FindingClass::from_code(c).is_none() || p.list != List::Findings {
                return Err(refuse(
                    "invalid_page",
                    format!("{c:?} is not a finding class, or the list is not findings"),
                    "see finding_classes in the summary for the classes present",
                ));
            }
        }
        let limit = p.limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(refuse(
                "invalid_limit",
                format!("limit {limit} is outside 1 to {MAX_LIMIT}"),
                "ask for fewer rows per page and follow next_cursor",
            ));
        }
        let mut at = Position {
            plan: "snapshot".into(),
            list: p.list,
            reason_code: p.classification.clone(),
            offset: 0,
            limit,
        };
        if let Some(cursor) = &p.cursor {
            let opened = self.sealer.open(cursor).ok().filter(|c| {
                c.plan == "snapshot" && c.list == at.list && c.reason_code == at.reason_code
            });
            let Some(opened) = opened else {
                return Err(refuse(
                    "invalid_cursor",
                    "the cursor is not one this server issued for this list".into(),
                    "pass next_cursor exactly as the page before gave it, with the same list \
                     and classification",
                ));
            };
            at.offset = opened.offset;
        }
        Ok(at)
    }

    /// One page of a list, with the cursor of the next.
    fn page_of(&self, snap: &Snapshot, at: &Position) -> (Map<String, Json>, String) {
        let (rows, total) = match worker_list(at.list) {
            Some(list) => {
                let mut rows = Vec::new();
                let mut budget = Budget::new(LIST_BUDGET * 3, at.limit);
                snap.workers_of(list, at.offset, |w| budget.admit(w, &mut rows));
                (rows, snap.worker_count(list))
            }
            None => {
                let wanted = at.reason_code.as_deref();
                let of_class = |f: &crate::snapshot::Finding| {
                    wanted.is_none_or(|c| f.classification.code() == c)
                };
                let total = snap.findings().filter(|f| of_class(f)).count();
                let mut rows = Vec::new();
                let mut budget = Budget::new(LIST_BUDGET * 3, at.limit);
                for f in snap.findings().filter(|f| of_class(f)).skip(at.offset) {
                    if !budget.admit(json!(f.as_ref()), &mut rows) {
                        break;
                    }
                }
                (rows, total)
            }
        };
        let mut body = head(snap);
        let through = at.offset + rows.len();
        let text = format!(
            "{} {} to {} of {total}",
            list_name(at.list),
            at.offset + 1,
            through
        );
        body.insert("page".into(), Json::Array(rows));
        body.insert("page_list".into(), json!(list_name(at.list)));
        body.insert("not_shown".into(), json!(total.saturating_sub(through)));
        if through < total {
            let next = Position {
                offset: through,
                ..at.clone()
            };
            body.insert("next_cursor".into(), json!(self.sealer.seal(&next)));
        }
        (body, text)
    }
}

/// Rows admitted until a page's count or byte budget is reached (the first
/// row always, cut to its identity if alone it is over the budget).
struct Budget {
    left: usize,
    count: usize,
}

impl Budget {
    fn new(bytes: usize, count: usize) -> Budget {
        Budget { left: bytes, count }
    }

    /// Add `row` if it fits; false when the page is full.
    fn admit(&mut self, row: Json, rows: &mut Vec<Json>) -> bool {
        if rows.len() >= self.count {
            return false;
        }
        let size = super::pages::json_size(&row);
        if size > self.left {
            if !rows.is_empty() {
                return false;
            }
            rows.push(json!({"omitted": format!("one entry over {} bytes", self.left)}));
            return false;
        }
        self.left -= size;
        rows.push(row);
        true
    }
}

/// The counts and verdicts every snapshot result carries.
fn head(snap: &Snapshot) -> Map<String, Json> {
    let mut body = Map::new();
    body.insert("snapshot_at".into(), json!(snap.snapshot_at()));
    body.insert("consistency_token".into(), json!(snap.consistency_token()));
    body.insert("live_worker_count".into(), json!(snap.live_worker_count()));
    body.insert(
        "stale_worker_count".into(),
        json!(snap.stale_worker_count()),
    );
    body.insert(
        "historical_worker_count".into(),
        json!(snap.historical_worker_count()),
    );
    body.insert(
        "other_host_worker_count".into(),
        json!(snap.other_host_worker_count()),
    );
    body.insert("instance_count".into(), json!(snap.instance_count()));
    body.insert("live_fleet_safe".into(), json!(snap.live_fleet_safe()));
    body
}

/// The summary: counts, instances, blockers, and the findings by class.
fn summary(snap: &Snapshot) -> (Map<String, Json>, String) {
    let mut body = head(snap);
    let mut instances = Vec::new();
    let mut budget = Budget::new(LIST_BUDGET, usize::MAX);
    for i in snap.instance_entries() {
        if !budget.admit(i, &mut instances) {
            break;
        }
    }
    body.insert(
        "instances_not_shown".into(),
        json!(snap.instance_count().saturating_sub(instances.len())),
    );
    body.insert("instances".into(), Json::Array(instances));
    // The first blockers only: finding_classes counts them all, and a page
    // of a class lists its members (a summary stays a few KiB).
    let mut blockers = Vec::new();
    let mut budget = Budget::new(LIST_BUDGET, super::tools::BLOCKERS_SHOWN);
    let mut blocker_count = 0;
    for b in snap.active_blockers() {
        blocker_count += 1;
        if budget.count > 0 && !budget.admit(json!(b.as_ref()), &mut blockers) {
            budget.count = 0;
        }
    }
    body.insert(
        "active_blockers_not_shown".into(),
        json!(blocker_count - blockers.len()),
    );
    body.insert("active_blockers".into(), Json::Array(blockers));
    body.insert("finding_classes".into(), Json::Object(by_class(snap)));
    let text = format!(
        "fleet at {}: {} live, {} stale, {} historical workers in {} instance(s); live fleet {}; \
         {blocker_count} active blocker(s). Page a class's findings or a list of workers with \
         page {{\"list\", \"classification\", \"limit\"}}.",
        snap.snapshot_at(),
        snap.live_worker_count(),
        snap.stale_worker_count(),
        snap.historical_worker_count(),
        snap.instance_count(),
        if snap.live_fleet_safe() {
            "safe"
        } else {
            "NOT safe"
        },
    );
    (body, text)
}

/// Findings grouped by class: each class's count, severity, whether it
/// blocks, and its first few members.
fn by_class(snap: &Snapshot) -> Map<String, Json> {
    let mut classes: BTreeMap<FindingClass, (usize, Vec<Json>)> = BTreeMap::new();
    let mut budget = Budget::new(LIST_BUDGET, usize::MAX);
    let mut shown = Vec::new();
    for f in snap.findings() {
        let (count, members) = classes.entry(f.classification).or_default();
        *count += 1;
        if members.len() < PER_CLASS && budget.admit(json!(f.as_ref()), &mut shown) {
            members.extend(shown.pop());
        }
    }
    classes
        .into_iter()
        .map(|(class, (count, members))| {
            let entry = json!({
                "count": count,
                "severity": class.severity().as_str(),
                "active_blocker": class.blocks(),
                "members": members,
                "members_not_shown": count - members.len(),
            });
            (class.code().to_string(), entry)
        })
        .collect()
}

fn worker_list(list: List) -> Option<WorkerList> {
    match list {
        List::Workers => Some(WorkerList::All),
        List::LiveWorkers => Some(WorkerList::Live),
        List::StaleWorkers => Some(WorkerList::Stale),
        List::HistoricalWorkers => Some(WorkerList::Historical),
        _ => None,
    }
}

fn list_name(list: List) -> &'static str {
    match list {
        List::Findings => "findings",
        List::Workers => "workers",
        List::LiveWorkers => "live_workers",
        List::StaleWorkers => "stale_workers",
        List::HistoricalWorkers => "historical_workers",
        List::Preserved => "preserved",
        List::Document => "document",
    }
}

fn refuse(code: &str, detail: String, what_to_do: &str) -> Refusal {
    Box::new(tool_error(code, detail, what_to_do, json!({})))
}

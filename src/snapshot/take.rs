//! Taking a snapshot: every row measured, the live ones read as
//! [`LiveWorker`]s for the detectors, and what they found kept typed. The
//! document is written from this by `document`.

use super::detect::{
    instance_findings, live_collisions, manifest_findings, unkeyed_findings, Instance,
    ManifestEntry,
};
use super::findings::{row_finding, Finding, Findings};
use super::live::LiveWorker;
use super::measure::{measure, Measured, Options};
use crate::evidence::probe::ProcessProbe;
use crate::row::{Col, Row};
use crate::time::format_ts;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::collections::BTreeMap;

/// A snapshot: what was measured per row, the live instances, and the
/// findings. Worker entries are rendered only while the document is
/// written, so a large registry costs about what its rows cost.
pub struct Snapshot<'a> {
    pub(super) rows: &'a [Row],
    pub(super) measured: Vec<Measured>,
    pub(super) live_count: usize,
    pub(super) snapshot_at: String,
    pub(super) token: String,
    pub(super) historical_count: usize,
    pub(super) stale_count: usize,
    pub(super) other_host_count: usize,
    pub(super) instances: Vec<Instance>,
    pub(super) by_type: BTreeMap<String, Vec<String>>,
    pub(super) manifest: Vec<ManifestEntry>,
    pub(super) missing: Vec<String>,
    pub(super) unmanifested: Vec<String>,
    /// Findings about live workers (before the per-row ones).
    pub(super) early: Vec<Finding>,
    /// Findings about the manifest (after the per-row ones).
    pub(super) late: Vec<Finding>,
    pub(super) live_safe: bool,
    pub(super) mutation_safe: bool,
    /// Continuity with an earlier snapshot, when asked (`--compare`).
    pub comparison: Option<Json>,
}

/// Where a list of findings comes from, in document order: the stored
/// findings about live workers, the per-row findings (derived as they are
/// written), then the manifest's.
pub(super) enum FindingPart<'s> {
    Stored(&'s [Finding]),
    Rows(fn(&Measured) -> bool),
}

impl<'a> Snapshot<'a> {
    /// Take the snapshot of `rows`.
    pub fn take(rows: &'a [Row], opts: &Options, probe: &dyn ProcessProbe) -> Snapshot<'a> {
        take(rows, opts, probe)
    }

    /// When it was taken.
    pub fn snapshot_at(&self) -> &str {
        &self.snapshot_at
    }

    /// Live workers.
    pub fn live_worker_count(&self) -> usize {
        self.live_count
    }

    /// Active rows that are not live.
    pub fn stale_worker_count(&self) -> usize {
        self.stale_count
    }

    /// Rows whose status is not active.
    pub fn historical_worker_count(&self) -> usize {
        self.historical_count
    }

    /// Rows registered on another host than this one (0 when the snapshot
    /// was not told this host's id).
    pub fn other_host_worker_count(&self) -> usize {
        self.other_host_count
    }

    /// Live instances.
    pub fn instance_count(&self) -> usize {
        self.instances.len()
    }

    /// No active blocker.
    pub fn live_fleet_safe(&self) -> bool {
        self.live_safe
    }

    /// The findings that make the live fleet unsafe.
    pub fn active_blockers(&self) -> impl Iterator<Item = Cow<'_, Finding>> {
        self.findings().filter(|f| f.classification.blocks())
    }

    /// Every finding, in the order found: those about live workers, one per
    /// stale row, one per historical row, then the manifest's.
    pub fn findings(&self) -> impl Iterator<Item = Cow<'_, Finding>> {
        self.finding_parts().into_iter().flat_map(
            move |part| -> Box<dyn Iterator<Item = Cow<'_, Finding>> + '_> {
                match part {
                    FindingPart::Stored(found) => Box::new(found.iter().map(Cow::Borrowed)),
                    FindingPart::Rows(which) => Box::new(
                        self.rows
                            .iter()
                            .zip(&self.measured)
                            .filter(move |(_, m)| which(m))
                            .filter_map(|(r, m)| row_finding(r, m))
                            .map(Cow::Owned),
                    ),
                }
            },
        )
    }

    /// The positions (in the rows the snapshot was taken of) of the rows
    /// that are active and not live: one `stale_orphaned_worker` each.
    pub fn stale_rows(&self) -> impl Iterator<Item = usize> + '_ {
        self.measured
            .iter()
            .enumerate()
            .filter(|(_, m)| m.stale())
            .map(|(at, _)| at)
    }

    /// The blockers about the live fleet and the manifest: every one but
    /// the stale rows'.
    pub fn fleet_blockers(&self) -> impl Iterator<Item = &Finding> {
        self.early
            .iter()
            .chain(&self.late)
            .filter(|f| f.classification.blocks())
    }

    /// The consistency token (time-seeded: an observation stamp).
    pub fn consistency_token(&self) -> &str {
        &self.token
    }

    /// The parts the findings come from, in document order.
    pub(super) fn finding_parts(&self) -> [FindingPart<'_>; 4] {
        [
            FindingPart::Stored(&self.early),
            FindingPart::Rows(Measured::stale),
            FindingPart::Rows(|m| m.historical),
            FindingPart::Stored(&self.late),
        ]
    }
}

/// What the detectors found: the findings about live workers, the live
/// instances, and the manifest's findings and lists.
struct Found {
    early: Vec<Finding>,
    late: Vec<Finding>,
    instances: Vec<Instance>,
    manifest: Vec<ManifestEntry>,
    missing: Vec<String>,
    unmanifested: Vec<String>,
}

/// Run every detector over the live workers, then check the manifest.
fn detect(live: &[LiveWorker], opts: &Options) -> Found {
    let live: Vec<&LiveWorker> = live.iter().collect();
    let mut f = Findings(Vec::new());
    live_collisions(&live, &mut f);
    let mut by_instance: BTreeMap<String, Vec<&LiveWorker>> = BTreeMap::new();
    let mut unkeyed: Vec<&LiveWorker> = Vec::new();
    for w in &live {
        match w.instance() {
            Some(iid) => by_instance.entry(iid).or_default().push(w),
            None => unkeyed.push(w),
        }
    }
    let instances = instance_findings(&by_instance, &mut f);
    unkeyed_findings(&unkeyed, &mut f);
    // Stale and historical rows each have a finding of their own, derived
    // when read (see `row_finding`); the manifest's findings follow them.
    let early = std::mem::take(&mut f.0);
    let manifest: Vec<ManifestEntry> = opts
        .manifest
        .iter()
        .flatten()
        .map(ManifestEntry::read)
        .collect();
    let (missing, unmanifested) = manifest_findings(&manifest, &by_instance, &mut f);
    Found {
        early,
        late: f.0,
        instances,
        manifest,
        missing,
        unmanifested,
    }
}

/// Instance ids by client type, for the types more than one instance runs.
fn by_client_type(instances: &[Instance]) -> BTreeMap<String, Vec<String>> {
    let mut by_type: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for inst in instances {
        for ct in &inst.client_types {
            by_type
                .entry(ct.clone())
                .or_default()
                .push(inst.client_instance_id.clone());
        }
    }
    by_type.retain(|_, v| v.len() > 1);
    by_type
}

fn take<'a>(rows: &'a [Row], opts: &Options, probe: &dyn ProcessProbe) -> Snapshot<'a> {
    let started = std::time::Instant::now();
    let snapshot_at = format_ts(opts.now);
    let measured: Vec<Measured> = crate::pool::par_map(rows, |r| measure(r, opts, probe));
    tracing::debug!(elapsed = ?started.elapsed(), rows = rows.len(), "measured");
    let live: Vec<LiveWorker> = rows
        .iter()
        .zip(&measured)
        .enumerate()
        .filter(|(_, (_, m))| m.live)
        .map(|(i, (r, m))| LiveWorker::of(i, r, m))
        .collect();
    let found = detect(&live, opts);
    tracing::debug!(elapsed = ?started.elapsed(), "found");
    let stale_count = measured.iter().filter(|m| m.stale()).count();
    let live_safe = stale_count == 0
        && !found
            .early
            .iter()
            .chain(&found.late)
            .any(|x| x.classification.blocks());
    let mutation_safe = live_safe && found.instances.iter().all(|i| i.mutation_safe);
    let token = consistency_token(rows, &measured, &snapshot_at);
    tracing::debug!(elapsed = ?started.elapsed(), "consistency token");
    Snapshot {
        rows,
        live_count: live.len(),
        historical_count: measured.iter().filter(|m| m.historical).count(),
        stale_count,
        other_host_count: measured.iter().filter(|m| m.other_host).count(),
        measured,
        snapshot_at,
        token,
        by_type: by_client_type(&found.instances),
        instances: found.instances,
        manifest: found.manifest,
        missing: found.missing,
        unmanifested: found.unmanifested,
        early: found.early,
        late: found.late,
        live_safe,
        mutation_safe,
        comparison: None,
    }
}

/// The consistency token: time-seeded, an observation stamp (never a CAS
/// token). Computed over the snapshot's worker rows, as the seed does (so
/// the instance id is the assessed, whitespace-stripped one).
fn consistency_token(rows: &[Row], measured: &[Measured], snapshot_at: &str) -> String {
    // Python's `str(value or "")` of each field of a worker entry, borrowed
    // wherever the stored value is text (nearly always): a large registry
    // is sorted and hashed without a copy of its rows.
    fn fields<'r>(row: &'r Row, m: &'r Measured) -> [Cow<'r, str>; 6] {
        let instance = match &m.identity.client_instance_id {
            Some(id) => Cow::Borrowed(id.as_str()),
            None => row.get(Col::ClientInstanceId).or_empty_cow(),
        };
        [
            row.get(Col::WorkerIdentity).or_empty_cow(),
            instance,
            row.get(Col::Status).or_empty_cow(),
            row.get(Col::LastHeartbeatAt).or_empty_cow(),
            row.get(Col::FencingEpoch).or_empty_cow(),
            row.get(Col::GenerationId).or_empty_cow(),
        ]
    }
    // Each row's line (`|`-joined fields) is written once, in row order,
    // into one buffer; the sort then moves only small entries, and hashing
    // in sorted order reads one slice per row.
    let mut text: Vec<u8> = Vec::new();
    let mut spans: Vec<(usize, usize)> = Vec::with_capacity(rows.len());
    let mut keys: Vec<[Cow<'_, str>; 3]> = Vec::with_capacity(rows.len());
    for (r, m) in rows.iter().zip(measured) {
        let u = fields(r, m);
        let start = text.len();
        for (i, field) in u.iter().enumerate() {
            if i > 0 {
                text.push(b'|');
            }
            text.extend_from_slice(field.as_bytes());
        }
        spans.push((start, text.len()));
        let [wid, _, _, hb, epoch, _] = u;
        keys.push([wid, hb, epoch]);
    }
    // Sorted stably by (identity, heartbeat, epoch), as the seed's `sorted`.
    // The identity's first 32 bytes sit in the array being sorted, so most
    // comparisons never leave it; a tie there compares the whole key.
    let prefix = |k: &[Cow<'_, str>; 3]| {
        let mut p = [0u8; 32];
        let b = k[0].as_bytes();
        let n = b.len().min(32);
        p[..n].copy_from_slice(&b[..n]);
        p
    };
    let mut order: Vec<([u8; 32], u32)> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (prefix(k), i as u32))
        .collect();
    order.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then_with(|| keys[a.1 as usize].cmp(&keys[b.1 as usize]))
    });
    let mut hasher = Sha256::new();
    hasher.update(snapshot_at.as_bytes());
    for (_, i) in &order {
        let (start, end) = spans[*i as usize];
        hasher.update(b"\n");
        hasher.update(&text[start..end]);
    }
    let digest = crate::fingerprint::hex(&hasher.finalize());
    format!("fleetrev-{}", &digest[..16])
}

"""Snapshot fixtures whose expectations are the reference's: the seed's own
snapshot_instance_fleet (imported from SEED_DIR, never copied here), with
our deliberate session rule (a session shared by live workers
is a collision only across instances or within one namespace) applied to
its output.

    snapshot_fixtures.py SEED_DIR OUT_DIR random RANDOM_SEED COUNT
    snapshot_fixtures.py SEED_DIR OUT_DIR named

`random` writes COUNT random registries (edge values included: NULL and
empty identities, the text "None", padded instance ids); `named` writes the
cases that cover every finding class, which live in fixtures/snapshot/.
"""
import json
import os
import random
import sys
from collections import defaultdict
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, sys.argv[1])
import mcp_fleet_snapshot as f  # noqa: E402

OUT = sys.argv[2]
NOW = "2026-07-30T12:00:00Z"
NOW_DT = datetime(2026, 7, 30, 12, 0, 0, tzinfo=timezone.utc)
INST = "inst-codex-20260730T100000Z-abc123def456"
INST2 = "inst-codex-20260730T110000Z-0123456789ab"


def session_rule(live):
    """Our session collisions over the reference's live workers."""
    groups = defaultdict(list)
    for w in live:
        k = w.get("session_id")
        if k is None or k == "" or k == "None":
            continue
        groups[str(k)].append(w)
    out = []
    for sid, g in groups.items():
        if len(g) < 2:
            continue
        inst = {str(w.get("client_instance_id")) for w in g if w.get("client_instance_id")}
        unkeyed = any(not w.get("client_instance_id") for w in g)
        by = defaultdict(list)
        for w in g:
            by[str(w.get("client_instance_id") or "")].append(w)

        def dup(ws):
            c = defaultdict(int)
            for w in ws:
                if w.get("namespace"):
                    c[str(w.get("namespace"))] += 1
            return any(n > 1 for n in c.values())

        if len(inst) > 1 or unkeyed or any(dup(ws) for ws in by.values()):
            out.append({
                "classification": "session_identity_collision",
                "active_blocker": True,
                "worker_identities": [w.get("worker_identity") for w in g],
                "client_instance_ids": sorted(inst),
            })
    return out


def case(name, rows, processes, manifest=None, revision=None, canonical="prgs/gitea-tools"):
    def probe(p):
        if isinstance(p, bool) or not isinstance(p, int) or p <= 0:
            return None
        entry = processes.get(str(p))
        return False if entry is None else entry["alive"]

    snap = f.snapshot_instance_fleet(
        rows, expected_manifest=manifest, now=NOW_DT, pid_alive_probe=probe,
        canonical_repository=canonical, expected_live_revision=revision)
    findings = [x for x in snap["findings"] if x["classification"] != "session_identity_collision"]
    findings += session_rule(snap["live_workers"])
    blockers = [x for x in findings if x["active_blocker"]]
    return {
        "name": name,
        "now": NOW,
        "context": {"host_id": None, "boot_id": None, "canonical_repository": canonical},
        "processes": processes,
        "rows": rows,
        "snapshot": {
            "manifest": manifest,
            "expected_revision": revision,
            "expect": {
                "live_fleet_safe": not blockers,
                "counts": {
                    "live": snap["live_worker_count"],
                    "stale": snap["stale_worker_count"],
                    "historical": snap["historical_worker_count"],
                    "instances": snap["instance_count"],
                },
                "findings": [
                    {"classification": x["classification"],
                     "worker_identities": x["worker_identities"],
                     "client_instance_ids": x["client_instance_ids"]}
                    for x in findings
                ],
                "active_blockers": sorted(x["classification"] for x in blockers),
                "consistency_token": snap["consistency_token"],
            },
        },
    }


def write(doc, file):
    with open(os.path.join(OUT, file), "w") as out:
        json.dump(doc, out, indent=1, ensure_ascii=False)
        out.write("\n")


def random_cases(seed, count):
    random.seed(seed)

    def pick(*xs):
        return random.choice(xs)

    for c in range(count):
        rows = []
        for i in range(random.randint(1, 8)):
            rows.append({
                "worker_identity": pick(f"w{i}", f"w{i}", f"w{i}", "w0", None, ""),
                "client_name": pick("codex", "codex", "gemini", "vim", None),
                "client_instance_id": pick("inst-a", "inst-a", "inst-b", "legacy-1", "", None, " inst-a", "None", "inst-a\x1f"),
                "instance_id_source": pick("launcher", None, "pid_fallback"),
                "session_id": pick(f"s{i}", "sA", "sA", None, "", "s-None"),
                "generation_id": pick(f"g{i}", "gA", None, "g-None"),
                "namespace": pick("author", "reviewer", "merger", "author", None, "None"),
                "repository_binding": pick("o/r", "o/r", "x/y", None),
                "pid": pick(100 + i, 100 + i, 101, None, "102"),
                "process_identity": pick(None, None, "p1"),
                "fencing_epoch": pick(1, 2, None),
                "fleet_run_id": pick(None, None, "run-1", "None"),
                "last_heartbeat_at": pick("2026-07-30T11:59:00Z", "2026-07-30T11:59:00Z", "2026-07-30T10:00:00Z", "bad"),
                "heartbeat_ttl_seconds": 900,
                "status": pick("active", "active", "active", "released", "retired"),
                "loaded_revision": pick("r1", "r1", "r0", None),
            })
        processes = {}
        for i in range(8):
            alive = pick(True, True, False, None)
            if alive is not False:
                processes[str(100 + i)] = {"alive": alive}
        manifest = pick(None, [{"client_instance_id": "inst-a"}],
                        [{"client_instance_id": "inst-a\x1f"}, {"client_instance_id": "inst-c"}])
        write(case(f"differential snapshot {seed}-{c}", rows, processes, manifest,
                   pick("r1", "r1", "", None), pick("o/r", "o/r", None)),
              f"snapshot-{seed}-{c:05d}.json")


def live(identity, pid, **over):
    """A live, trusted codex worker of INST."""
    row = {
        "worker_identity": identity, "client_name": "codex", "client_instance_id": INST,
        "instance_id_source": "launcher", "session_id": f"s-{pid}", "generation_id": f"g-{pid}",
        "namespace": "author", "pid": pid, "started_at": "2026-07-30T11:00:00Z",
        "last_heartbeat_at": "2026-07-30T11:59:00Z", "heartbeat_ttl_seconds": 900,
        "fencing_epoch": 1, "status": "active", "repository_binding": "prgs/gitea-tools",
        "live_revision": "r1",
    }
    row.update(over)
    return row


def alive(*pids):
    return {str(p): {"alive": True} for p in pids}


def named():
    ns = ["author", "reviewer", "merger", "controller", "reconciler"]
    cases = [
        ("healthy", "a healthy launch: five namespaces of one instance share one session (our session rule: safe)",
         [live(f"w-{n}", 4000 + i, namespace=n, session_id="s-launch") for i, n in enumerate(ns)],
         alive(*range(4000, 4005)), {}),
        ("session-across-instances", "session_identity_collision: one session shared by live workers of two instances",
         [live("w-1", 4000, session_id="s-x"), live("w-2", 4001, session_id="s-x", client_instance_id=INST2, namespace="reviewer")],
         alive(4000, 4001), {}),
        ("missing-expected", "missing_expected: the manifest names an instance that is not live",
         [live("w-1", 4000)], alive(4000), {"manifest": [{"client_instance_id": INST}, {"client_instance_id": INST2}]}),
        ("unmanifested", "unmanifested: a live instance is not on the manifest",
         [live("w-1", 4000), live("w-2", 4001, client_instance_id=INST2)], alive(4000, 4001),
         {"manifest": [{"client_instance_id": INST}]}),
        ("duplicate-namespace", "duplicate_namespace_worker: two live author workers in one instance",
         [live("w-1", 4000), live("w-2", 4001)], alive(4000, 4001), {}),
        ("instance-id-collision", "instance_id_collision: one instance id live under two client types",
         [live("w-1", 4000), live("w-2", 4001, client_name="gemini", namespace="reviewer")], alive(4000, 4001), {}),
        ("worker-identity-collision", "worker_identity_collision: one identity on two live rows",
         [live("w-1", 4000), live("w-1", 4001, namespace="reviewer")], alive(4000, 4001), {}),
        ("generation-collision", "generation_identity_collision: one generation across two instances",
         [live("w-1", 4000, generation_id="g-x"), live("w-2", 4001, generation_id="g-x", client_instance_id=INST2)],
         alive(4000, 4001), {}),
        ("process-and-pid-collision", "process_identity_collision and pid_collision: two live workers on one pid",
         [live("w-1", 4000), live("w-2", 4000, namespace="reviewer")], alive(4000), {}),
        ("ownership-fencing-collision", "ownership_fencing_collision: one generation and epoch across two instances",
         [live("w-1", 4000, generation_id="g-y", fencing_epoch=3), live("w-2", 4001, generation_id="g-y", fencing_epoch=3, client_instance_id=INST2, namespace="reviewer")],
         alive(4000, 4001), {}),
        ("orphaned", "orphaned_unowned: a live worker without a session",
         [live("w-1", 4000, session_id=None)], alive(4000), {}),
        ("unknown-client", "unknown_client: a live worker of an unknown client type",
         [live("w-1", 4000, client_name="vim")], alive(4000), {}),
        ("foreign-repository", "foreign_repository: a live worker bound to another repository",
         [live("w-1", 4000, repository_binding="other/repo")], alive(4000), {}),
        ("old-revision", "old_revision: a live worker on another revision than expected",
         [live("w-1", 4000, live_revision="r0")], alive(4000), {"revision": "r1"}),
        ("stale", "stale_orphaned_worker: an active row whose pid is gone",
         [live("w-1", 4000)], {}, {}),
        ("legacy-incomplete", "legacy_incomplete_identity: a live worker without a launcher-minted instance id, and one without any",
         [live("w-1", 4000, client_instance_id="legacy-1", instance_id_source=None), live("w-2", 4001, client_instance_id=None, namespace="reviewer")],
         alive(4000, 4001), {}),
        ("historical", "historical_dead: released and retired rows are reported, never blockers",
         [live("w-1", 4000, status="released"), live("w-2", 4001, status="retired", namespace="reviewer")], {}, {}),
        # The five divergences once found against the reference.
        ("divergence-1-null-identity-shares-pid", "a NULL and an empty identity sharing a pid with a live worker are pid and process collisions",
         [live(None, 4242), live("w-real", 4242, namespace="reviewer"), live("", 4243, namespace="merger"), live("w-other", 4243, namespace="controller")],
         alive(4242, 4243), {}),
        ("divergence-2-namespace-none", "a namespace stored as the text None, duplicated in one instance, is a duplicate namespace (and its generation and session collide)",
         [live("w-1", 4000, namespace="None", generation_id="g-None", session_id="s-None"),
          live("w-2", 4001, namespace="None", generation_id="g-None", session_id="s-None")],
         alive(4000, 4001), {}),
        ("divergence-3-empty-expected-revision", "an empty expected revision is no expectation",
         [live("w-1", 4000, live_revision="r9")], alive(4000), {"revision": ""}),
        ("divergence-4-manifest-unit-separator", "a manifest instance id ending in U+001F is stripped as Python strips",
         [live("w-1", 4000)], alive(4000), {"manifest": [{"client_instance_id": INST + "\x1f"}]}),
        ("divergence-5-null-and-empty-instance", "NULL and empty instance ids with one generation and epoch are two instances",
         [live("w-1", 4000, client_instance_id=None, generation_id="g-1", fencing_epoch=7),
          live("w-2", 4001, client_instance_id="", generation_id="g-1", fencing_epoch=7, namespace="reviewer")],
         alive(4000, 4001), {}),
    ]
    for file, name, rows, processes, extra in cases:
        write(case(name, rows, processes, extra.get("manifest"), extra.get("revision")), f"{file}.json")


if sys.argv[3] == "random":
    random_cases(int(sys.argv[4]), int(sys.argv[5]))
else:
    named()

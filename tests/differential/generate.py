"""Differential fixtures: random registries judged by the seed's own planner.

Usage: generate.py SEED_DIR OUT_DIR RANDOM_SEED COUNT

SEED_DIR holds the seed's mcp_fleet_retirement.py and mcp_fleet_snapshot.py
(../shared/seed); they are imported from there, never copied into this
repository. mcp_worker_identity.py beside this script is our reading of
docs/semantics.md sections 1-3 for the module the seed imports but does not ship.
Each case becomes a fixture whose expectations come from the seed, which
`fleet-retire test` then checks.
"""
import json, os, random, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, sys.argv[1])
import mcp_fleet_retirement as r
random.seed(int(sys.argv[3])); out = sys.argv[2]; n = int(sys.argv[4])
os.makedirs(out, exist_ok=True)
def pick(*xs): return random.choice(xs)
for case in range(n):
    now_s = "2026-07-30T12:00:00Z"
    host = pick("h1", "h1", "h1", None, "", "h2 ")
    boot = pick("b1", "b1", "b1", None, "")
    canon = pick("o/r", "o/r", None, "", "o/r/", " o/r")
    pids = [4000 + i for i in range(6)]
    processes = {}
    for p in pids:
        k = random.random()
        if k < 0.3: processes[str(p)] = {"alive": True, "start_time": pick("ticks-1", "ticks-2", "", None)}
        elif k < 0.4: processes[str(p)] = {"alive": None}
        elif k < 0.5: processes[str(p)] = {"alive": False}
    rows = []
    nrows = random.randint(1, 7)
    for i in range(nrows):
        row = {
            "worker_identity": pick(f"w-{i}", f"w-{i}", f"w-{i}", "w-0", " w-0", None, ""),
            "client_name": pick("codex", "Claude-Code", "vim", None),
            "client_instance_id": pick("inst-codex-x", "inst-codex-x", "inst-codex-y", " inst-codex-x", "legacy-pid-1", "inst-", "", None, "INST-a"),
            "instance_id_source": pick("launcher", "env", None, "pid_fallback"),
            "session_id": pick("s1", "s2", f"s-{i}", f"s-{i}", None, " "),
            "generation_id": pick("g1", f"g-{i}", f"g-{i}", None),
            "namespace": pick("author", "reviewer", "author", None),
            "repository_binding": pick("o/r", "o/r", "o/r/", " o/r ", "x/y", None, ""),
            "pid": pick(*pids, *pids, "4001", 4001.0, -1, 0, None, True),
            "process_identity": pick(None, None, "", "p-1", "pid-4001"),
            "started_at": pick("2026-07-30T10:00:00Z", None, "bad"),
            "last_heartbeat_at": pick("2026-07-30T11:00:00Z", "2026-07-30T11:59:00Z", "2026-07-30T11:45:00Z",
                                      "2026-07-30T13:45:00+02:00", "2026-07-31T00:00:00Z", "2026-07-30 11:00:00Z", None, 5),
            "heartbeat_ttl_seconds": pick(900, 900.0, "900", 60, "60", "abc", 0, -5, 3600, " 60", True, "1e3", None),
            "fencing_epoch": pick(1, 1.0, "1", None),
            "status": pick("active", "active", "active", "released", "retired", None, "Active"),
            "host_id": pick("h1", "h1", "h1 ", "h2", None, ""),
            "boot_id": pick("b1", "b1", "b0", " b1", None, ""),
            "process_start_time": pick("ticks-1", "ticks-1", "ticks-2", " ticks-1", None, ""),
        }
        rows.append(row)
    leases = []
    for j in range(random.randint(0, 2)):
        leases.append({"lease_id": f"l-{j}", "status": pick("active", "active", "released", "Active"),
                       "session_id": pick(None, "s1", "s-0"), "owner_session_id": pick(None, "s2"),
                       "owner_pid": pick(None, 4001, "4002", 4003.0), "session_pid": pick(None, 4004),
                       "owner_worker_identity": pick(None, "w-1", "w-0", ""), "role": "x", "target": "t", "generation": None})
    def alive(pid):
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0: return None
        return processes.get(str(pid), {"alive": False}).get("alive")
    def start(pid):
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0: return None
        return processes.get(str(pid), {}).get("start_time")
    active = [l for l in leases if l.get("status") == "active"]
    from datetime import datetime, timezone
    plan = r.plan_stale_worker_retirement(rows, now=datetime(2026,7,30,12,0,0,tzinfo=timezone.utc),
        pid_alive_probe=alive, canonical_repository=canon,
        protected_worker_identities=[l.get("owner_worker_identity") for l in active],
        protected_session_ids=[x for l in active for x in (l.get("session_id"), l.get("owner_session_id"))],
        protected_pids=[x for l in active for x in (l.get("owner_pid"), l.get("session_pid"))],
        current_host_id=host, current_boot_id=boot, start_time_probe=start)
    canon_id = lambda v: r._canon(v)
    preserved = {}
    for p in plan["preserved"]:
        preserved[canon_id(p["worker_identity"])] = p["reason_code"]
    doc = {"name": f"diff-{sys.argv[1]}-{case}", "now": now_s,
           "context": {"host_id": host, "boot_id": boot, "canonical_repository": canon},
           "processes": processes, "rows": rows, "leases": leases,
           "expect": {"registry_fingerprint": plan["registry_fingerprint"], "candidate_fingerprint": plan["candidate_fingerprint"],
                      "candidates": [canon_id(c["worker_identity"]) for c in plan["candidates"]], "preserved": preserved}}
    json.dump(doc, open(f"{out}/case-{case:04d}.json", "w"))

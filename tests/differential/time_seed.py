"""Time the seed's own planner on a registry, end to end, for comparison.

Usage: time_seed.py SEED_DIR REGISTRY LEASES CANONICAL_REPOSITORY

Reads every registration and the active leases from the SQLite files, plans
with the seed's plan_stale_worker_retirement (real kill(pid, 0) and /proc
start-time probes, this host's ids as fleet-retire reads them), renders the plan as JSON, and prints
one line: `seconds=S rows=N candidates=C`. The seed is imported from
SEED_DIR (../shared/seed), never copied; mcp_worker_identity.py beside
this script is our reading of the module the seed imports but does not ship.
The time covers what `fleet-retire plan --format json` does: read, probe,
plan, render (Python's start and imports are left out).
"""
import json, os, sqlite3, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, sys.argv[1])
import mcp_fleet_retirement as r  # noqa: E402


def alive(pid):
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:
        return None


def start_time(pid):
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None


def read_first_line(path):
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


def main():
    registry, leases, canonical = sys.argv[2], sys.argv[3], sys.argv[4]
    started = time.perf_counter()
    conn = sqlite3.connect(f"file:{registry}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    rows = [dict(row) for row in conn.execute("SELECT * FROM worker_registrations ORDER BY rowid")]
    lconn = sqlite3.connect(f"file:{leases}?mode=ro", uri=True)
    lconn.row_factory = sqlite3.Row
    active = [dict(l) for l in lconn.execute("SELECT * FROM workflow_leases") if l["status"] == "active"]
    plan = r.plan_stale_worker_retirement(
        rows,
        pid_alive_probe=alive,
        canonical_repository=canonical,
        protected_worker_identities=[l.get("owner_worker_identity") for l in active],
        protected_session_ids=[x for l in active for x in (l.get("session_id"), l.get("owner_session_id"))],
        protected_pids=[x for l in active for x in (l.get("owner_pid"), l.get("session_pid"))],
        current_host_id=os.uname().nodename.strip() or None,
        current_boot_id=read_first_line("/proc/sys/kernel/random/boot_id"),
        start_time_probe=start_time,
    )
    with open(os.devnull, "w") as sink:
        json.dump(plan, sink, default=str)
    elapsed = time.perf_counter() - started
    print(f"seconds={elapsed:.3f} rows={len(rows)} candidates={len(plan['candidates'])}")


main()

#!/usr/bin/env python3
"""A client that starts a server for every call, through the official
Python MCP SDK (as the MCP Inspector's command line does).

`tests/serve_agents.rs` runs this and `per_call.mjs` (the official
TypeScript SDK). Each call below is made by a new `fleet-retire serve`,
started for it and closed after it; no server sees another's call. The
servers share only the registry and the folder of kept plans
(FLEET_RETIRE_PLAN_DIR). Each prints one `ok:` line per check and
`all checks passed` at the end.

    python3 per_call.py EXE DIR

 1. plan the whole registry (`scope: "registry"`: a host-scoped plan,
    the default, is moved by the next server's own registration): the
    summary and its tokens;
 2. every preserved reason paged to the end by offset (no cursor: only the
    server that sealed one opens it), each page a fresh plan, the pages
    disjoint, the last one without next_offset;
 3. apply the first 5 candidates with the first call's tokens: applied, the
    servers' own registrations since reported, refusing nothing;
 4. apply the next 5 with the same tokens: the first batch recognised as
    retired since the plan, 5 more retired;
 5. the registry holds exactly those 10 retired, each with its audit row.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

EXE, DIR = sys.argv[1], sys.argv[2]
REGISTRY = os.path.join(DIR, "registry.sqlite")
CALLS = 0


def ok(what: str) -> None:
    print(f"ok: {what}", flush=True)


async def call(tool: str, args: dict) -> tuple[bool, dict]:
    """One call, by a server of its own."""
    global CALLS
    CALLS += 1
    env = {
        "PATH": os.environ.get("PATH", ""),
        "FLEET_RETIRE_REGISTRY": REGISTRY,
        "FLEET_RETIRE_LEASES": os.path.join(DIR, "leases.sqlite"),
        "GITEA_MCP_CONFIG": os.path.join(DIR, "profiles.json"),
        "GITEA_MCP_PROFILE": "controller-prgs",
        "GITEA_MCP_NAMESPACE": "controller",
        "GITEA_MCP_WORKER_IDENTITY": f"per-call-server-py-{CALLS}",
        "FLEET_RETIRE_CANONICAL_REPOSITORY": "prgs/gitea-tools",
        "FLEET_RETIRE_PLAN_DIR": os.path.join(DIR, "plans"),
    }
    params = StdioServerParameters(command=EXE, args=["serve"], env=env)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            result = await session.call_tool(tool, args)
            return bool(result.is_error), result.structured_content or {}


async def page_by_offset(plan: dict) -> int:
    pages = 0
    for code in plan["preserved_reason_counts"]:
        seen: set[str] = set()
        offset = 0
        while True:
            ask = {"reason_code": code, "limit": 1000, "offset": offset}
            is_error, page = await call("plan_stale_worker_retirement", {"preserved": ask, "scope": "registry"})
            assert not is_error, page
            pages += 1
            rows = page["preserved"]
            assert all(r["reason_code"] == code for r in rows), code
            names = {repr(r["worker_identity"]) for r in rows}
            assert not names & seen, (code, offset)
            seen |= names
            total = page["preserved_reason_counts"].get(code, 0)
            assert offset + len(rows) + page["preserved_not_shown"] == total, page.keys()
            if "next_offset" not in page:
                assert "next_cursor" not in page
                break
            assert page["next_offset"] == offset + len(rows)
            offset = page["next_offset"]
    return pages


def counts() -> tuple[int, int]:
    db = sqlite3.connect(REGISTRY)
    retired = db.execute(
        "SELECT count(*) FROM worker_registrations WHERE status = 'retired'"
    ).fetchone()[0]
    audit = db.execute(
        "SELECT count(*) FROM sqlite_master WHERE name = 'retirement_audit'"
    ).fetchone()[0]
    audited = audit and db.execute("SELECT count(*) FROM retirement_audit").fetchone()[0]
    return retired, audited


async def main() -> None:
    retired_before, audited_before = counts()
    is_error, plan = await call("plan_stale_worker_retirement", {"scope": "registry"})
    assert not is_error, plan
    assert plan["scope"] == {"kind": "registry"}, plan["scope"]
    assert plan["candidate_count"] >= 10, plan["candidate_count"]
    ok(f"plan: {plan['assessed_count']} rows, {plan['candidate_count']} candidates")
    pages = await page_by_offset(plan)
    ok(f"preserved rows paged to the end by offset: {pages} pages, one server each")
    tokens = {
        k: plan[k] for k in ("registry_fingerprint", "candidate_fingerprint", "policy_fingerprint")
    }
    is_error, first = await call("apply_stale_worker_retirement", {**tokens, "first": 5})
    assert not is_error and first["outcome"] == "applied", first
    assert first["retired_count"] == 5, first
    assert first["first"] == 5 and len(first["requested"]) == 5, first
    beside = len(first["rows_changed_since_plan"]) + first.get("rows_changed_since_plan_not_shown", 0)
    assert beside >= CALLS - 1, first["rows_changed_since_plan"]
    assert all(w.startswith("per-call-server-py-") for w in first["rows_changed_since_plan"]), first
    ok(f"apply of the first 5 by a new server: applied, {beside} servers' rows beside")
    is_error, second = await call("apply_stale_worker_retirement", {**tokens, "first": 5})
    assert not is_error and second["outcome"] == "applied", second
    assert second["retired_count"] == 5, second
    done = {r["worker_identity"] for r in first["retired"]}
    assert sorted(second["retired_since_plan"]) == sorted(done), second
    assert not done & {r["worker_identity"] for r in second["retired"]}
    ok("the next 5 by another: the first batch recognised, 5 more retired")
    retired, audited = counts()
    assert (retired - retired_before, audited - audited_before) == (10, 10), (retired, audited)
    ok("the registry holds exactly those 10 retired, each audited")
    print("all checks passed", flush=True)


asyncio.run(main())

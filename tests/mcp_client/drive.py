#!/usr/bin/env python3
"""Drive `fleet-retire serve` with the official Python MCP SDK's stdio client,
a client this project did not write. `tests/serve.rs` prepares the stores and
runs this script; it prints one `ok:` line per check and exits non-zero on the
first failure.

    python3 drive.py EXE DIR

DIR holds registry.sqlite (three dead, eligible workers w-dead-1..3 and a
running one), leases.sqlite and profiles.json (controller-prgs and
author-prgs both hold the retire permission).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
import time
from contextlib import AsyncExitStack

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

EXE, DIR = sys.argv[1], sys.argv[2]
REGISTRY = os.path.join(DIR, "registry.sqlite")
LEASES = os.path.join(DIR, "leases.sqlite")
PROFILES = os.path.join(DIR, "profiles.json")
CANON = "prgs/gitea-tools"


def ok(what: str) -> None:
    print(f"ok: {what}", flush=True)


def rows(sql: str, *args):
    with sqlite3.connect(REGISTRY) as c:
        return c.execute(sql, args).fetchall()


def server(profile: str, namespace: str, extra: dict | None = None) -> StdioServerParameters:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "FLEET_RETIRE_REGISTRY": REGISTRY,
        "FLEET_RETIRE_LEASES": LEASES,
        "GITEA_MCP_CONFIG": PROFILES,
        "GITEA_MCP_PROFILE": profile,
        "GITEA_MCP_NAMESPACE": namespace,
        "FLEET_RETIRE_CANONICAL_REPOSITORY": CANON,
        "GITEA_MCP_CLIENT_SESSION": f"sess-{profile}-{namespace}",
    }
    env.update(extra or {})
    return StdioServerParameters(command=EXE, args=["serve"], env=env)


async def open_session(stack: AsyncExitStack, params: StdioServerParameters) -> ClientSession:
    read, write = await stack.enter_async_context(stdio_client(params))
    session = await stack.enter_async_context(ClientSession(read, write))
    await session.initialize()
    return session


def structured(result) -> dict:
    return result.structured_content or {}


async def tools_and_refusals() -> None:
    async with AsyncExitStack() as stack:
        controller = await open_session(stack, server("controller-prgs", "controller"))
        listed = (await controller.list_tools()).tools
        names = sorted(t.name for t in listed)
        expected = sorted(
            n
            for base in (
                "snapshot_instance_fleet",
                "plan_stale_worker_retirement",
                "explain_worker_retirement",
                "apply_stale_worker_retirement",
            )
            for n in (base, "gitea_" + base)
        )
        assert names == expected, names
        for t in listed:
            schema = t.input_schema if hasattr(t, "input_schema") else t.inputSchema
            assert schema["additionalProperties"] is False, (t.name, schema)
        apply_schema = next(t for t in listed if t.name == "apply_stale_worker_retirement")
        apply_schema = getattr(apply_schema, "input_schema", None) or apply_schema.inputSchema
        assert set(apply_schema["required"]) == {
            "registry_fingerprint",
            "candidate_fingerprint",
            "policy_fingerprint",
        }, apply_schema
        # The workers: named, or the first N candidates of a kept plan.
        assert {"worker_identities", "first"} <= set(apply_schema["properties"]), apply_schema
        ok("eight tools listed, each schema closed to unknown fields")

        # By default the plan is this host's scope (issue 54) ...
        scoped = structured(await controller.call_tool("plan_stale_worker_retirement", {}))
        assert scoped["scope"]["kind"] == "host", scoped
        assert scoped["registry_fingerprint"].startswith("host-scope:"), scoped
        # ... and the whole registry on asking: its apply tolerates a worker
        # registered since the plan (below); a scoped apply refuses any row
        # of this host added since (tests/serve_scope.rs).
        plan = await controller.call_tool(
            "plan_stale_worker_retirement", {"remote": "prgs", "scope": "registry"}
        )
        assert not plan.is_error, plan.content
        doc = structured(plan)
        assert doc["outcome"] == "planned", doc
        assert doc["scope"] == {"kind": "registry"}, doc
        for w in ("w-dead-1", "w-dead-2", "w-dead-3"):
            assert w in doc["candidate_worker_identities"], doc["candidate_worker_identities"]
        assert "w-running" not in doc["candidate_worker_identities"]
        assert doc["audit_context"]["remote"] == "prgs"
        assert "rows assessed" in plan.content[0].text
        ok("plan as a controller: host-scoped by default; the whole registry's three dead workers are candidates")

        snap = await controller.call_tool("gitea_snapshot_instance_fleet", {})
        assert not snap.is_error and "live_fleet_safe" in structured(snap), snap.content
        ok("snapshot through the gitea_ alias")

        tokens = {
            "registry_fingerprint": doc["registry_fingerprint"],
            "candidate_fingerprint": doc["candidate_fingerprint"],
            "policy_fingerprint": doc["policy_fingerprint"],
        }
        # Refused as tool results a model reads and corrects (SEP-1303),
        # not JSON-RPC errors its SDK would raise.
        for tool, args, named in (
            ("plan_stale_worker_retirement", {"profile": "controller-prgs"}, "profile"),
            (
                "apply_stale_worker_retirement",
                dict(tokens, worker_identities=["w-dead-1"], policies="/tmp/permit-all"),
                "policies",
            ),
        ):
            refused = await controller.call_tool(tool, args)
            body = structured(refused)
            assert refused.is_error and body["reason_code"] == "invalid_arguments", body
            assert "unknown field" in body["detail"] and body["argument"] == named, body
            assert body["what_to_do"], body
        ok("calls naming a profile or a policy folder are refused: invalid_arguments")

        author = await open_session(stack, server("author-prgs", "author"))
        refused = await author.call_tool(
            "apply_stale_worker_retirement", dict(tokens, worker_identities=["w-dead-1"])
        )
        assert refused.is_error, refused.content
        body = structured(refused)
        assert body["reason_code"] == "permission_denied", body
        assert "role" in body["detail"] and body["what_to_do"], body
        assert rows("SELECT status FROM worker_registrations WHERE worker_identity='w-dead-1'") == [
            ("active",)
        ]
        ok("apply as an author is refused on its role, with what to do")

        # A new worker (the author's server) registered since the plan, in
        # an instance slot of its own: reported beside the target, it
        # refuses nothing (docs/semantics.md section 13).
        applied = await controller.call_tool(
            "apply_stale_worker_retirement",
            dict(tokens, worker_identities="w-dead-1", canonical_repository=CANON),
        )
        assert not applied.is_error, applied.content
        body = structured(applied)
        assert body["outcome"] == "applied" and body["retired_count"] == 1, body
        assert len(body["rows_changed_since_plan"]) == 1, body
        ok("a worker registered since the plan is reported beside the target")
        audit = rows("SELECT worker_identity, retired_by FROM retirement_audit")
        assert audit == [("w-dead-1", "controller-prgs")], audit
        ok("apply as a controller with the grant retires, with an audit row")

        # The operator removes the grant while the servers run.
        with open(PROFILES) as f:
            profiles = json.load(f)
        profiles["profiles"]["controller-prgs"]["allowed_operations"] = ["gitea.read"]
        with open(PROFILES, "w") as f:
            json.dump(profiles, f)
        plan = structured(await controller.call_tool("plan_stale_worker_retirement", {}))
        refused = await controller.call_tool(
            "apply_stale_worker_retirement",
            {
                "registry_fingerprint": plan["registry_fingerprint"],
                "candidate_fingerprint": plan["candidate_fingerprint"],
                "policy_fingerprint": plan["policy_fingerprint"],
                "worker_identities": ["w-dead-2"],
            },
        )
        assert refused.is_error and structured(refused)["reason_code"] == "permission_denied", (
            refused.content
        )
        assert rows("SELECT status FROM worker_registrations WHERE worker_identity='w-dead-2'") == [
            ("active",)
        ]
        ok("with the grant removed from profiles.json, the running server refuses apply")


async def hold_session(params: StdioServerParameters, ready: asyncio.Event, done: asyncio.Event) -> None:
    async with AsyncExitStack() as stack:
        await open_session(stack, params)
        ready.set()
        await done.wait()


async def a_launch_of_five() -> None:
    out = os.popen(
        f"'{EXE}' launch --client codex "
        "--profiles author=author-prgs,reviewer=author-prgs,merger=author-prgs,"
        "controller=controller-prgs,reconciler=controller-prgs "
        f"--config '{PROFILES}' --env FLEET_RETIRE_REGISTRY={REGISTRY} "
        f"--env FLEET_RETIRE_LEASES={LEASES} --env FLEET_RETIRE_CANONICAL_REPOSITORY={CANON} "
        "--env FLEET_RETIRE_HEARTBEAT_TTL=2 --env FLEET_RETIRE_HEARTBEAT_INTERVAL=0.5"
    ).read()
    config = json.loads(out)
    instance = config["client_instance_id"]
    servers = config["mcpServers"]
    assert len(servers) == 5 and all(s["args"] == ["serve"] for s in servers.values())
    assert all(os.path.isabs(s["command"]) for s in servers.values())
    # Each session lives in a task of its own, as a client holding five
    # servers would; setting its event closes the client's side.
    holders = {}
    for name, spec in servers.items():
        env = dict(spec["env"], PATH=os.environ.get("PATH", ""))
        params = StdioServerParameters(command=spec["command"], args=spec["args"], env=env)
        ready, done = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(hold_session(params, ready, done))
        await asyncio.wait_for(ready.wait(), 20)
        holders[name] = (task, done)
    registered = rows(
        "SELECT namespace, status, pid FROM worker_registrations WHERE client_instance_id = ?",
        instance,
    )
    assert sorted(r[0] for r in registered) == sorted(
        ["author", "reviewer", "merger", "controller", "reconciler"]
    ), registered
    assert all(r[1] == "active" for r in registered), registered
    ok(f"five servers of one launch registered five active rows under {instance}")

    # Four clients go away: their servers see stdin close and release.
    for name in ["gitea-author", "gitea-reviewer", "gitea-merger", "gitea-controller"]:
        task, done = holders.pop(name)
        done.set()
        await task
    deadline = time.time() + 10
    while time.time() < deadline:
        statuses = dict(
            rows(
                "SELECT namespace, status FROM worker_registrations WHERE client_instance_id = ?",
                instance,
            )
        )
        if [statuses[n] for n in ("author", "reviewer", "merger", "controller")] == ["released"] * 4:
            break
        await asyncio.sleep(0.1)
    assert [statuses[n] for n in ("author", "reviewer", "merger", "controller")] == [
        "released"
    ] * 4, statuses
    ok("closing stdin released four rows")

    # The fifth is killed with -9: its row stays active and lapses.
    (pid, identity), = rows(
        "SELECT pid, worker_identity FROM worker_registrations "
        "WHERE client_instance_id = ? AND namespace = 'reconciler'",
        instance,
    )
    os.kill(pid, signal.SIGKILL)
    task, done = holders.pop("gitea-reconciler")
    done.set()
    try:
        await task
    except BaseException:  # the killed server's pipes are already broken
        pass
    assert rows("SELECT status FROM worker_registrations WHERE worker_identity = ?", identity) == [
        ("active",)
    ]
    await asyncio.sleep(2.5)
    # Reads need no grant for apply: restore the controller's read permission only.
    async with AsyncExitStack() as stack:
        planner = await open_session(stack, server("controller-prgs", "controller", {"GITEA_MCP_CLIENT_SESSION": "sess-planner"}))
        plan = structured(await planner.call_tool("plan_stale_worker_retirement", {}))
        assert identity in plan["candidate_worker_identities"], (
            identity,
            [p for p in plan["preserved"] if p["worker_identity"] == identity],
        )
    ok("the server killed with -9 is planned eligible once its TTL lapsed")


async def main() -> None:
    await tools_and_refusals()
    await a_launch_of_five()
    print("all checks passed", flush=True)


asyncio.run(main())

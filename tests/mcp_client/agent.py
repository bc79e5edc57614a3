#!/usr/bin/env python3
"""The agent script, through the official Python MCP SDK's stdio client.

`tests/serve_agents.rs` runs this and `agent.mjs` (the official TypeScript
SDK) against copies of one large realistic registry. Both scripts make the
same checks in the same order; each prints one `ok:` line per check and
`all checks passed` at the end, and exits non-zero on the first failure.

    python3 agent.py EXE DIR

DIR holds registry.sqlite, leases.sqlite and profiles.json (the profile
controller-prgs may read and retire). The checks:

 1. tools: eight (four and their gitea_ aliases), closed input schemas, an
    output schema on each, the annotations;
 2. plan: the summary, compact (under 16 KiB: counts and identities), its
    counts adding up, the candidates at most the server's --max-retire, a
    resource link; with include "candidates", the candidates whole;
 3. preserved rows paged by reason code until no next_cursor: each page
    under 1 MiB, each reason's pages adding up to its count;
 4. the plan's resource read page by page: candidates and preserved rows,
    in order, exactly those of `fleet-retire plan --format json`;
 5. include "all" refused above 1 MiB; an edited cursor, an unknown reason
    code and an unknown argument refused;
 6. explain of a preserved row and of a candidate;
 7. apply of the shown candidates with the plan's tokens, its replay
    (already_retired), and the old tokens retire only a further batch of their plan;
 8. snapshot: its summary and a page of one class's findings.

Every structured result is validated against its tool's output schema.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import jsonschema
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

EXE, DIR = sys.argv[1], sys.argv[2]
REGISTRY = os.path.join(DIR, "registry.sqlite")
LEASES = os.path.join(DIR, "leases.sqlite")
PROFILES = os.path.join(DIR, "profiles.json")
CANON = "prgs/gitea-tools"
BOUND = 1 << 20
MAX_RETIRE = 100
TIMINGS: dict[str, float] = {}


def ok(what: str) -> None:
    print(f"ok: {what}", flush=True)


def server() -> StdioServerParameters:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "FLEET_RETIRE_REGISTRY": REGISTRY,
        "FLEET_RETIRE_LEASES": LEASES,
        "GITEA_MCP_CONFIG": PROFILES,
        "GITEA_MCP_PROFILE": "controller-prgs",
        "GITEA_MCP_NAMESPACE": "controller",
        "FLEET_RETIRE_CANONICAL_REPOSITORY": CANON,
        # A long TTL: the server's own heartbeat must not move the registry
        # token between its plan and the command line's.
        "FLEET_RETIRE_HEARTBEAT_TTL": "900",
    }
    return StdioServerParameters(command=EXE, args=["serve"], env=env)


class Agent:
    def __init__(self, session: ClientSession):
        self.session = session
        self.schemas: dict[str, dict] = {}

    async def call(self, tool: str, args: dict) -> tuple[bool, dict, list]:
        started = time.monotonic()
        # This script pins the whole registry's plan (its numbers are the
        # command line's `plan`); serve plans this host's scope unless asked.
        if tool.endswith("plan_stale_worker_retirement") and "scope" not in args:
            args = dict(args, scope="registry")
        result = await self.session.call_tool(tool, args)
        TIMINGS[tool] = TIMINGS.get(tool, 0.0) + time.monotonic() - started
        body = result.structured_content or {}
        size = len(json.dumps(body, separators=(",", ":")).encode())
        assert size < BOUND, (tool, size)
        jsonschema.validate(body, self.schemas[tool])
        return bool(result.is_error), body, result.content

    async def refused(self, tool: str, args: dict, code: str) -> dict:
        is_error, body, content = await self.call(tool, args)
        assert is_error and body.get("reason_code") == code, (code, body, content)
        assert body.get("what_to_do"), body
        return body


async def tools(agent: Agent) -> None:
    listed = (await agent.session.list_tools()).tools
    bases = [
        "snapshot_instance_fleet",
        "plan_stale_worker_retirement",
        "explain_worker_retirement",
        "apply_stale_worker_retirement",
    ]
    assert sorted(t.name for t in listed) == sorted(
        n for b in bases for n in (b, "gitea_" + b)
    ), [t.name for t in listed]
    for t in listed:
        assert t.input_schema["additionalProperties"] is False, t.name
        assert t.output_schema and t.output_schema["type"] == "object", t.name
        jsonschema.Draft202012Validator.check_schema(t.output_schema)
        agent.schemas[t.name] = t.output_schema
        a = t.annotations
        writes = t.name.endswith("apply_stale_worker_retirement")
        assert a.read_only_hint is (not writes), (t.name, a)
        assert a.open_world_hint is False, (t.name, a)
        if writes:
            assert a.destructive_hint is True and a.idempotent_hint is False, a
    ok("eight tools, closed input schemas, output schemas, annotations")


async def plan_summary(agent: Agent) -> dict:
    is_error, plan, content = await agent.call("plan_stale_worker_retirement", {})
    assert not is_error, content
    assert plan["candidate_count"] + plan["preserved_count"] == plan["assessed_count"], plan
    assert sum(plan["preserved_reason_counts"].values()) == plan["preserved_count"]
    # Compact: counts and identities; the candidates whole on request.
    assert "candidates" not in plan, list(plan)
    size = len(json.dumps(plan, separators=(",", ":")).encode())
    assert size < 16 * 1024, size
    shown = len(plan["candidate_worker_identities"])
    assert shown <= MAX_RETIRE, shown
    assert plan["candidates_not_shown"] == plan["candidate_count"] - shown
    is_error, whole, content = await agent.call(
        "plan_stale_worker_retirement", {"include": "candidates"}
    )
    assert not is_error, content
    names = [c["worker_identity"] for c in whole["candidates"]]
    assert names == whole["candidate_worker_identities"], names[:3]
    assert all("evidence" in c for c in whole["candidates"])
    assert "rows assessed" in content[0].text, content[0]
    # The link names this call's own plan: a row crossing its heartbeat's
    # deadline between the two calls makes the second a plan of its own.
    assert any(c.type == "resource_link" and c.uri == whole["resource_uri"] for c in content)
    ok(
        f"plan summary: {plan['assessed_count']} rows, {plan['candidate_count']} candidates "
        f"({shown} shown), {plan['preserved_count']} preserved"
    )
    return plan


async def page_preserved(agent: Agent, plan: dict) -> dict[str, list[str]]:
    by_reason: dict[str, list[str]] = {}
    pages = 0
    for code, count in plan["preserved_reason_counts"].items():
        ask: dict = {"cursor": plan["preserved_cursors"][code], "limit": 1000}
        seen: list[str] = []
        while True:
            is_error, page, content = await agent.call(
                "plan_stale_worker_retirement", {"preserved": ask}
            )
            assert not is_error, content
            assert page["registry_fingerprint"] == plan["registry_fingerprint"], page
            pages += 1
            for row in page["preserved"]:
                assert row["reason_code"] == code, row
                seen.append(json.dumps(row["worker_identity"]))
            if "next_cursor" not in page:
                break
            ask = {"reason_code": code, "cursor": page["next_cursor"], "limit": 1000}
        assert len(seen) == count, (code, len(seen), count)
        by_reason[code] = seen
    ok(f"preserved rows paged by reason code: {pages} pages, every count adds up")
    return by_reason


async def read_resource(agent: Agent, plan: dict) -> tuple[list, list]:
    uri, candidates, preserved, pages = plan["resource_uri"], [], [], 0
    while uri:
        read = await agent.session.read_resource(uri)
        text = read.contents[0].text
        assert len(text.encode()) < BOUND, len(text)
        page = json.loads(text)
        pages += 1
        candidates += page["candidates"]
        preserved += page["preserved"]
        uri = page.get("next_uri")
    ok(f"the plan's resource read in {pages} pages")
    return candidates, preserved


def cli_plan() -> dict:
    out = subprocess.run(
        [EXE, "--format", "json", "plan", "--registry", REGISTRY, "--leases", LEASES,
         "--canonical-repository", CANON, "--profiles", PROFILES, "--profile", "controller-prgs"],
        check=True, capture_output=True,
    )
    return json.loads(out.stdout)


def keyed(candidates: list, preserved: list) -> dict:
    """Each identity's rows: which list, the verdict, and whether its pid was alive."""
    out: dict = {}
    for name, rows in (("candidates", candidates), ("preserved", preserved)):
        for r in rows:
            verdict = (name, r["reason_code"], r.get("reason_codes"), r["evidence"]["pid_alive"])
            out.setdefault(json.dumps(r["worker_identity"]), []).append(verdict)
    return out


async def same_as_cli(agent: Agent, plan: dict, by_reason: dict, candidates: list, preserved: list) -> None:
    # The tool's pages and the resource are cut from one plan: exactly equal.
    for code, ids in by_reason.items():
        assert ids == [json.dumps(r["worker_identity"]) for r in preserved if r["reason_code"] == code], code
    # The command line plans a moment later. The registry is the same; a
    # generated pid may have started or ended on this machine in between,
    # or a heartbeat expired (time only moves forward), and only such a row
    # may be judged differently.
    cli = cli_plan()
    assert cli["registry_fingerprint"] == plan["registry_fingerprint"], "the registry moved"
    ours, theirs = keyed(candidates, preserved), keyed(cli["candidates"], cli["preserved"])
    assert ours.keys() == theirs.keys(), "the rows differ"
    moved = {k for k in ours if ours[k] != theirs[k]}
    def codes(rows: list) -> set:
        return {c for v in rows for c in (v[2] or [v[1]])}

    for k in moved:
        alive_moved = [v[3] for v in ours[k]] != [v[3] for v in theirs[k]]
        expired = "heartbeat_not_expired" in codes(ours[k]) - codes(theirs[k])
        assert alive_moved or expired, (k, ours[k], theirs[k])
    assert len(moved) <= 20, len(moved)
    if not moved:
        assert cli["candidate_fingerprint"] == plan["candidate_fingerprint"], "verdicts moved"
    order = lambda rows: [json.dumps(r["worker_identity"]) for r in rows if json.dumps(r["worker_identity"]) not in moved]
    assert order(candidates) == order(cli["candidates"]) and order(preserved) == order(cli["preserved"])
    ok(
        "pages and resource add up to `fleet-retire plan --format json` exactly"
        + (f" ({len(moved)} row(s) whose pid started or ended in between)" if moved else "")
    )


async def refusals(agent: Agent, plan: dict) -> None:
    await agent.refused("plan_stale_worker_retirement", {"include": "all"}, "result_too_large")
    _, page, _ = await agent.call("plan_stale_worker_retirement", {"preserved": {"limit": 1}})
    cursor = page["next_cursor"]
    edited = cursor[:-1] + ("0" if cursor[-1] != "0" else "1")
    await agent.refused(
        "plan_stale_worker_retirement", {"preserved": {"cursor": edited}}, "invalid_cursor"
    )
    await agent.refused(
        "plan_stale_worker_retirement", {"preserved": {"reason_code": "nope"}}, "unknown_reason_code"
    )
    await agent.refused("plan_stale_worker_retirement", {"profile": "x"}, "invalid_arguments")
    ok("include all over 1 MiB, an edited cursor, an unknown reason code and argument refused")


async def explain(agent: Agent, plan: dict, by_reason: dict) -> None:
    code, ids = next(iter(by_reason.items()))
    worker = json.loads(ids[0])
    is_error, body, content = await agent.call("explain_worker_retirement", {"worker_identity": worker})
    assert not is_error, content
    first = body["explanations"][0]
    assert first["decision"] == "keep" and first["reason_code"] == code, first
    candidate = plan["candidate_worker_identities"][0]
    is_error, body, content = await agent.call("explain_worker_retirement", {"worker_identity": candidate})
    assert not is_error and body["explanations"][0]["decision"] == "retire", content
    await agent.refused("explain_worker_retirement", {"worker_identity": "w-nobody"}, "unknown_worker")
    ok("explain: a preserved row keeps its reason, a candidate is retired, an unknown worker refused")


async def apply(agent: Agent, plan: dict) -> None:
    tokens = {k: plan[k] for k in ("registry_fingerprint", "candidate_fingerprint", "policy_fingerprint")}
    workers = plan["candidate_worker_identities"]
    is_error, body, content = await agent.call(
        "apply_stale_worker_retirement", {**tokens, "worker_identities": workers}
    )
    assert not is_error and body["outcome"] == "applied", content
    assert body["retired_count"] == len(workers), body["retired_count"]
    size = len(json.dumps(body, separators=(",", ":")).encode())
    assert size < 64 * 1024, ("an apply result sized for an agent", size)
    is_error, body, content = await agent.call(
        "apply_stale_worker_retirement", {**tokens, "worker_identities": workers}
    )
    assert not is_error and body["outcome"] == "already_retired", content
    fresh = (await agent.call("plan_stale_worker_retirement", {}))[1]
    others = fresh["candidate_worker_identities"][:1]
    if others:
        is_error, body, content = await agent.call(
            "apply_stale_worker_retirement", {**tokens, "worker_identities": others}
        )
        # The old plan's tokens retire a further batch of that plan (the
        # worker was its candidate, beyond the first batch; the first batch
        # is recognised as retired_since_plan), never a worker outside it:
        # that one is refused when the set moved otherwise, or kept
        # not_in_current_plan when only time moved it (semantics section 13).
        moved = ("registry_revision_moved", "candidate_set_moved")
        batch = (
            not is_error
            and body["retired_count"] == 1
            # (a tool result shows the first 20 and counts the rest)
            and set(body.get("retired_since_plan", [])) <= set(workers)
            and len(body.get("retired_since_plan", []))
            + body.get("retired_since_plan_not_shown", 0)
            == len(workers)
        )
        kept = not is_error and body["retired_count"] == 0 and any(
            p["worker_identity"] == others[0] and p["reason_code"] == "not_in_current_plan"
            for p in body.get("preserved", [])
        )
        refused = is_error and body.get("reason_code") in moved
        assert batch or kept or refused, (body, content)
    ok(f"apply retired {len(workers)} with the plan's tokens; replay already_retired; old tokens: a further batch of the plan only")


async def snapshot(agent: Agent) -> None:
    is_error, snap, content = await agent.call("snapshot_instance_fleet", {})
    assert not is_error, content
    classes = snap["finding_classes"]
    assert classes, snap
    name, entry = max(classes.items(), key=lambda kv: kv[1]["count"])
    assert len(entry["members"]) <= 5
    is_error, page, content = await agent.call(
        "snapshot_instance_fleet",
        {"page": {"list": "findings", "classification": name, "limit": 50}},
    )
    assert not is_error, content
    assert all(f["classification"] == name for f in page["page"]), name
    assert page["not_shown"] == max(entry["count"] - len(page["page"]), 0) or "next_cursor" in page
    ok(f"snapshot: {len(classes)} finding classes; a page of {name}")


async def main() -> None:
    started = time.monotonic()
    async with stdio_client(server()) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            agent = Agent(session)
            await tools(agent)
            plan = await plan_summary(agent)
            by_reason = await page_preserved(agent, plan)
            candidates, preserved = await read_resource(agent, plan)
            await same_as_cli(agent, plan, by_reason, candidates, preserved)
            await refusals(agent, plan)
            await explain(agent, plan, by_reason)
            await apply(agent, plan)
            await snapshot(agent)
    spent = ", ".join(f"{k} {v:.2f}s" for k, v in sorted(TIMINGS.items()))
    print(f"timings: {spent}; whole script {time.monotonic() - started:.1f}s", flush=True)
    print("all checks passed", flush=True)


asyncio.run(main())

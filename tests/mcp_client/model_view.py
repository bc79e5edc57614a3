#!/usr/bin/env python3
"""What a model sees of `fleet-retire serve`, through the official Python
MCP SDK: many clients hand a model the text of a result and nothing else,
raise JSON-RPC errors instead of showing them, and offer it every tool
listed. `tests/serve_agents.rs` runs this and `model_view.mjs` (the
official TypeScript SDK, the same checks in the same order) on a
3,000-row realistic registry; each prints one `ok:` line per check and
`all checks passed` at the end.

    python3 model_view.py EXE DIR

 1. each gitea_ alias says which tool it stands for and to prefer that one;
 2. a fresh server lists a resource template for its plans and no plan;
 3. a plan read from its text alone: the second text block is the
    structured content's JSON, tokens and candidates included; the plan
    is then listed as a resource, under the template's URI;
 4. a page of 1,000 preserved rows read from its text alone: the whole
    result under 1 MiB, its text abridged to the essential fields (tokens,
    next_cursor, each row's identity and reasons), and next_cursor taken
    from the text pages on;
 5. an apply with the tokens and workers taken from the text;
 6. arguments a schema does not allow (unknown, mistyped, missing, on a
    tool and on its alias) come back as tool results with reason_code
    invalid_arguments and what_to_do, never as a raised error, and the
    corrected call succeeds.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

EXE, DIR = sys.argv[1], sys.argv[2]
BOUND = 1 << 20
PLAN = "plan_stale_worker_retirement"
APPLY = "apply_stale_worker_retirement"
TEMPLATE = "fleet-retire://plan/{registry_fingerprint}.{candidate_fingerprint}.{plan_number}"


def ok(what: str) -> None:
    print(f"ok: {what}", flush=True)


def server() -> StdioServerParameters:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "FLEET_RETIRE_REGISTRY": os.path.join(DIR, "registry.sqlite"),
        "FLEET_RETIRE_LEASES": os.path.join(DIR, "leases.sqlite"),
        "GITEA_MCP_CONFIG": os.path.join(DIR, "profiles.json"),
        "GITEA_MCP_PROFILE": "controller-prgs",
        "GITEA_MCP_NAMESPACE": "controller",
        "FLEET_RETIRE_CANONICAL_REPOSITORY": "prgs/gitea-tools",
        "FLEET_RETIRE_PLAN_DIR": os.path.join(DIR, "plans"),
    }
    return StdioServerParameters(command=EXE, args=["serve"], env=env)


async def text_of(session: ClientSession, tool: str, args: dict) -> tuple[bool, str, dict, dict]:
    """A call as a text-only client reads it: the summary and the JSON
    block, never the structured content (returned apart, for comparison).
    A plan is of the whole registry, whose tokens the checks read."""
    if tool.endswith("plan_stale_worker_retirement") and "scope" not in args:
        args = dict(args, scope="registry")
    result = await session.call_tool(tool, args)
    texts = [c.text for c in result.content if c.type == "text"]
    assert len(texts) == 2, texts
    size = len(result.model_dump_json(by_alias=True, exclude_none=True).encode())
    assert size < BOUND, (tool, size)
    return bool(result.is_error), texts[0], json.loads(texts[1]), result.structured_content


async def aliases(session: ClientSession) -> None:
    listed = {t.name: t for t in (await session.list_tools()).tools}
    bases = [n for n in listed if not n.startswith("gitea_")]
    assert len(bases) == 4, list(listed)
    for base in bases:
        said = listed["gitea_" + base].description
        assert said.startswith(f"Alias of {base}, kept for the seed's callers; prefer {base}"), said
        assert said != listed[base].description
    ok("each gitea_ alias names the tool to prefer")


async def resources_before(session: ClientSession) -> None:
    templates = (await session.list_resource_templates()).resource_templates
    assert [t.uri_template for t in templates] == [TEMPLATE], templates
    assert templates[0].mime_type == "application/json", templates[0]
    assert (await session.list_resources()).resources == []
    ok("a fresh server: one resource template for its plans, no plan listed")


async def plan_from_text(session: ClientSession) -> dict:
    is_error, summary, plan, structured = await text_of(session, PLAN, {})
    assert not is_error and "rows assessed" in summary, summary
    assert plan == structured, "the JSON block is the structured content"
    for token in ("registry_fingerprint", "candidate_fingerprint", "policy_fingerprint"):
        assert plan[token].startswith(("registryfp-", "candidatefp-", "sha256:")), plan[token]
    assert plan["candidate_worker_identities"], plan
    uri = plan["resource_uri"]
    assert re.fullmatch(re.escape(TEMPLATE.format(**plan, plan_number="@")).replace("@", "[0-9]+"), uri), uri
    listed = [r.uri for r in (await session.list_resources()).resources]
    assert uri in listed, (uri, listed)
    page = json.loads((await session.read_resource(uri)).contents[0].text)
    assert page["registry_fingerprint"] == plan["registry_fingerprint"], page.keys()
    ok(f"a plan from its text: {plan['candidate_count']} candidates, tokens; listed as {uri[:40]}…")
    return plan


async def page_from_text(session: ClientSession, plan: dict) -> None:
    code = max(plan["preserved_reason_counts"], key=plan["preserved_reason_counts"].get)
    ask = {"reason_code": code, "limit": 1000}
    is_error, summary, page, structured = await text_of(session, PLAN, {"preserved": ask})
    assert not is_error, summary
    assert "abridged" in page, list(page)
    assert page["registry_fingerprint"] == structured["registry_fingerprint"]
    assert page["next_cursor"] == structured["next_cursor"]
    essential = [
        {k: r[k] for k in ("worker_identity", "reason_code", "reason_codes") if k in r}
        for r in structured["preserved"]
    ]
    shown = [{k: r[k] for k in ("worker_identity", "reason_code", "reason_codes") if k in r}
             for r in page["preserved"]]
    assert shown == essential, "each row's identity and reasons"
    assert all("evidence" not in r for r in page["preserved"])
    rows = len(page["preserved"])
    is_error, _, after, _ = await text_of(
        session, PLAN, {"preserved": {"cursor": page["next_cursor"], "limit": 10}}
    )
    assert not is_error and after["preserved"][0]["reason_code"] == code, after
    ok(f"a page of {rows} {code} rows from its text: abridged, under 1 MiB, its cursor followed")


async def apply_from_text(session: ClientSession, plan: dict) -> None:
    tokens = {k: plan[k] for k in ("registry_fingerprint", "candidate_fingerprint", "policy_fingerprint")}
    workers = plan["candidate_worker_identities"][:2]
    is_error, summary, body, _ = await text_of(session, APPLY, {**tokens, "worker_identities": workers})
    assert not is_error and body["outcome"] == "applied", summary
    assert body["retired_count"] == 2, body
    ok("an apply with the tokens and workers read from the text: applied, 2 retired")


async def argument_errors(session: ClientSession, plan: dict) -> None:
    asks = [
        (PLAN, {"profile": "controller-prgs"}, "profile"),
        ("gitea_" + PLAN, {"include": 5}, "include"),
        (PLAN, {"preserved": {"limit": "ten"}}, "preserved.limit"),
        (APPLY, {"registry_fingerprint": plan["registry_fingerprint"], "first": 1}, "candidate_fingerprint"),
    ]
    for tool, args, argument in asks:
        is_error, summary, body, _ = await text_of(session, tool, args)
        assert is_error and body["reason_code"] == "invalid_arguments", (tool, args, body)
        assert summary.startswith("invalid_arguments: "), summary
        assert body["argument"] == argument, (args, body)
        assert "canonical_repository" in body["what_to_do"], body
    is_error, summary, _, _ = await text_of(session, PLAN, {"include": "summary"})
    assert not is_error, summary
    ok("unknown, mistyped and missing arguments: tool results invalid_arguments; corrected, the call succeeds")


async def main() -> None:
    async with stdio_client(server()) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            await aliases(session)
            await resources_before(session)
            plan = await plan_from_text(session)
            await page_from_text(session, plan)
            await apply_from_text(session, plan)
            await argument_errors(session, plan)
    print("all checks passed", flush=True)


asyncio.run(main())

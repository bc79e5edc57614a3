#!/usr/bin/env python3
"""Hostile tool calls to `fleet-retire serve`, made with the official Python
MCP SDK's stdio client. `tests/security.rs` prepares the stores and runs
this script; it prints one `ok:` line per attack refused and exits non-zero
on the first attack that was not.

    python3 hostile.py EXE DIR ATTACK

ATTACK is `repository` (the agent names another canonical repository) or
`duplicate-key` (a key given twice in a tool's arguments).

DIR holds registry.sqlite (dead, eligible workers w-dead-1..3 bound to
prgs/gitea-tools, and a dead one, w-other, bound to other/repo),
leases.sqlite and profiles.json (controller-prgs holds the retire grant).
The server is bound to prgs/gitea-tools at launch.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared import exceptions as _exceptions
from mcp.shared.message import SessionMessage

# The SDK has spelled its error class McpError and MCPError; accept either.
RPC_ERRORS = tuple(
    getattr(_exceptions, n) for n in ("McpError", "MCPError") if hasattr(_exceptions, n)
)

EXE, DIR, ATTACK = sys.argv[1:4]
REGISTRY = os.path.join(DIR, "registry.sqlite")
CANON = "prgs/gitea-tools"
OTHER = "other/repo"
# An argument named DUP + key is sent as a second `key` member of the same
# object: the SDK cannot write a duplicated key, so its JSON text is edited
# on the way to the server.
DUP = "dup~"


def ok(what: str) -> None:
    print(f"ok: {what}", flush=True)


def statuses() -> dict[str, str]:
    with sqlite3.connect(REGISTRY) as c:
        return dict(c.execute("SELECT worker_identity, status FROM worker_registrations"))


def audited() -> list[tuple[str, str]]:
    with sqlite3.connect(REGISTRY) as c:
        try:
            return c.execute(
                "SELECT worker_identity, canonical_repository FROM retirement_audit"
            ).fetchall()
        except sqlite3.OperationalError:  # no audit table: nothing was retired
            return []


def server() -> StdioServerParameters:
    return StdioServerParameters(
        command=EXE,
        args=["serve"],
        env={
            "PATH": os.environ.get("PATH", ""),
            "FLEET_RETIRE_REGISTRY": REGISTRY,
            "FLEET_RETIRE_LEASES": os.path.join(DIR, "leases.sqlite"),
            "GITEA_MCP_CONFIG": os.path.join(DIR, "profiles.json"),
            "GITEA_MCP_PROFILE": "controller-prgs",
            "GITEA_MCP_NAMESPACE": "controller",
            "FLEET_RETIRE_CANONICAL_REPOSITORY": CANON,
            "GITEA_MCP_CLIENT_SESSION": "sess-hostile",
        },
    )


class RawText:
    """Stands in for a message model: the SDK's stdio writer only asks it for
    its JSON text."""

    def __init__(self, text: str) -> None:
        self.text = text

    def model_dump_json(self, **_options) -> str:
        return self.text


@asynccontextmanager
async def duplicating_client(params: StdioServerParameters):
    """The SDK's stdio client, with DUP-prefixed keys renamed to their plain
    name in the JSON text it writes."""
    async with stdio_client(params) as (read, write):
        to_server, from_session = anyio.create_memory_object_stream(0)

        async def pump() -> None:
            async with from_session:
                async for message in from_session:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    if f'"{DUP}' in text:
                        message = SessionMessage(
                            message=RawText(text.replace(f'"{DUP}', '"')),
                            metadata=message.metadata,
                        )
                    await write.send(message)

        async with anyio.create_task_group() as tg:
            tg.start_soon(pump)
            try:
                yield read, to_server
            finally:
                await to_server.aclose()


async def open_session(stack: AsyncExitStack) -> ClientSession:
    read, write = await stack.enter_async_context(duplicating_client(server()))
    session = await stack.enter_async_context(ClientSession(read, write))
    await session.initialize()
    return session


def structured(result) -> dict:
    return result.structured_content or {}


def tokens(plan: dict) -> dict:
    return {
        k: plan[k] for k in ("registry_fingerprint", "candidate_fingerprint", "policy_fingerprint")
    }


def refused_as(result, reason_code: str) -> dict:
    body = structured(result)
    assert result.is_error and body.get("reason_code") == reason_code, (reason_code, result.content)
    return body


async def the_agent_picks_the_repository(s: ClientSession) -> None:
    # The attack as reported: plan for another repository, apply its tokens.
    plan = await s.call_tool("plan_stale_worker_retirement", {"canonical_repository": OTHER})
    if not plan.is_error:
        await s.call_tool(
            "apply_stale_worker_retirement",
            dict(tokens(structured(plan)), worker_identities=["w-other"], canonical_repository=OTHER),
        )
    assert statuses()["w-other"] == "active", ("w-other, bound to other/repo, was retired", audited())
    assert audited() == [], audited()
    body = refused_as(plan, "repository_not_bound")
    assert OTHER in body["detail"] and CANON in body["detail"], body
    ok("a plan naming another repository is refused: repository_not_bound")

    snap = await s.call_tool("snapshot_instance_fleet", {"canonical_repository": OTHER})
    refused_as(snap, "repository_not_bound")
    ok("a snapshot naming another repository is refused: repository_not_bound")

    plan = await s.call_tool("plan_stale_worker_retirement", {"canonical_repository": CANON})
    assert not plan.is_error, plan.content
    doc = structured(plan)
    assert "w-dead-1" in doc["candidate_worker_identities"], doc["candidate_worker_identities"]
    assert "w-other" not in doc["candidate_worker_identities"], doc["candidate_worker_identities"]
    ok("a plan naming the bound repository is accepted")

    applied = await s.call_tool(
        "apply_stale_worker_retirement",
        dict(tokens(doc), worker_identities=["w-dead-1"], canonical_repository=OTHER),
    )
    refused_as(applied, "repository_not_bound")
    assert statuses()["w-dead-1"] == "active", statuses()
    ok("an apply naming another repository is refused: repository_not_bound")


async def a_duplicated_key_in_arguments(s: ClientSession) -> None:
    plan = await s.call_tool("plan_stale_worker_retirement", {})
    assert not plan.is_error, plan.content
    doc = structured(plan)
    wanted = ["w-dead-1", "w-dead-2", "w-dead-3"]
    assert all(w in doc["candidate_worker_identities"] for w in wanted), doc
    # A reader of the request sees one worker; serde_json keeps the last value.
    args = dict(tokens(doc), worker_identities=["w-dead-1"])
    args[DUP + "worker_identities"] = wanted
    refusal, result = None, None
    try:
        result = await s.call_tool("apply_stale_worker_retirement", args)
    except RPC_ERRORS as e:
        refusal = str(e)
    now = statuses()
    assert all(now[w] == "active" for w in wanted), (
        "the duplicated key's last value was used",
        now,
        result and result.content,
    )
    assert refusal is not None, ("a duplicated key was accepted", result and result.content)
    assert "duplicate key" in refusal and "worker_identities" in refusal, refusal
    ok("an apply with a duplicated key in its arguments is a JSON-RPC error naming the key")

    again = await s.call_tool("plan_stale_worker_retirement", {})
    assert not again.is_error, again.content
    ok("the server goes on serving after the refusal")


ATTACKS = {
    "repository": the_agent_picks_the_repository,
    "duplicate-key": a_duplicated_key_in_arguments,
}


async def main() -> None:
    async with AsyncExitStack() as stack:
        session = await open_session(stack)
        await ATTACKS[ATTACK](session)
    print("all attacks refused", flush=True)


asyncio.run(asyncio.wait_for(main(), 90))

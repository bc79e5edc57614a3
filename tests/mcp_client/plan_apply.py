#!/usr/bin/env python3
"""Plan and apply through `fleet-retire serve` with the official Python MCP
SDK's stdio client, against stores given as locations (PostgreSQL URLs
included). `tests/postgres.rs` prepares the stores, runs this script and
checks the database itself; this prints one JSON line per tool result.

    python3 plan_apply.py EXE REGISTRY LEASES PROFILES
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

EXE, REGISTRY, LEASES, PROFILES = sys.argv[1:5]


async def main() -> None:
    params = StdioServerParameters(
        command=EXE,
        args=["serve"],
        env={
            "PATH": os.environ.get("PATH", ""),
            "FLEET_RETIRE_REGISTRY": REGISTRY,
            "FLEET_RETIRE_LEASES": LEASES,
            "GITEA_MCP_CONFIG": PROFILES,
            "GITEA_MCP_PROFILE": "controller-prgs",
            "GITEA_MCP_NAMESPACE": "controller",
            "FLEET_RETIRE_CANONICAL_REPOSITORY": "prgs/gitea-tools",
            "GITEA_MCP_CLIENT_SESSION": "sess-controller",
            "GITEA_MCP_WORKER_IDENTITY": "w-serve-controller",
        },
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            plan = await session.call_tool("plan_stale_worker_retirement", {})
            assert not plan.is_error, plan.content
            doc = plan.structured_content
            print(json.dumps({"plan": doc["candidate_worker_identities"]}), flush=True)
            applied = await session.call_tool(
                "apply_stale_worker_retirement",
                {
                    "registry_fingerprint": doc["registry_fingerprint"],
                    "candidate_fingerprint": doc["candidate_fingerprint"],
                    "policy_fingerprint": doc["policy_fingerprint"],
                    "worker_identities": doc["candidate_worker_identities"],
                },
            )
            assert not applied.is_error, applied.content
            print(json.dumps({"apply": applied.structured_content}), flush=True)


asyncio.run(main())

#!/usr/bin/env python3
"""A minimal client of `fleet-retire serve`, through the official Python MCP
SDK (2.x). docs/serve.md shows it; tests/serve_agents.rs runs it.

    python3 minimal.py EXE DIR [apply]

DIR holds registry.sqlite, leases.sqlite and profiles.json. It plans, prints
what a model reads, and with `apply` retires the plan's first candidate.
"""

import asyncio
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main(exe: str, folder: str, apply: bool) -> None:
    server = StdioServerParameters(
        command=exe,
        args=["serve"],
        env={
            "PATH": os.environ.get("PATH", ""),
            "FLEET_RETIRE_REGISTRY": os.path.join(folder, "registry.sqlite"),
            "FLEET_RETIRE_LEASES": os.path.join(folder, "leases.sqlite"),
            "GITEA_MCP_CONFIG": os.path.join(folder, "profiles.json"),
            "GITEA_MCP_PROFILE": "controller-prgs",
            "GITEA_MCP_NAMESPACE": "controller",
            "FLEET_RETIRE_CANONICAL_REPOSITORY": "prgs/gitea-tools",
        },
    )
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            plan = await session.call_tool("plan_stale_worker_retirement", {})
            print(plan.content[0].text)  # the summary; content[1] is the JSON
            if plan.is_error or not apply:
                return
            doc = plan.structured_content
            tokens = ("registry_fingerprint", "candidate_fingerprint", "policy_fingerprint")
            args = {k: doc[k] for k in tokens} | {"first": 1}
            applied = await session.call_tool("apply_stale_worker_retirement", args)
            print(applied.content[0].text)
            print("retired:", applied.structured_content.get("retired_count"))


asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:] == ["apply"]))

#!/usr/bin/env python3
"""Time plan calls through the official Python MCP SDK's stdio client.

    python3 time_plan.py EXE DIR [CALLS]

DIR holds registry.sqlite, leases.sqlite and profiles.json (profile
controller-prgs). Prints the median and the range of CALLS (10) plan calls,
each timed from the SDK's call to its parsed, validated result, and the
result's size. docs/performance.md quotes it.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main() -> None:
    exe, folder = sys.argv[1], sys.argv[2]
    calls = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    env = {
        "PATH": os.environ.get("PATH", ""),
        "FLEET_RETIRE_REGISTRY": os.path.join(folder, "registry.sqlite"),
        "FLEET_RETIRE_LEASES": os.path.join(folder, "leases.sqlite"),
        "GITEA_MCP_CONFIG": os.path.join(folder, "profiles.json"),
        "GITEA_MCP_PROFILE": "controller-prgs",
        "GITEA_MCP_NAMESPACE": "controller",
        "FLEET_RETIRE_CANONICAL_REPOSITORY": "prgs/gitea-tools",
    }
    # With a kept-plans folder, each plan's rows are also written there.
    if os.environ.get("FLEET_RETIRE_PLAN_DIR"):
        env["FLEET_RETIRE_PLAN_DIR"] = os.environ["FLEET_RETIRE_PLAN_DIR"]
    params = StdioServerParameters(command=exe, args=["serve"], env=env)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            await session.list_tools()
            spent, size = [], 0
            for _ in range(calls):
                started = time.monotonic()
                result = await session.call_tool("plan_stale_worker_retirement", {})
                spent.append(time.monotonic() - started)
                assert not result.is_error, result.content
                size = len(json.dumps(result.structured_content))
    print(
        f"python sdk plan call: median {statistics.median(spent):.3f} s "
        f"(min {min(spent):.3f}, max {max(spent):.3f}; {calls} calls), "
        f"structured content {size / 1000:.0f} KB"
    )


asyncio.run(main())

// A minimal client of `fleet-retire serve`, through the official TypeScript
// MCP SDK. docs/serve.md shows it; tests/serve_agents.rs runs it.
//
//     node minimal.mjs EXE DIR [apply]
//
// DIR holds registry.sqlite, leases.sqlite and profiles.json. It plans,
// prints what a model reads, and with `apply` retires the plan's first
// candidate.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import path from "node:path";

const [exe, folder, apply] = process.argv.slice(2);
const transport = new StdioClientTransport({
  command: exe,
  args: ["serve"],
  env: {
    PATH: process.env.PATH ?? "",
    FLEET_RETIRE_REGISTRY: path.join(folder, "registry.sqlite"),
    FLEET_RETIRE_LEASES: path.join(folder, "leases.sqlite"),
    GITEA_MCP_CONFIG: path.join(folder, "profiles.json"),
    GITEA_MCP_PROFILE: "controller-prgs",
    GITEA_MCP_NAMESPACE: "controller",
    FLEET_RETIRE_CANONICAL_REPOSITORY: "prgs/gitea-tools",
  },
});
const client = new Client({ name: "minimal", version: "1.0.0" });
await client.connect(transport);
try {
  const plan = await client.callTool({ name: "plan_stale_worker_retirement", arguments: {} });
  console.log(plan.content[0].text); // the summary; content[1] is the JSON
  if (!plan.isError && apply === "apply") {
    const doc = plan.structuredContent;
    const applied = await client.callTool({
      name: "apply_stale_worker_retirement",
      arguments: {
        registry_fingerprint: doc.registry_fingerprint,
        candidate_fingerprint: doc.candidate_fingerprint,
        policy_fingerprint: doc.policy_fingerprint,
        first: 1,
      },
    });
    console.log(applied.content[0].text);
    console.log("retired:", applied.structuredContent.retired_count);
  }
} finally {
  await client.close();
}

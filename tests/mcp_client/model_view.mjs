// What a model sees of `fleet-retire serve`, through the official
// TypeScript MCP SDK: the same checks, in the same order, as model_view.py
// (read its docstring for the list).
//
//     node model_view.mjs EXE DIR

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import path from "node:path";

const [EXE, DIR] = process.argv.slice(2);
const BOUND = 1 << 20;
const PLAN = "plan_stale_worker_retirement";
const APPLY = "apply_stale_worker_retirement";
const TEMPLATE = "fleet-retire://plan/{registry_fingerprint}.{candidate_fingerprint}.{plan_number}";
const TIMEOUT = { timeout: 300_000 };

function ok(what) {
  console.log(`ok: ${what}`);
}

function assert(cond, ...what) {
  if (!cond) {
    throw new Error(`check failed: ${what.map((w) => JSON.stringify(w)).join(" ")}`);
  }
}

const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

/** A call as a text-only client reads it: the summary and the JSON block,
 * never the structured content (returned apart, for comparison). */
async function textOf(client, tool, args) {
  // A plan is of the whole registry, whose tokens the checks read.
  if (tool.endsWith("plan_stale_worker_retirement") && !("scope" in args)) {
    args = { ...args, scope: "registry" };
  }
  const result = await client.callTool({ name: tool, arguments: args }, undefined, TIMEOUT);
  const texts = result.content.filter((c) => c.type === "text").map((c) => c.text);
  assert(texts.length === 2, texts);
  const size = Buffer.byteLength(JSON.stringify(result));
  assert(size < BOUND, tool, size);
  return [Boolean(result.isError), texts[0], JSON.parse(texts[1]), result.structuredContent];
}

async function aliases(client) {
  const listed = Object.fromEntries((await client.listTools()).tools.map((t) => [t.name, t]));
  const bases = Object.keys(listed).filter((n) => !n.startsWith("gitea_"));
  assert(bases.length === 4, Object.keys(listed));
  for (const base of bases) {
    const said = listed[`gitea_${base}`].description;
    assert(said.startsWith(`Alias of ${base}, kept for the seed's callers; prefer ${base}`), said);
    assert(said !== listed[base].description);
  }
  ok("each gitea_ alias names the tool to prefer");
}

async function resourcesBefore(client) {
  const { resourceTemplates } = await client.listResourceTemplates();
  assert(same(resourceTemplates.map((t) => t.uriTemplate), [TEMPLATE]), resourceTemplates);
  assert(resourceTemplates[0].mimeType === "application/json", resourceTemplates[0]);
  assert((await client.listResources()).resources.length === 0);
  ok("a fresh server: one resource template for its plans, no plan listed");
}

async function planFromText(client) {
  const [isError, summary, plan, structured] = await textOf(client, PLAN, {});
  assert(!isError && summary.includes("rows assessed"), summary);
  assert(same(plan, structured), "the JSON block is the structured content");
  assert(plan.registry_fingerprint.startsWith("registryfp-"), plan.registry_fingerprint);
  assert(plan.candidate_fingerprint.startsWith("candidatefp-"), plan.candidate_fingerprint);
  assert(plan.policy_fingerprint.startsWith("sha256:"), plan.policy_fingerprint);
  assert(plan.candidate_worker_identities.length > 0, plan);
  const uri = plan.resource_uri;
  const prefix = TEMPLATE.replace("{registry_fingerprint}", plan.registry_fingerprint)
    .replace("{candidate_fingerprint}", plan.candidate_fingerprint)
    .replace("{plan_number}", "");
  assert(uri.startsWith(prefix) && /^[0-9]+$/.test(uri.slice(prefix.length)), uri, prefix);
  const listed = (await client.listResources()).resources.map((r) => r.uri);
  assert(listed.includes(uri), uri, listed);
  const read = await client.readResource({ uri }, TIMEOUT);
  const page = JSON.parse(read.contents[0].text);
  assert(page.registry_fingerprint === plan.registry_fingerprint, Object.keys(page));
  ok(`a plan from its text: ${plan.candidate_count} candidates, tokens; listed as ${uri.slice(0, 40)}…`);
  return plan;
}

const essentials = (rows) =>
  rows.map((r) =>
    Object.fromEntries(
      ["worker_identity", "reason_code", "reason_codes"].filter((k) => k in r).map((k) => [k, r[k]]),
    ),
  );

async function pageFromText(client, plan) {
  const counts = plan.preserved_reason_counts;
  const code = Object.keys(counts).reduce((a, b) => (counts[b] > counts[a] ? b : a));
  const ask = { reason_code: code, limit: 1000 };
  const [isError, summary, page, structured] = await textOf(client, PLAN, { preserved: ask });
  assert(!isError, summary);
  assert("abridged" in page, Object.keys(page));
  assert(page.registry_fingerprint === structured.registry_fingerprint);
  assert(page.next_cursor === structured.next_cursor);
  assert(same(essentials(page.preserved), essentials(structured.preserved)), "each row's identity and reasons");
  assert(page.preserved.every((r) => !("evidence" in r)));
  const [afterError, , after] = await textOf(client, PLAN, {
    preserved: { cursor: page.next_cursor, limit: 10 },
  });
  assert(!afterError && after.preserved[0].reason_code === code, after);
  ok(`a page of ${page.preserved.length} ${code} rows from its text: abridged, under 1 MiB, its cursor followed`);
}

async function applyFromText(client, plan) {
  const tokens = {
    registry_fingerprint: plan.registry_fingerprint,
    candidate_fingerprint: plan.candidate_fingerprint,
    policy_fingerprint: plan.policy_fingerprint,
  };
  const workers = plan.candidate_worker_identities.slice(0, 2);
  const [isError, summary, body] = await textOf(client, APPLY, { ...tokens, worker_identities: workers });
  assert(!isError && body.outcome === "applied", summary);
  assert(body.retired_count === 2, body);
  ok("an apply with the tokens and workers read from the text: applied, 2 retired");
}

async function argumentErrors(client, plan) {
  const asks = [
    [PLAN, { profile: "controller-prgs" }, "profile"],
    [`gitea_${PLAN}`, { include: 5 }, "include"],
    [PLAN, { preserved: { limit: "ten" } }, "preserved.limit"],
    [APPLY, { registry_fingerprint: plan.registry_fingerprint, first: 1 }, "candidate_fingerprint"],
  ];
  for (const [tool, args, argument] of asks) {
    const [isError, summary, body] = await textOf(client, tool, args);
    assert(isError && body.reason_code === "invalid_arguments", tool, args, body);
    assert(summary.startsWith("invalid_arguments: "), summary);
    assert(body.argument === argument, args, body);
    assert(body.what_to_do.includes("canonical_repository"), body);
  }
  const [isError, summary] = await textOf(client, PLAN, { include: "summary" });
  assert(!isError, summary);
  ok("unknown, mistyped and missing arguments: tool results invalid_arguments; corrected, the call succeeds");
}

async function main() {
  const transport = new StdioClientTransport({
    command: EXE,
    args: ["serve"],
    env: {
      PATH: process.env.PATH ?? "",
      FLEET_RETIRE_REGISTRY: path.join(DIR, "registry.sqlite"),
      FLEET_RETIRE_LEASES: path.join(DIR, "leases.sqlite"),
      GITEA_MCP_CONFIG: path.join(DIR, "profiles.json"),
      GITEA_MCP_PROFILE: "controller-prgs",
      GITEA_MCP_NAMESPACE: "controller",
      FLEET_RETIRE_CANONICAL_REPOSITORY: "prgs/gitea-tools",
      FLEET_RETIRE_PLAN_DIR: path.join(DIR, "plans"),
    },
    stderr: "inherit",
  });
  const client = new Client({ name: "fleet-retire-model-view-test", version: "1.0.0" });
  await client.connect(transport);
  try {
    await aliases(client);
    await resourcesBefore(client);
    const plan = await planFromText(client);
    await pageFromText(client, plan);
    await applyFromText(client, plan);
    await argumentErrors(client, plan);
  } finally {
    await client.close();
  }
  console.log("all checks passed");
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});

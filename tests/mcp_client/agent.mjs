// The agent script, through the official TypeScript MCP SDK's stdio client.
//
// The same checks, in the same order, as agent.py (read its docstring for the
// list); `tests/serve_agents.rs` runs both against copies of one large
// realistic registry.
//
//     node agent.mjs EXE DIR

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import Ajv from "ajv";
import { execFileSync } from "node:child_process";
import path from "node:path";

const [EXE, DIR] = process.argv.slice(2);
const REGISTRY = path.join(DIR, "registry.sqlite");
const LEASES = path.join(DIR, "leases.sqlite");
const PROFILES = path.join(DIR, "profiles.json");
const CANON = "prgs/gitea-tools";
const BOUND = 1 << 20;
const MAX_RETIRE = 100;
const TIMEOUT = { timeout: 300_000 };
const timings = {};

function ok(what) {
  console.log(`ok: ${what}`);
}

function assert(cond, ...what) {
  if (!cond) {
    throw new Error(`check failed: ${what.map((w) => JSON.stringify(w)).join(" ")}`);
  }
}

class Agent {
  constructor(client) {
    this.client = client;
    this.validators = {};
    this.ajv = new Ajv({ strict: false, allErrors: true });
  }

  async call(tool, args) {
    const started = performance.now();
    // This script pins the whole registry's plan (its numbers are the
    // command line's `plan`); serve plans this host's scope unless asked.
    if (tool.endsWith("plan_stale_worker_retirement") && !("scope" in args)) {
      args = { ...args, scope: "registry" };
    }
    const result = await this.client.callTool({ name: tool, arguments: args }, undefined, TIMEOUT);
    timings[tool] = (timings[tool] ?? 0) + (performance.now() - started) / 1000;
    const body = result.structuredContent ?? {};
    const size = Buffer.byteLength(JSON.stringify(body));
    assert(size < BOUND, tool, size);
    const valid = this.validators[tool];
    assert(valid(body), tool, valid.errors);
    return [Boolean(result.isError), body, result.content];
  }

  async refused(tool, args, code) {
    const [isError, body, content] = await this.call(tool, args);
    assert(isError && body.reason_code === code, code, body, content);
    assert(body.what_to_do, body);
    return body;
  }
}

async function tools(agent) {
  const { tools: listed } = await agent.client.listTools();
  const bases = [
    "snapshot_instance_fleet",
    "plan_stale_worker_retirement",
    "explain_worker_retirement",
    "apply_stale_worker_retirement",
  ];
  const names = listed.map((t) => t.name).sort();
  const expected = bases.flatMap((b) => [b, `gitea_${b}`]).sort();
  assert(JSON.stringify(names) === JSON.stringify(expected), names);
  for (const t of listed) {
    assert(t.inputSchema.additionalProperties === false, t.name);
    assert(t.outputSchema && t.outputSchema.type === "object", t.name);
    agent.validators[t.name] = agent.ajv.compile(t.outputSchema);
    const a = t.annotations;
    const writes = t.name.endsWith("apply_stale_worker_retirement");
    assert(a.readOnlyHint === !writes, t.name, a);
    assert(a.openWorldHint === false, t.name, a);
    if (writes) {
      assert(a.destructiveHint === true && a.idempotentHint === false, a);
    }
  }
  ok("eight tools, closed input schemas, output schemas, annotations");
}

async function planSummary(agent) {
  const [isError, plan, content] = await agent.call("plan_stale_worker_retirement", {});
  assert(!isError, content);
  assert(plan.candidate_count + plan.preserved_count === plan.assessed_count, plan.assessed_count);
  const reasons = Object.values(plan.preserved_reason_counts).reduce((a, b) => a + b, 0);
  assert(reasons === plan.preserved_count, reasons);
  // Compact: counts and identities; the candidates whole on request.
  assert(plan.candidates === undefined, Object.keys(plan));
  const size = Buffer.byteLength(JSON.stringify(plan));
  assert(size < 16 * 1024, size);
  const shown = plan.candidate_worker_identities.length;
  assert(shown <= MAX_RETIRE, shown);
  assert(plan.candidates_not_shown === plan.candidate_count - shown);
  const [wholeError, whole, wholeContent] = await agent.call("plan_stale_worker_retirement", {
    include: "candidates",
  });
  assert(!wholeError, wholeContent);
  const names = whole.candidates.map((c) => c.worker_identity);
  assert(JSON.stringify(names) === JSON.stringify(whole.candidate_worker_identities), names);
  assert(whole.candidates.every((c) => c.evidence !== undefined), "candidates whole");
  assert(content[0].text.includes("rows assessed"), content[0]);
  assert(content.some((c) => c.type === "resource_link" && c.uri === plan.resource_uri), content);
  ok(
    `plan summary: ${plan.assessed_count} rows, ${plan.candidate_count} candidates ` +
      `(${shown} shown), ${plan.preserved_count} preserved`,
  );
  return plan;
}

async function pagePreserved(agent, plan) {
  const byReason = {};
  let pages = 0;
  for (const [code, count] of Object.entries(plan.preserved_reason_counts)) {
    let ask = { cursor: plan.preserved_cursors[code], limit: 1000 };
    const seen = [];
    for (;;) {
      const [isError, page, content] = await agent.call("plan_stale_worker_retirement", {
        preserved: ask,
      });
      assert(!isError, content);
      assert(page.registry_fingerprint === plan.registry_fingerprint, page.registry_fingerprint);
      pages += 1;
      for (const row of page.preserved) {
        assert(row.reason_code === code, row.reason_code);
        seen.push(JSON.stringify(row.worker_identity));
      }
      if (page.next_cursor === undefined) break;
      ask = { reason_code: code, cursor: page.next_cursor, limit: 1000 };
    }
    assert(seen.length === count, code, seen.length, count);
    byReason[code] = seen;
  }
  ok(`preserved rows paged by reason code: ${pages} pages, every count adds up`);
  return byReason;
}

async function readResource(agent, plan) {
  let uri = plan.resource_uri;
  const candidates = [];
  const preserved = [];
  let pages = 0;
  while (uri) {
    const read = await agent.client.readResource({ uri }, TIMEOUT);
    const text = read.contents[0].text;
    assert(Buffer.byteLength(text) < BOUND, text.length);
    const page = JSON.parse(text);
    pages += 1;
    candidates.push(...page.candidates);
    preserved.push(...page.preserved);
    uri = page.next_uri;
  }
  ok(`the plan's resource read in ${pages} pages`);
  return [candidates, preserved];
}

function cliPlan() {
  const out = execFileSync(
    EXE,
    ["--format", "json", "plan", "--registry", REGISTRY, "--leases", LEASES,
     "--canonical-repository", CANON, "--profiles", PROFILES, "--profile", "controller-prgs"],
    { maxBuffer: 1 << 30 },
  );
  return JSON.parse(out);
}

// Each identity's rows: which list, the verdict, and whether its pid was alive.
function keyed(candidates, preserved) {
  const out = new Map();
  for (const [name, rows] of [["candidates", candidates], ["preserved", preserved]]) {
    for (const r of rows) {
      const key = JSON.stringify(r.worker_identity);
      const verdict = [name, r.reason_code, r.reason_codes ?? null, r.evidence.pid_alive];
      if (!out.has(key)) out.set(key, []);
      out.get(key).push(verdict);
    }
  }
  return out;
}

function sameAsCli(plan, byReason, candidates, preserved) {
  // The tool's pages and the resource are cut from one plan: exactly equal.
  for (const [code, ids] of Object.entries(byReason)) {
    const fromResource = preserved
      .filter((r) => r.reason_code === code)
      .map((r) => JSON.stringify(r.worker_identity));
    assert(JSON.stringify(ids) === JSON.stringify(fromResource), code);
  }
  // The command line plans a moment later. The registry is the same; a
  // generated pid may have started or ended on this machine in between, and
  // only such a row may be judged differently.
  const cli = cliPlan();
  assert(cli.registry_fingerprint === plan.registry_fingerprint, "the registry moved");
  const ours = keyed(candidates, preserved);
  const theirs = keyed(cli.candidates, cli.preserved);
  assert(ours.size === theirs.size && [...ours.keys()].every((k) => theirs.has(k)), "the rows differ");
  const moved = new Set();
  for (const [k, v] of ours) {
    if (JSON.stringify(v) !== JSON.stringify(theirs.get(k))) {
      // A pid started or ended in between, or a heartbeat expired (time
      // only moves forward).
      const alive = (rows) => JSON.stringify(rows.map((x) => x[3]));
      const codes = (rows) => new Set(rows.flatMap((x) => x[2] ?? [x[1]]));
      const expired =
        codes(v).has("heartbeat_not_expired") && !codes(theirs.get(k)).has("heartbeat_not_expired");
      assert(alive(v) !== alive(theirs.get(k)) || expired, k, v, theirs.get(k));
      moved.add(k);
    }
  }
  assert(moved.size <= 20, moved.size);
  if (moved.size === 0) {
    assert(cli.candidate_fingerprint === plan.candidate_fingerprint, "verdicts moved");
  }
  const order = (rows) =>
    JSON.stringify(rows.map((r) => JSON.stringify(r.worker_identity)).filter((k) => !moved.has(k)));
  assert(order(candidates) === order(cli.candidates), "candidates out of order");
  assert(order(preserved) === order(cli.preserved), "preserved out of order");
  const note = moved.size ? ` (${moved.size} row(s) whose pid started or ended in between)` : "";
  ok(`pages and resource add up to \`fleet-retire plan --format json\` exactly${note}`);
}

async function refusals(agent) {
  await agent.refused("plan_stale_worker_retirement", { include: "all" }, "result_too_large");
  const [, page] = await agent.call("plan_stale_worker_retirement", { preserved: { limit: 1 } });
  const cursor = page.next_cursor;
  const edited = cursor.slice(0, -1) + (cursor.endsWith("0") ? "1" : "0");
  await agent.refused("plan_stale_worker_retirement", { preserved: { cursor: edited } }, "invalid_cursor");
  await agent.refused(
    "plan_stale_worker_retirement",
    { preserved: { reason_code: "nope" } },
    "unknown_reason_code",
  );
  await agent.refused("plan_stale_worker_retirement", { profile: "x" }, "invalid_arguments");
  ok("include all over 1 MiB, an edited cursor, an unknown reason code and argument refused");
}

async function explain(agent, plan, byReason) {
  const [code, ids] = Object.entries(byReason)[0];
  const worker = JSON.parse(ids[0]);
  let [isError, body, content] = await agent.call("explain_worker_retirement", { worker_identity: worker });
  assert(!isError, content);
  const first = body.explanations[0];
  assert(first.decision === "keep" && first.reason_code === code, first.decision, first.reason_code);
  const candidate = plan.candidate_worker_identities[0];
  [isError, body, content] = await agent.call("explain_worker_retirement", { worker_identity: candidate });
  assert(!isError && body.explanations[0].decision === "retire", content);
  await agent.refused("explain_worker_retirement", { worker_identity: "w-nobody" }, "unknown_worker");
  ok("explain: a preserved row keeps its reason, a candidate is retired, an unknown worker refused");
}

async function apply(agent, plan) {
  const tokens = {
    registry_fingerprint: plan.registry_fingerprint,
    candidate_fingerprint: plan.candidate_fingerprint,
    policy_fingerprint: plan.policy_fingerprint,
  };
  const workers = plan.candidate_worker_identities;
  let [isError, body, content] = await agent.call("apply_stale_worker_retirement", {
    ...tokens,
    worker_identities: workers,
  });
  assert(!isError && body.outcome === "applied", content);
  assert(body.retired_count === workers.length, body.retired_count);
  const size = Buffer.byteLength(JSON.stringify(body));
  assert(size < 64 * 1024, `an apply result sized for an agent: ${size}`);
  [isError, body, content] = await agent.call("apply_stale_worker_retirement", {
    ...tokens,
    worker_identities: workers,
  });
  assert(!isError && body.outcome === "already_retired", content);
  const [, fresh] = await agent.call("plan_stale_worker_retirement", {});
  const others = fresh.candidate_worker_identities.slice(0, 1);
  if (others.length) {
    [isError, body, content] = await agent.call("apply_stale_worker_retirement", {
      ...tokens,
      worker_identities: others,
    });
    // The old plan's tokens retire a further batch of that plan (the
    // worker was its candidate, beyond the first batch; the first batch is
    // recognised as retired_since_plan), never a worker outside it: that
    // one is refused when the set moved otherwise, or kept
    // not_in_current_plan when only time moved it (semantics section 13).
    const moved = ["registry_revision_moved", "candidate_set_moved"];
    // (a tool result shows the first 20 of retired_since_plan and counts the rest)
    const since = body.retired_since_plan ?? [];
    const batch =
      !isError &&
      body.retired_count === 1 &&
      since.every((w) => workers.includes(w)) &&
      since.length + (body.retired_since_plan_not_shown ?? 0) === workers.length;
    const kept =
      !isError &&
      body.retired_count === 0 &&
      body.preserved.some((p) => p.worker_identity === others[0] && p.reason_code === "not_in_current_plan");
    const refused = isError && moved.includes(body.reason_code);
    assert(batch || kept || refused, body.reason_code, content);
  }
  ok(`apply retired ${workers.length} with the plan's tokens; replay already_retired; old tokens: a further batch of the plan only`);
}

async function snapshot(agent) {
  const [isError, snap, content] = await agent.call("snapshot_instance_fleet", {});
  assert(!isError, content);
  const classes = Object.entries(snap.finding_classes);
  assert(classes.length > 0, snap);
  const [name, entry] = classes.reduce((a, b) => (b[1].count > a[1].count ? b : a));
  assert(entry.members.length <= 5);
  const [pageError, page, pageContent] = await agent.call("snapshot_instance_fleet", {
    page: { list: "findings", classification: name, limit: 50 },
  });
  assert(!pageError, pageContent);
  assert(page.page.every((f) => f.classification === name), name);
  ok(`snapshot: ${classes.length} finding classes; a page of ${name}`);
}

async function main() {
  const started = performance.now();
  const transport = new StdioClientTransport({
    command: EXE,
    args: ["serve"],
    env: {
      PATH: process.env.PATH ?? "",
      FLEET_RETIRE_REGISTRY: REGISTRY,
      FLEET_RETIRE_LEASES: LEASES,
      GITEA_MCP_CONFIG: PROFILES,
      GITEA_MCP_PROFILE: "controller-prgs",
      GITEA_MCP_NAMESPACE: "controller",
      FLEET_RETIRE_CANONICAL_REPOSITORY: CANON,
      // A long TTL: the server's own heartbeat must not move the registry
      // token between its plan and the command line's.
      FLEET_RETIRE_HEARTBEAT_TTL: "900",
    },
    stderr: "inherit",
  });
  const client = new Client({ name: "fleet-retire-agent-test", version: "1.0.0" });
  await client.connect(transport);
  try {
    const agent = new Agent(client);
    await tools(agent);
    const plan = await planSummary(agent);
    const byReason = await pagePreserved(agent, plan);
    const [candidates, preserved] = await readResource(agent, plan);
    sameAsCli(plan, byReason, candidates, preserved);
    await refusals(agent);
    await explain(agent, plan, byReason);
    await apply(agent, plan);
    await snapshot(agent);
  } finally {
    await client.close();
  }
  const spent = Object.entries(timings)
    .sort()
    .map(([k, v]) => `${k} ${v.toFixed(2)}s`)
    .join(", ");
  console.log(`timings: ${spent}; whole script ${((performance.now() - started) / 1000).toFixed(1)}s`);
  console.log("all checks passed");
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});

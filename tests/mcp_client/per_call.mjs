// A client that starts a server for every call, through the official
// TypeScript MCP SDK: the same checks as per_call.py (read its docstring),
// in the same order.
//
//     node per_call.mjs EXE DIR

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { execFileSync } from "node:child_process";
import path from "node:path";

const [EXE, DIR] = process.argv.slice(2);
const REGISTRY = path.join(DIR, "registry.sqlite");
let calls = 0;

function ok(what) {
  console.log(`ok: ${what}`);
}

function assert(cond, what) {
  if (!cond) {
    throw new Error(`check failed: ${typeof what === "string" ? what : JSON.stringify(what)}`);
  }
}

/** One call, by a server of its own. */
async function call(tool, args) {
  calls += 1;
  const transport = new StdioClientTransport({
    command: EXE,
    args: ["serve"],
    env: {
      PATH: process.env.PATH ?? "",
      FLEET_RETIRE_REGISTRY: REGISTRY,
      FLEET_RETIRE_LEASES: path.join(DIR, "leases.sqlite"),
      GITEA_MCP_CONFIG: path.join(DIR, "profiles.json"),
      GITEA_MCP_PROFILE: "controller-prgs",
      GITEA_MCP_NAMESPACE: "controller",
      GITEA_MCP_WORKER_IDENTITY: `per-call-server-js-${calls}`,
      FLEET_RETIRE_CANONICAL_REPOSITORY: "prgs/gitea-tools",
      FLEET_RETIRE_PLAN_DIR: path.join(DIR, "plans"),
    },
    stderr: "inherit",
  });
  const client = new Client({ name: "fleet-retire-per-call-test", version: "1.0.0" });
  await client.connect(transport);
  try {
    const result = await client.callTool({ name: tool, arguments: args });
    return [Boolean(result.isError), result.structuredContent ?? {}];
  } finally {
    await client.close();
  }
}

/** Retired rows and audit rows, read with the sqlite3 shell's twin: python. */
function counts() {
  const script =
    "import sqlite3,sys;d=sqlite3.connect(sys.argv[1]);" +
    "r=d.execute(\"SELECT count(*) FROM worker_registrations WHERE status='retired'\").fetchone()[0];" +
    "t=d.execute(\"SELECT count(*) FROM sqlite_master WHERE name='retirement_audit'\").fetchone()[0];" +
    "a=t and d.execute('SELECT count(*) FROM retirement_audit').fetchone()[0];print(r,a)";
  const out = execFileSync("python3", ["-c", script, REGISTRY]).toString().trim();
  return out.split(" ").map(Number);
}

async function pageByOffset(plan) {
  let pages = 0;
  for (const code of Object.keys(plan.preserved_reason_counts)) {
    const seen = new Set();
    let offset = 0;
    for (;;) {
      const ask = { reason_code: code, limit: 1000, offset };
      const [isError, page] = await call("plan_stale_worker_retirement", {
        preserved: ask,
        scope: "registry",
      });
      assert(!isError, page);
      pages += 1;
      const rows = page.preserved;
      assert(rows.every((r) => r.reason_code === code), code);
      for (const r of rows) {
        const name = JSON.stringify(r.worker_identity);
        assert(!seen.has(name), `${code}: ${name} on two pages`);
        seen.add(name);
      }
      const total = page.preserved_reason_counts[code] ?? 0;
      assert(offset + rows.length + page.preserved_not_shown === total, `${code} at ${offset}`);
      if (page.next_offset === undefined) {
        assert(page.next_cursor === undefined, "a last page has no cursor");
        break;
      }
      assert(page.next_offset === offset + rows.length, page.next_offset);
      offset = page.next_offset;
    }
  }
  return pages;
}

async function main() {
  const [retiredBefore, auditedBefore] = counts();
  // The whole registry: a host-scoped plan (the default) is moved by the
  // next server's own registration, a row of this host added since.
  const [isError, plan] = await call("plan_stale_worker_retirement", { scope: "registry" });
  assert(!isError, plan);
  assert(plan.scope.kind === "registry", plan.scope);
  assert(plan.candidate_count >= 10, plan.candidate_count);
  ok(`plan: ${plan.assessed_count} rows, ${plan.candidate_count} candidates`);
  const pages = await pageByOffset(plan);
  ok(`preserved rows paged to the end by offset: ${pages} pages, one server each`);
  const tokens = {
    registry_fingerprint: plan.registry_fingerprint,
    candidate_fingerprint: plan.candidate_fingerprint,
    policy_fingerprint: plan.policy_fingerprint,
  };
  const [firstError, first] = await call("apply_stale_worker_retirement", { ...tokens, first: 5 });
  assert(!firstError && first.outcome === "applied", first);
  assert(first.retired_count === 5 && first.first === 5 && first.requested.length === 5, first);
  const beside =
    first.rows_changed_since_plan.length + (first.rows_changed_since_plan_not_shown ?? 0);
  assert(beside >= calls - 1, first.rows_changed_since_plan);
  assert(
    first.rows_changed_since_plan.every((w) => w.startsWith("per-call-server-js-")),
    first.rows_changed_since_plan,
  );
  ok(`apply of the first 5 by a new server: applied, ${beside} servers' rows beside`);
  const [secondError, second] = await call("apply_stale_worker_retirement", { ...tokens, first: 5 });
  assert(!secondError && second.outcome === "applied" && second.retired_count === 5, second);
  const done = first.retired.map((r) => r.worker_identity).sort();
  assert(JSON.stringify([...second.retired_since_plan].sort()) === JSON.stringify(done), second);
  assert(second.retired.every((r) => !done.includes(r.worker_identity)), second);
  ok("the next 5 by another: the first batch recognised, 5 more retired");
  const [retired, audited] = counts();
  assert(retired - retiredBefore === 10 && audited - auditedBefore === 10, [retired, audited]);
  ok("the registry holds exactly those 10 retired, each audited");
  console.log("all checks passed");
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});

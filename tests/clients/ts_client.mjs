// The official TypeScript MCP SDK (npm `@modelcontextprotocol/sdk`) against the gateway: its
// Client over StreamableHTTPClientTransport (the 2025-11-25 handshake era, with a session and
// its GET stream).
//
// Run by tests/tests/clients.rs with the gateway's URL, from the directory where the SDK is
// installed; the gateway fronts projects alpha, beta and gamma (default alpha), whose sleds
// take about 300 ms per call. Prints one line per check and a closing "N passed, N failed"
// line; exits non-zero on any failure.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ToolListChangedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";
import { attempt, check, run } from "./harness.mjs";

const URL_ = new URL(process.argv[2]);

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function main() {
  const client = new Client({ name: "gateway-ts-check", version: "0" }, { capabilities: {} });
  let listChanged = 0;
  client.setNotificationHandler(ToolListChangedNotificationSchema, () => {
    listChanged += 1;
  });
  const transport = new StreamableHTTPClientTransport(URL_);
  await client.connect(transport);
  check("initialize gives a session", typeof transport.sessionId === "string" && transport.sessionId.length > 0, transport.sessionId);
  check("negotiates 2025-11-25", transport.protocolVersion === "2025-11-25", transport.protocolVersion);

  await attempt("tools/list", async () => {
    const { tools } = await client.listTools();
    const names = tools.map((t) => t.name);
    check("tools/list: gateway tools first", names[0] === "switch_project" && names[1] === "list_projects", names);
    const show = tools.find((t) => t.name === "show");
    check("project tools carry the injected `project`", show?.inputSchema?.properties?.project !== undefined, show);
  });

  await attempt("calls", async () => {
    let r = await client.callTool({ name: "whoami", arguments: {} });
    check("without `project`: the session's default", r.structuredContent?.project === "alpha", r);
    r = await client.callTool({ name: "whoami", arguments: { project: "beta" } });
    check("with `project`: that project", r.structuredContent?.project === "beta", r);
    r = await client.callTool({
      name: "create_story",
      arguments: { name: "from typescript", acceptance_criteria: ["it works"], project: "gamma" },
    });
    check("a write on a named project", r.structuredContent?.story?.id?.startsWith("gamma-"), r);
    try {
      await client.callTool({ name: "show", arguments: { story_id: "x", project: "zeta" } });
      check("unknown project is a -32602 error", false, "no error");
    } catch (e) {
      check("unknown project is a -32602 error", e?.code === -32602 && String(e.message).includes("zeta"), String(e));
    }
  });

  await attempt("switch and list_changed", async () => {
    const r = await client.callTool({ name: "switch_project", arguments: { project: "beta" } });
    check("switch_project answers for this session", r.structuredContent?.scope === "session", r);
    for (let i = 0; i < 100 && listChanged === 0; i++) await sleep(50);
    check("receives notifications/tools/list_changed on the GET stream", listChanged > 0, listChanged);
    const w = await client.callTool({ name: "whoami", arguments: {} });
    check("the new default holds", w.structuredContent?.project === "beta", w);
  });

  await attempt("cancel", async () => {
    // Abort a slow write: the SDK sends notifications/cancelled; the sled never applies it.
    const name = "cancelled from typescript";
    const controller = new AbortController();
    setTimeout(() => controller.abort("changed my mind"), 100);
    let aborted = false;
    try {
      await client.callTool(
        { name: "create_story", arguments: { name, acceptance_criteria: [], project: "alpha" } },
        undefined,
        { signal: controller.signal },
      );
    } catch (e) {
      aborted = controller.signal.aborted;
    }
    check("the call was cancelled client-side", aborted);
    await sleep(600);
    const r = await client.callTool({ name: "list_stories", arguments: { project: "alpha" } });
    const names = (r.structuredContent?.stories ?? []).map((s) => s.name);
    check("the cancelled write was not applied", !names.includes(name), names);
  });

  await transport.terminateSession();
  await client.close();
}

await run(main);

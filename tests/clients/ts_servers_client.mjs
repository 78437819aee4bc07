// The official TypeScript MCP SDK (npm `@modelcontextprotocol/sdk`) against a gateway with four
// projects, each a real MCP server behind gateway-sled: `files` (server-filesystem), `time`
// (PyPI's mcp-server-time), `memory` (server-memory) and `everything` (server-everything).
// One session in the 2025-11-25 handshake era, which never switches projects: every call names
// its project in its own `project` argument.
//
// Run by tests/tests/connector_servers.rs, from the directory where the SDK is installed, with
// the gateway's MCP URL, the path of the file the test wrote in `files`' directory and that
// file's content. Prints one line per check and a closing "N passed, N failed" line; exits
// non-zero on any failure.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { McpError } from "@modelcontextprotocol/sdk/types.js";
import { attempt, check, run } from "./harness.mjs";

const URL_ = new URL(process.argv[2]);
const FILE = process.argv[3];
const CONTENT = process.argv[4];

const text = (r) => r?.content?.map((c) => c.text ?? "").join("\n") ?? "";

// Every request is bounded: the test gives the whole script 120 s.
const OPTIONS = { timeout: 30_000 };
const call = (project, name, args) =>
  client.callTool({ name, arguments: { ...args, project } }, undefined, OPTIONS);

const client = new Client({ name: "gateway-ts-servers-check", version: "0" }, { capabilities: {} });

async function main() {
  if (FILE === undefined || CONTENT === undefined) throw new Error("usage: URL FILE CONTENT");
  const transport = new StreamableHTTPClientTransport(URL_);
  await client.connect(transport, OPTIONS);

  await attempt("files", async () => {
    const r = await call("files", "read_text_file", { path: FILE });
    check("files: read_text_file gives the test's file", text(r) === CONTENT && !r.isError, r);
  });

  await attempt("time", async () => {
    const r = await call("time", "get_current_time", { timezone: "UTC" });
    const told = Date.parse(r.structuredContent?.datetime ?? "");
    check("time: get_current_time in UTC", r.structuredContent?.timezone === "UTC" && !r.isError, r);
    check("time: and it is now", Math.abs(told - Date.now()) < 300_000, r);
  });

  await attempt("memory", async () => {
    const created = await call("memory", "create_entities", {
      entities: [{ name: "typescript-sdk", entityType: "client", observations: ["created by the TypeScript SDK"] }],
    });
    check("memory: create_entities", text(created).includes("typescript-sdk") && !created.isError, created);
    const opened = await call("memory", "open_nodes", { names: ["typescript-sdk"] });
    check("memory: open_nodes reads it back", text(opened).includes("created by the TypeScript SDK"), opened);
  });

  await attempt("everything", async () => {
    const r = await call("everything", "echo", { message: "from typescript" });
    check("everything: echo", text(r) === "Echo: from typescript", r);
  });

  await attempt("unknown project", async () => {
    try {
      const r = await call("nowhere", "echo", { message: "x" });
      check("a call naming an unknown project fails", false, r);
    } catch (e) {
      check(
        "a call naming an unknown project fails: -32602 unknown_project",
        e instanceof McpError && e.code === -32602 && e.data?.kind === "unknown_project" && e.data?.project === "nowhere",
        { code: e?.code, message: e?.message, data: e?.data },
      );
    }
  });

  await attempt("still files", async () => {
    const r = await client.callTool({ name: "list_projects", arguments: {} }, undefined, OPTIONS);
    check("nothing switched the session: its default is still files", r.structuredContent?.active === "files", r);
  });

  await transport.terminateSession();
  await client.close();
}

await run(main);

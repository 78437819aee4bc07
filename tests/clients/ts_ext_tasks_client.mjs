// The official client of the 2026-07-28 tasks extension (npm `@modelcontextprotocol/ext-tasks`
// 0.2.2, over `@modelcontextprotocol/client` 2.3.1 pinned to 2026-07-28) against the gateway:
// token A calls `run_tests` on beta, which the gateway makes a task, and settles it to its
// result; starts a second and cancels it (it settles cancelled and stays so); token B, with a
// client and a task session of its own, is told -32602 for A's tasks.
//
// As the package's README asks of a 2026-07-28 server, the session gets a `rawDispatch` (the SDK's
// own codecs do not carry the extension's `tools/call` and `tasks/*`): it POSTs the JSON-RPC body
// the package framed to the gateway with `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` (the
// tool's name, or the task id for `tasks/*`), as the 2026-07-28 Streamable HTTP transport does.
//
// Run by tests/tests/tasks.rs as `node ts_ext_tasks_client.mjs URL TOKEN_A TOKEN_B`, from the
// directory where the packages are installed; beta's `run_tests` takes about 3 s. Prints one line
// per check and a closing "N passed, N failed" line; exits non-zero on any failure.

import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { createTaskSessionFromClient, JsonRpcResponseError } from "@modelcontextprotocol/ext-tasks/client";
import { attempt, check, run } from "./harness.mjs";

const [url, tokenA, tokenB] = process.argv.slice(2);
const VERSION = "2026-07-28";
const EXTENSION = "io.modelcontextprotocol/tasks";
const CLIENT_INFO = { name: "gateway-ts-ext-tasks", version: "0" };

// The JSON-RPC response for `id` in a `text/event-stream` body.
function fromSse(text, id) {
  for (const event of text.split(/\r?\n\r?\n/)) {
    const data = event
      .split(/\r?\n/)
      .filter((l) => l.startsWith("data:"))
      .map((l) => l.slice(5).trimStart())
      .join("\n");
    if (data === "") continue;
    const m = JSON.parse(data);
    if (m.id === id && ("result" in m || "error" in m)) return m;
  }
  throw new Error(`no response to ${id} in the event stream: ${text}`);
}

// Every `tools/call` and `tasks/*` the session sends (a `{method, params}` the package framed):
// made a JSON-RPC request of the dispatcher's own id and POSTed as the 2026-07-28 transport would;
// the response's result or error (an error comes with an HTTP error status; the body is read
// either way).
let ids = 0;
function rawDispatch(token, methods) {
  return async (framed, options) => {
    const request = { jsonrpc: "2.0", id: `ext-${++ids}`, ...framed };
    const name = request.method === "tools/call" ? request.params?.name : request.params?.taskId;
    methods.push(request.method);
    // The package's own headers first (for `tasks/*` it sets `Mcp-Name` itself); `Headers`
    // matches names case-insensitively, so the ones set here replace rather than repeat them.
    const headers = new Headers(options?.context?.headers ?? {});
    headers.set("authorization", `Bearer ${token}`);
    headers.set("content-type", "application/json");
    headers.set("accept", "application/json, text/event-stream");
    headers.set("mcp-protocol-version", VERSION);
    headers.set("mcp-method", request.method);
    if (typeof name === "string") headers.set("mcp-name", name);
    const r = await fetch(url, { method: "POST", headers, body: JSON.stringify(request), signal: options?.signal });
    const text = await r.text();
    const m = (r.headers.get("content-type") ?? "").startsWith("text/event-stream") ? fromSse(text, request.id) : JSON.parse(text);
    return "error" in m ? { kind: "error", error: m.error } : { kind: "result", result: m.result };
  };
}

// A client pinned to 2026-07-28 presenting `token` and declaring the extension (the gateway
// offers it in `server/discover` only to a client that declares it), and a task session over it.
const CAPABILITIES = { extensions: { [EXTENSION]: {} } };

async function connect(token, endpointId) {
  const client = new Client(CLIENT_INFO, { capabilities: CAPABILITIES, versionNegotiation: { mode: { pin: VERSION } } });
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  await client.connect(transport);
  const methods = [];
  const session = createTaskSessionFromClient(client, {
    endpointId,
    rawDispatch: rawDispatch(token, methods),
    v2RequestFraming: { protocolVersion: VERSION, clientInfo: CLIENT_INFO, clientCapabilities: CAPABILITIES },
  });
  return { client, session, methods };
}

// What a call that must be refused was refused with: the gateway's JSON-RPC error as
// "CODE KIND" (its code and `data.kind`), or what happened instead.
async function refusal(f) {
  try {
    const r = await f();
    return `resolved: ${JSON.stringify(r)}`;
  } catch (e) {
    return e instanceof JsonRpcResponseError ? `${e.code} ${e.data?.kind}` : `threw: ${String(e?.stack ?? e)}`;
  }
}
const UNKNOWN = "-32602 unknown_task";

const BETA = { project: "beta" };

async function main() {
  const a = await connect(tokenA, "gateway-token-a");
  check("the client speaks 2026-07-28", a.client.getProtocolEra() === "modern", a.client.getProtocolEra());
  check("the gateway declares the tasks extension", a.client.getServerCapabilities()?.extensions?.[EXTENSION] !== undefined, a.client.getServerCapabilities());
  check("the session runs the extension's tasks (v2)", a.session.capabilities.execution === true && a.session.capabilities.cancellation === true, a.session.capabilities);
  let first;
  let second;

  await attempt("callTool and settle", async () => {
    const execution = await a.session.callTool("run_tests", BETA);
    check("callTool: a task", execution.kind === "task", execution.kind);
    first = execution.handle?.taskId;
    check("the task id is the gateway's", typeof first === "string" && first.startsWith("mt1."), first);
    const { outcome } = await execution.settle();
    check("settle: completed", outcome.status === "completed", outcome);
    check("settle: the result names beta", outcome.result?.structuredContent?.project === "beta", outcome.result);
    check("the session sent the extension's tools/call and tasks/get", a.methods.includes("tools/call") && a.methods.includes("tasks/get"), a.methods);
  });

  await attempt("a task's snapshot", async () => {
    const t = await a.session.task(first).snapshot();
    check("tasks/get: the first is completed", t.taskId === first && t.status === "completed", t);
  });

  await attempt("cancel", async () => {
    const execution = await a.session.callTool("run_tests", BETA);
    second = execution.handle?.taskId;
    check("the second is a task of its own", execution.kind === "task" && second?.startsWith("mt1.") && second !== first, second);
    await execution.cancel();
    const { outcome } = await execution.settle();
    check("settle after cancel: cancelled", outcome.status === "cancelled", outcome);
    check("the session sent tasks/cancel", a.methods.includes("tasks/cancel"), a.methods);
    const t = await a.session.task(second).snapshot();
    check("tasks/get after cancel: cancelled", t.status === "cancelled", t);
  });

  await attempt("another token", async () => {
    const b = await connect(tokenB, "gateway-token-b");
    for (const id of [first, second]) {
      const get = await refusal(() => b.session.task(id).snapshot());
      check("token B: tasks/get is -32602 unknown_task", get === UNKNOWN, get);
      const cancel = await refusal(() => b.session.task(id).cancel());
      check("token B: tasks/cancel is -32602 unknown_task", cancel === UNKNOWN, cancel);
    }
    await b.session.close();
    await b.client.close();
  });

  await attempt("still cancelled", async () => {
    // A third task as long as the second, made after it and settled: by then the second would
    // have completed, had it not been cancelled.
    const execution = await a.session.callTool("run_tests", BETA);
    const { outcome } = await execution.settle();
    check("a third task completes", execution.kind === "task" && outcome.status === "completed", outcome);
    const t = await a.session.task(second).snapshot();
    check("the cancelled task never completes", t.status === "cancelled", t);
    const f = await a.session.task(first).snapshot();
    check("token B's refusals left the first alone", f.status === "completed", f);
  });

  await a.session.close();
  await a.client.close();
}

await run(main);

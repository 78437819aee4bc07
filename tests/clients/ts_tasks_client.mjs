// The official TypeScript MCP SDK (npm `@modelcontextprotocol/sdk` 1.32.2) and its experimental
// tasks client (`client.experimental.tasks`, 2025-11-25) against the gateway: token A starts
// `run_tests` on beta as a task and follows it to its result, lists its tasks, gets one, gets
// its result, and cancels a second; token B, in a session of its own, sees none of them.
//
// Run by tests/tests/tasks.rs as `node ts_tasks_client.mjs URL TOKEN_A TOKEN_B`, from the
// directory where the SDK is installed; beta's `run_tests` takes about 3 s. Prints one line per
// check and a closing "N passed, N failed" line; exits non-zero on any failure.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { CallToolResultSchema } from "@modelcontextprotocol/sdk/types.js";
import { attempt, check, run } from "./harness.mjs";

const [url, tokenA, tokenB] = process.argv.slice(2);

async function connect(token) {
  const client = new Client({ name: "gateway-ts-tasks", version: "0" }, { capabilities: {} });
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  await client.connect(transport);
  return client;
}

const RUN_TESTS = { name: "run_tests", arguments: { project: "beta", suite: "unit" } };
const TASK = { task: { ttl: 60000 } };

// What an SDK call that must be refused was refused with: its JSON-RPC code, or "resolved".
async function refusal(f) {
  try {
    const r = await f();
    return `resolved: ${JSON.stringify(r)}`;
  } catch (e) {
    return e?.code;
  }
}

async function main() {
  const a = await connect(tokenA);
  check("the gateway declares tasks for tools/call", a.getServerCapabilities()?.tasks?.requests?.tools?.call !== undefined, a.getServerCapabilities());
  const tasks = a.experimental.tasks;
  let first;
  let second;

  await attempt("callToolStream", async () => {
    // Created, polled by the SDK until done, then its result: all through the gateway.
    const seen = [];
    let progress = 0;
    for await (const m of tasks.callToolStream(RUN_TESTS, undefined, { ...TASK, onprogress: () => (progress += 1) })) {
      seen.push(m.type);
      if (m.type === "taskCreated") first = m.task.taskId;
      if (m.type === "result") {
        check("callToolStream: the result names beta", m.result.structuredContent?.project === "beta", m.result);
      }
      if (m.type === "error") check("callToolStream: no error", false, String(m.error));
    }
    check("callToolStream: taskCreated first, result last", seen[0] === "taskCreated" && seen.at(-1) === "result", seen);
    check("the task id is the gateway's", typeof first === "string" && first.startsWith("mt1."), first);
    // The sled reports each of its 4 steps after the CreateTaskResult: on the session's GET
    // stream, under the SDK's own progress token.
    check("onprogress hears the task's progress", progress >= 1, progress);
  });

  await attempt("getTask", async () => {
    const t = await tasks.getTask(first);
    check("getTask: completed", t.taskId === first && t.status === "completed", t);
  });

  await attempt("getTaskResult", async () => {
    const r = await tasks.getTaskResult(first, CallToolResultSchema);
    check("getTaskResult: names beta", r.structuredContent?.project === "beta" && r.structuredContent?.suite === "unit", r);
  });

  await attempt("cancelTask", async () => {
    // A second task, left after its creation and cancelled while it runs.
    for await (const m of tasks.callToolStream(RUN_TESTS, undefined, TASK)) {
      if (m.type === "taskCreated") {
        second = m.task.taskId;
        break;
      }
    }
    const c = await tasks.cancelTask(second);
    check("cancelTask: cancelled", c.taskId === second && c.status === "cancelled", c);
    const t = await tasks.getTask(second);
    check("getTask after cancelTask: cancelled", t.status === "cancelled", t);
  });

  await attempt("listTasks", async () => {
    const { tasks: listed } = await tasks.listTasks();
    const ids = listed.map((t) => t.taskId).sort();
    check("listTasks: both, and only them", JSON.stringify(ids) === JSON.stringify([first, second].sort()), listed);
  });

  await attempt("another token", async () => {
    const b = await connect(tokenB);
    const other = b.experimental.tasks;
    for (const id of [first, second]) {
      check("token B: getTask is -32602", (await refusal(() => other.getTask(id))) === -32602);
      check("token B: getTaskResult is -32602", (await refusal(() => other.getTaskResult(id, CallToolResultSchema))) === -32602);
      check("token B: cancelTask is -32602", (await refusal(() => other.cancelTask(id))) === -32602);
    }
    const { tasks: listed } = await other.listTasks();
    check("token B: listTasks is empty", listed.length === 0, listed);
    await b.close();
  });

  await attempt("still cancelled", async () => {
    // A third task as long as the second, made after it and followed to its end: by then the
    // second would have completed, had it not been cancelled.
    let done = false;
    for await (const m of tasks.callToolStream(RUN_TESTS, undefined, TASK)) done ||= m.type === "result";
    check("a third task completes", done);
    const t = await tasks.getTask(second);
    check("the cancelled task never completes", t.status === "cancelled", t);
  });

  await a.close();
}

await run(main);

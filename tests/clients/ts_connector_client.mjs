// The official TypeScript MCP SDK (npm `@modelcontextprotocol/sdk`) against the gateway, whose
// default project `everything` is npm's server-everything behind gateway-sled (the connector).
// The 2025-11-25 handshake era, with a session and its GET stream; the client declares sampling
// and elicitation and answers both.
//
// Run by tests/tests/connector.rs with the gateway's URL and "stdio" or "http" (how the
// connector reaches the server), from the directory where the SDK is installed. Prints one line per check and a closing "N passed, N failed" line; exits non-zero
// on any failure.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import {
  CreateMessageRequestSchema,
  ElicitRequestSchema,
  ResourceUpdatedNotificationSchema,
} from "@modelcontextprotocol/sdk/types.js";
import { attempt, check, run } from "./harness.mjs";

const URL_ = new URL(process.argv[2]);
// How the connector reaches server-everything: "stdio" or "http" (where the server sends
// resources/updated on the session's own GET stream, which the connector reads).
const UPSTREAM = process.argv[3] ?? "stdio";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

const text = (r) => r?.content?.map((c) => c.text ?? "").join("\n") ?? "";

async function main() {
  const client = new Client(
    { name: "gateway-ts-connector-check", version: "0" },
    { capabilities: { sampling: {}, elicitation: {} } },
  );
  const sampled = [];
  client.setRequestHandler(CreateMessageRequestSchema, async (request) => {
    sampled.push(request.params.messages[0].content.text);
    return { role: "assistant", model: "ts-test", content: { type: "text", text: "sampled by typescript" } };
  });
  client.setRequestHandler(ElicitRequestSchema, async () => ({ action: "decline" }));
  const transport = new StreamableHTTPClientTransport(URL_);
  await client.connect(transport);

  await attempt("tools/list", async () => {
    const { tools } = await client.listTools();
    const names = tools.map((t) => t.name);
    check("tools/list: the gateway's tools, then server-everything's", names[0] === "switch_project" && names.includes("get-sum"), names);
    const echo = tools.find((t) => t.name === "echo");
    check("its tools carry the injected `project`", echo?.inputSchema?.properties?.project?.type === "string", echo);
  });

  await attempt("calls", async () => {
    const r = await client.callTool({ name: "get-sum", arguments: { a: 2, b: 3 } });
    check("a call on the default project", text(r) === "The sum of 2 and 3 is 5.", r);
    const named = await client.callTool({ name: "echo", arguments: { message: "named", project: "everything" } });
    check("a call naming its project", text(named) === "Echo: named", named);
  });

  await attempt("progress", async () => {
    const progress = [];
    const r = await client.callTool(
      { name: "trigger-long-running-operation", arguments: { duration: 1, steps: 2 } },
      undefined,
      { onprogress: (p) => progress.push(p.progress) },
    );
    check("the long operation completes", text(r).startsWith("Long running operation completed"), r);
    check("its progress reaches the caller", JSON.stringify(progress) === "[1,2]", progress);
  });

  await attempt("sampling", async () => {
    const r = await client.callTool({ name: "trigger-sampling-request", arguments: { prompt: "hi", maxTokens: 5 } });
    check("the server's sampling request is answered by this client", text(r).includes("sampled by typescript"), r);
    check("with the server's prompt", sampled.some((s) => s.includes("hi")), sampled);
  });

  await attempt("elicitation", async () => {
    const r = await client.callTool({ name: "trigger-elicitation-request", arguments: {} });
    check("the server's elicitation is answered by this client", text(r).includes("declined"), r);
  });

  await attempt("prompts, completion, resources", async () => {
    const p = await client.getPrompt({ name: "args-prompt", arguments: { city: "Paris" } });
    check("prompts/get with arguments", p.messages[0]?.content?.text === "What's weather in Paris?", p);
    const c = await client.complete({
      ref: { type: "ref/prompt", name: "completable-prompt" },
      argument: { name: "department", value: "E" },
    });
    check("completion/complete", JSON.stringify(c.completion.values) === '["Engineering"]', c);
    const { resources } = await client.listResources();
    const read = await client.readResource({ uri: resources[0].uri });
    check("resources/read", typeof read.contents[0]?.text === "string", read);
    const { resourceTemplates } = await client.listResourceTemplates();
    check("resources/templates/list", resourceTemplates.length > 0, resourceTemplates);
  });

  await attempt(`subscriptions (${UPSTREAM})`, async () => {
    // server-everything sends resources/updated for each subscribed resource every 5 s while
    // its subscriber updates are on.
    const updated = [];
    client.setNotificationHandler(ResourceUpdatedNotificationSchema, (n) => updated.push(n.params.uri));
    const { resources } = await client.listResources();
    const uri = resources[0].uri;
    await client.subscribeResource({ uri });
    await client.callTool({ name: "toggle-subscriber-updates", arguments: {} });
    for (let i = 0; i < 160 && updated.length === 0; i++) await sleep(50);
    await client.callTool({ name: "toggle-subscriber-updates", arguments: {} });
    check("resources/updated of a subscribed resource reaches the client", updated.includes(uri), updated);
  });

  await attempt("cancel", async () => {
    const controller = new AbortController();
    setTimeout(() => controller.abort("changed my mind"), 300);
    let aborted = false;
    try {
      await client.callTool(
        { name: "trigger-long-running-operation", arguments: { duration: 10, steps: 2 } },
        undefined,
        { signal: controller.signal },
      );
    } catch (e) {
      aborted = controller.signal.aborted;
    }
    check("the long call was cancelled client-side", aborted);
  });

  await transport.terminateSession();
  await client.close();
}

await run(main);

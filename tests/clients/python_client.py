"""The official Python MCP SDK (PyPI `mcp`) against the gateway: the handshake era
(mode "legacy"), the stateless era (modes "auto", which finds it by server/discover, and
"2026-07-28"), and a client of each era working side by side.

Run by tests/tests/clients.rs with the gateway's URL; the gateway fronts projects alpha, beta
and gamma (default alpha), whose sleds take about 300 ms per call, and delta, served by the
conformance fixture. Prints one line per check
and a closing "N passed, N failed" line; exits non-zero on any failure.
"""

import sys

import anyio
from mcp import Client
from mcp import types

URL = sys.argv[1]
results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail and not ok else ""))


async def session(mode):
    notes = []

    async def on_message(message):
        notes.append(message)

    async with Client(URL, mode=mode, message_handler=on_message) as c:
        check(f"[{mode}] negotiates a handshake-era version", c.protocol_version == "2025-11-25", c.protocol_version)
        tools = (await c.list_tools()).tools
        names = [t.name for t in tools]
        check(f"[{mode}] tools/list: gateway tools first", names[:2] == ["switch_project", "list_projects"], names)
        show = next((t for t in tools if t.name == "show"), None)
        check(f"[{mode}] project tools carry the injected `project`",
              show is not None and "project" in show.input_schema["properties"], show)

        r = await c.call_tool("whoami", {})
        check(f"[{mode}] without `project`: the session's default", r.structured_content["project"] == "alpha", r)
        r = await c.call_tool("whoami", {"project": "beta"})
        check(f"[{mode}] with `project`: that project", r.structured_content["project"] == "beta", r)
        r = await c.call_tool("create_story", {"name": f"from python {mode}", "acceptance_criteria": ["it works"], "project": "gamma"})
        story = r.structured_content["story"]
        check(f"[{mode}] a write on a named project", story["id"].startswith("gamma-"), r)

        r = await c.call_tool("switch_project", {"project": "beta"})
        check(f"[{mode}] switch_project answers for this session", r.structured_content["scope"] == "session", r)
        with anyio.move_on_after(5):
            while not any(getattr(n, "method", "") == "notifications/tools/list_changed" for n in notes):
                await anyio.sleep(0.05)
        check(f"[{mode}] receives notifications/tools/list_changed", any(
            getattr(n, "method", "") == "notifications/tools/list_changed" for n in notes), notes)
        r = await c.call_tool("whoami", {})
        check(f"[{mode}] the new default holds", r.structured_content["project"] == "beta", r)

        # Cancel a slow write: the SDK sends notifications/cancelled; the sled never applies it.
        name = f"cancelled from python {mode}"
        with anyio.move_on_after(0.1) as scope:
            await c.call_tool("create_story", {"name": name, "acceptance_criteria": [], "project": "alpha"})
        check(f"[{mode}] the call was cancelled client-side", scope.cancelled_caught)
        await anyio.sleep(0.6)
        r = await c.call_tool("list_stories", {"project": "alpha"})
        names = [s["name"] for s in r.structured_content["stories"]]
        check(f"[{mode}] the cancelled write was not applied", name not in names, names)


async def surface():
    """Resources and prompts of two projects in one session, without switching."""
    async with Client(URL, mode="legacy") as c:
        made = {}
        for project in ("alpha", "beta"):
            r = await c.call_tool("create_story", {"name": f"story on {project}", "acceptance_criteria": ["done"], "project": project})
            made[project] = r.structured_content["story"]["id"]
        listed = await c.list_resources()
        uris = [str(r.uri) for r in listed.resources]
        check("resources/list: the default project's stories", f"story://alpha/{made['alpha']}" in uris, uris)
        r = await c.read_resource(f"story://alpha/{made['alpha']}")
        check("reads a resource of the default project", '"project":"alpha"' in r.contents[0].text, r)
        r = await c.read_resource(f"story://beta/{made['beta']}", meta={"io.mcp-gateway/project": "beta"})
        check("reads a resource of another project by _meta", '"project":"beta"' in r.contents[0].text, r)
        prompts = (await c.list_prompts()).prompts
        brief = next((p for p in prompts if p.name == "story_brief"), None)
        check("prompts/list offers the `project` argument",
              brief is not None and any(a.name == "project" for a in brief.arguments or []), prompts)
        r = await c.get_prompt("story_brief", {"story_id": made["alpha"]})
        check("gets a prompt of the default project", r.messages[0].content.text.startswith("Project alpha"), r)
        r = await c.get_prompt("story_brief", {"story_id": made["beta"], "project": "beta"})
        check("gets a prompt of another project by its argument", r.messages[0].content.text.startswith("Project beta"), r)
        r = await c.call_tool("whoami", {})
        check("the session's default never moved", r.structured_content["project"] == "alpha", r)


async def stateless(mode):
    async with Client(URL, mode=mode) as c:
        check(f"[{mode}] speaks the stateless era", c.protocol_version == "2026-07-28", c.protocol_version)
        tools = (await c.list_tools()).tools
        names = [t.name for t in tools]
        check(f"[{mode}] tools/list has no switch_project (no session to scope it to)",
              "switch_project" not in names and "list_projects" in names, names)
        show = next((t for t in tools if t.name == "show"), None)
        check(f"[{mode}] `project` is annotated for the Mcp-Param-Project header",
              show is not None and show.input_schema["properties"]["project"].get("x-mcp-header") == "Project", show)
        r = await c.call_tool("whoami", {"project": "beta"})
        check(f"[{mode}] with `project` (mirrored into Mcp-Param-Project): that project",
              r.structured_content["project"] == "beta", r)
        r = await c.call_tool("whoami", {})
        check(f"[{mode}] without `project`: the registry's default", r.structured_content["project"] == "alpha", r)
        # Resources and prompts of two projects, routed per request like tools.
        made = {}
        for project in ("alpha", "beta"):
            r = await c.call_tool("create_story", {"name": f"{mode} story on {project}", "acceptance_criteria": ["done"], "project": project})
            made[project] = r.structured_content["story"]["id"]
        r = await c.read_resource(f"story://beta/{made['beta']}", meta={"io.mcp-gateway/project": "beta"})
        check(f"[{mode}] reads a resource of beta by _meta", '"project":"beta"' in r.contents[0].text, r)
        r = await c.read_resource(f"story://alpha/{made['alpha']}")
        check(f"[{mode}] reads a resource of the default project", '"project":"alpha"' in r.contents[0].text, r)
        for project in ("alpha", "beta"):
            r = await c.get_prompt("story_brief", {"story_id": made[project], "project": project})
            check(f"[{mode}] gets a prompt of {project} by its argument",
                  r.messages[0].content.text.startswith(f"Project {project}"), r)
        # Closing the response stream is the cancellation signal of this era.
        name = f"cancelled from python {mode}"
        with anyio.move_on_after(0.1) as scope:
            await c.call_tool("create_story", {"name": name, "acceptance_criteria": [], "project": "gamma"})
        check(f"[{mode}] the call was cancelled client-side", scope.cancelled_caught)
        await anyio.sleep(0.6)
        r = await c.call_tool("list_stories", {"project": "gamma"})
        check(f"[{mode}] the cancelled write was not applied",
              name not in [s["name"] for s in r.structured_content["stories"]], r)


async def sampling_round_trip():
    """A sled's sampling request reaches a stateless client as an input_required answer; the
    SDK answers it with its sampling callback and retries; the sled's call finishes with it.
    Project delta is served by the conformance fixture, whose test_sampling asks the client."""
    asked = []

    async def sampling(context, params):
        asked.append(params.messages[0].content.text)
        return types.CreateMessageResult(role="assistant", model="python-test",
                                         content=types.TextContent(type="text", text="four"))

    async with Client(URL, mode="2026-07-28", sampling_callback=sampling) as c:
        r = await c.call_tool("test_sampling", {"prompt": "2+2?", "project": "delta"})
        check("[2026-07-28] answers a sled's sampling request through the gateway (input_required)",
              asked == ["2+2?"] and r.content[0].text == "LLM response: four", (asked, r))
        # completion/complete of a project's prompt argument, the project named in _meta.
        r = await c.session.send_request(
            types.CompleteRequest(params=types.CompleteRequestParams(
                ref=types.PromptReference(type="ref/prompt", name="test_prompt_with_arguments"),
                argument=types.CompletionArgument(name="arg1", value="par"),
                _meta={"io.mcp-gateway/project": "delta"})),
            types.CompleteResult)
        check("[2026-07-28] completion/complete of delta's prompt argument",
              r.completion.values == ["paris", "park", "party"], r)
    async with Client(URL, mode="2026-07-28") as c:
        try:
            await c.call_tool("test_sampling", {"prompt": "2+2?", "project": "delta"})
            check("[2026-07-28] without the sampling capability: -32021", False, "no error")
        except Exception as e:  # MCPError
            code = getattr(getattr(e, "error", None), "code", None)
            check("[2026-07-28] without the sampling capability: -32021", code == -32021, repr(e))


async def side_by_side():
    async with Client(URL, mode="legacy") as old, Client(URL, mode="2026-07-28") as new:
        await old.call_tool("switch_project", {"project": "gamma"})
        results = {}

        async def call(key, client, args):
            results[key] = (await client.call_tool("whoami", args)).structured_content["project"]

        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(call, f"old{i}", old, {})
                tg.start_soon(call, f"new{i}", new, {"project": "beta"})
        check("both eras side by side: each call where its own era says",
              all(v == ("gamma" if k.startswith("old") else "beta") for k, v in results.items()), results)


async def listen_check():
    """The stateless era's list_changed: a subscriptions/listen stream. The test harness stops a
    sled when this prints LISTENING, which changes the tool list."""
    async with Client(URL, mode="2026-07-28") as c:
        async with c.listen(tools_list_changed=True) as sub:
            check("[2026-07-28] subscriptions/listen honors toolsListChanged",
                  bool(sub.honored and sub.honored.tools_list_changed), sub.honored)
            print("LISTENING", flush=True)
            got = None
            with anyio.move_on_after(10):
                async for event in sub:
                    got = event
                    break
            check("[2026-07-28] receives the tools list_changed when a sled goes away", got is not None, got)


async def errors():
    async with Client(URL, mode="legacy") as c:
        try:
            await c.call_tool("show", {"story_id": "x", "project": "zeta"})
            check("unknown project raises -32602", False, "no error")
        except Exception as e:  # MCPError
            code = getattr(getattr(e, "error", None), "code", None)
            check("unknown project raises -32602", code == -32602 and "zeta" in str(e), repr(e))


async def main():
    await session("legacy")
    await surface()
    for mode in ("auto", "2026-07-28"):
        await stateless(mode)
    await sampling_round_trip()
    await side_by_side()
    await errors()
    await listen_check()
    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


anyio.run(main)

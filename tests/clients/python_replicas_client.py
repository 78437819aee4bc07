"""The official Python MCP SDK (PyPI `mcp`) against three gateway replicas behind nginx
(round-robin, no stickiness): one session whose requests land on every replica in turn, and
stateless requests on any replica.

Run by tests/tests/replicas.rs as `python_replicas_client.py URL`. The replicas front alpha
(the default), beta and delta (the conformance fixture, whose test_sampling asks the client
for a sampling), whose sleds are connected to whichever replicas nginx picked. Prints
one line per check and a closing "N passed, N failed" line; exits non-zero on any failure.
"""

import sys

import anyio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CreateMessageResult, TextContent

URL = sys.argv[1]
results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail and not ok else ""))


async def main():
    # The session era: one session whose requests land on every replica in turn.
    async with Client(streamable_http_client(URL), mode="legacy") as c:
        r = await c.call_tool("list_projects", {})
        live = {p["name"]: p.get("replica") for p in r.structured_content["projects"] if p["live"]}
        check("list_projects: alpha and beta live, each at a replica", set(live) >= {"alpha", "beta"} and all(live.values()), live)
        # Many requests of one session: round-robin puts them on every replica.
        projects = []
        for i in range(12):
            target = "alpha" if i % 2 == 0 else "beta"
            r = await c.call_tool("create_story", {"name": f"replicated {i}", "acceptance_criteria": [], "project": target})
            projects.append(r.structured_content["project"])
        check("12 calls of one session through the load balancer: each reached its project",
              projects == ["alpha", "beta"] * 6, projects)
        r = await c.call_tool("switch_project", {"project": "beta"})
        check("switch_project beta", r.structured_content["project"] == "beta", r)
        await anyio.sleep(0.2)
        defaults = []
        for i in range(6):
            r = await c.call_tool("create_story", {"name": f"default {i}", "acceptance_criteria": []})
            defaults.append(r.structured_content["project"])
        check("the session's default is beta on every replica", defaults == ["beta"] * 6, defaults)
        tools = [t.name for t in (await c.list_tools()).tools]
        check("tools/list on any replica lists the default's tools", "create_story" in tools, tools)

    # The stateless era: each request routed on its own, on any replica.
    async with Client(streamable_http_client(URL), mode="2026-07-28") as c:
        got = []
        for i in range(6):
            target = "alpha" if i % 2 == 0 else "beta"
            r = await c.call_tool("create_story", {"name": f"stateless {i}", "acceptance_criteria": [], "project": target})
            got.append(r.structured_content["project"])
        check("[2026-07-28] calls reach their project through any replica", got == ["alpha", "beta"] * 3, got)
        # Every replica lists every live project's tools, wherever its sled is.
        lists = []
        for i in range(3):
            names = {t.name for t in (await c.list_tools()).tools}
            lists.append({"create_story", "test_sampling"} <= names)
        check("[2026-07-28] tools/list on any replica lists every live project's tools", all(lists), lists)

    # A sled's sampling request: the retry (with the SDK's answer) lands on another replica
    # than the one that parked the call, and is taken there.
    async def sampling(context, params):
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text="4"), model="m")

    async with Client(streamable_http_client(URL), mode="2026-07-28", sampling_callback=sampling) as c:
        answers = []
        for i in range(6):
            r = await c.call_tool("test_sampling", {"prompt": "2+2?", "project": "delta"})
            answers.append(r.content[0].text if r.content else repr(r))
        check("[2026-07-28] six sampling round trips through the load balancer",
              answers == ["LLM response: 4"] * 6, answers)

    passed = sum(results)
    failed = len(results) - passed
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


anyio.run(main)

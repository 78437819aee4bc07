"""The official Python MCP SDK (PyPI `mcp`) against the gateway, whose default project
`everything` is npm's server-everything behind gateway-sled (the connector): in the handshake
era ("legacy") and the stateless era ("2026-07-28"), answering the server's sampling request.

Run by tests/tests/connector.rs with the gateway's URL. Prints one line per check and a closing
"N passed, N failed" line; exits non-zero on any failure.
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


def text(r):
    return "\n".join(getattr(c, "text", "") for c in r.content)


async def session(mode):
    asked = []

    async def sampling(context, params):
        asked.append(params.messages[0].content.text)
        return types.CreateMessageResult(role="assistant", model="python-test",
                                         content=types.TextContent(type="text", text="sampled by python"))

    async with Client(URL, mode=mode, sampling_callback=sampling) as c:
        tools = (await c.list_tools()).tools
        echo = next((t for t in tools if t.name == "echo"), None)
        check(f"[{mode}] server-everything's tools, with `project` injected",
              echo is not None and "project" in echo.input_schema["properties"], [t.name for t in tools])
        r = await c.call_tool("get-sum", {"a": 2, "b": 3, "project": "everything"})
        check(f"[{mode}] a call through the connector", text(r) == "The sum of 2 and 3 is 5.", r)
        steps = []

        async def progress(value, total, message):
            steps.append(value)

        r = await c.call_tool("trigger-long-running-operation", {"duration": 1, "steps": 2, "project": "everything"},
                              progress_callback=progress)
        check(f"[{mode}] the long operation completes", text(r).startswith("Long running operation completed"), r)
        if mode == "legacy":
            check(f"[{mode}] its progress reaches the caller", steps == [1, 2], steps)
        r = await c.call_tool("trigger-sampling-request", {"prompt": "hi", "maxTokens": 5, "project": "everything"})
        check(f"[{mode}] the server's sampling request is answered by this client",
              "sampled by python" in text(r) and any("hi" in a for a in asked), (r, asked))


async def main():
    for mode in ("legacy", "2026-07-28"):
        try:
            await session(mode)
        except Exception as e:  # noqa: BLE001 - every failure is reported as a check
            check(f"[{mode}] the session ran to the end", False, repr(e))


anyio.run(main)
failed = results.count(False)
print(f"{len(results) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)

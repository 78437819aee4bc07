"""The official Python MCP SDK (PyPI `mcp`) against a gateway with four projects, each a real
MCP server behind gateway-sled: `files` (server-filesystem), `time` (PyPI's mcp-server-time),
`memory` (server-memory) and `everything` (server-everything). One session in the handshake era
("legacy"), then one in the stateless era ("2026-07-28"); neither switches projects: every call
names its project in its own `project` argument.

Run by tests/tests/connector_servers.rs with the gateway's MCP URL, the path of the file the test
wrote in `files`' directory and that file's content. Prints one line per check and a closing
"N passed, N failed" line; exits non-zero on any failure.
"""

import sys
from datetime import datetime, timezone

import anyio
from mcp import Client, MCPError

URL, FILE, CONTENT = sys.argv[1], sys.argv[2], sys.argv[3]
results = []


def check(name, ok, detail=""):
    results.append(bool(ok))
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail and not ok else ""))


def text(r):
    return "\n".join(getattr(c, "text", "") for c in r.content)


async def session(mode):
    entity = f"python-sdk-{mode}"
    observation = f"created by the Python SDK ({mode})"
    async with Client(URL, mode=mode, read_timeout_seconds=30) as c:

        async def call(project, tool, arguments):
            return await c.call_tool(tool, {**arguments, "project": project})

        r = await call("files", "read_text_file", {"path": FILE})
        check(f"[{mode}] files: read_text_file gives the test's file", text(r) == CONTENT and not r.is_error, r)

        r = await call("time", "get_current_time", {"timezone": "UTC"})
        told = (r.structured_content or {}).get("datetime", "")
        try:
            off = abs((datetime.fromisoformat(told) - datetime.now(timezone.utc)).total_seconds())
        except ValueError:
            off = None
        check(f"[{mode}] time: get_current_time in UTC",
              (r.structured_content or {}).get("timezone") == "UTC" and not r.is_error, r)
        check(f"[{mode}] time: and it is now", off is not None and off < 300, r)

        r = await call("memory", "create_entities", {"entities": [
            {"name": entity, "entityType": "client", "observations": [observation]}]})
        check(f"[{mode}] memory: create_entities", entity in text(r) and not r.is_error, r)
        r = await call("memory", "open_nodes", {"names": [entity]})
        check(f"[{mode}] memory: open_nodes reads it back", observation in text(r), r)

        r = await call("everything", "echo", {"message": f"from python {mode}"})
        check(f"[{mode}] everything: echo", text(r) == f"Echo: from python {mode}", r)

        try:
            r = await call("nowhere", "echo", {"message": "x"})
            check(f"[{mode}] a call naming an unknown project fails", False, r)
        except MCPError as e:
            data = e.data if isinstance(e.data, dict) else {}
            check(f"[{mode}] a call naming an unknown project fails: -32602 unknown_project",
                  e.code == -32602 and data.get("kind") == "unknown_project" and data.get("project") == "nowhere",
                  (e.code, e.message, e.data))


async def main():
    for mode in ("legacy", "2026-07-28"):
        try:
            # Bounded: the test gives the whole script 120 s.
            with anyio.fail_after(50):
                await session(mode)
        except Exception as e:  # noqa: BLE001 - every failure is reported as a check
            check(f"[{mode}] the session ran to the end", False, repr(e))


anyio.run(main)
failed = results.count(False)
print(f"{len(results) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)

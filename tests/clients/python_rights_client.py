"""The official Python MCP SDK (PyPI `mcp`) against a gateway with per-project rights
(projects.toml `[[access]]`): with a client-credentials token from a real OpenID provider it
works within its rights and is refused outside them, in both eras.

Run by tests/tests/rights.rs as `python_rights_client.py URL ISSUER CLIENT_ID CLIENT_SECRET`.
The gateway fronts alpha (the default), beta and gamma; this client may read alpha (its
token's group) and write beta (its client id), and has no right on gamma. Prints one line per
check and a closing "N passed, N failed" line; exits non-zero on any failure.
"""

import sys

import anyio
import httpx2
from mcp import Client
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.streamable_http import streamable_http_client

URL, ISSUER, CLIENT_ID, CLIENT_SECRET = sys.argv[1:5]
STORY = "written by the python rights client"
results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail and not ok else ""))


class MemoryStorage:
    def __init__(self):
        self.tokens = None
        self.client_info = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        self.tokens = tokens

    async def get_client_info(self):
        return self.client_info

    async def set_client_info(self, client_info):
        self.client_info = client_info


async def refused(c, tool, arguments):
    """The JSON-RPC error a call is refused with, as (code, data); None when it was not."""
    try:
        r = await c.call_tool(tool, arguments)
        return None, r
    except Exception as e:  # MCPError
        error = getattr(e, "error", None)
        return (getattr(error, "code", None), getattr(error, "data", None)), e


async def era(http, mode):
    async with Client(streamable_http_client(URL, http_client=http), mode=mode) as c:
        tools = [t.name for t in (await c.list_tools()).tools]
        check(f"[{mode}] tools/list: alpha's tools", "whoami" in tools and "create_story" in tools, tools)
        check(f"[{mode}] tools/list: nothing of gamma's", not any(t.startswith("test_") for t in tools), tools)
        r = await c.call_tool("list_projects", {})
        names = [p["name"] for p in r.structured_content["projects"]]
        check(f"[{mode}] list_projects: alpha and beta only", names == ["alpha", "beta"], names)

        r = await c.call_tool("whoami", {"project": "alpha"})
        check(f"[{mode}] reads alpha (a read-only tool)", r.structured_content["project"] == "alpha", r)
        r = await c.call_tool("create_story", {"name": f"{STORY} ({mode})", "acceptance_criteria": [], "project": "beta"})
        check(f"[{mode}] writes beta", r.structured_content["story"]["id"].startswith("beta-"), r)

        got, detail = await refused(c, "create_story", {"name": f"{STORY} ({mode})", "acceptance_criteria": [], "project": "alpha"})
        check(f"[{mode}] a write to alpha: -32000 forbidden, naming alpha and the write right",
              got is not None and got[0] == -32000 and isinstance(got[1], dict)
              and (got[1].get("kind"), got[1].get("project"), got[1].get("right")) == ("forbidden", "alpha", "write"),
              repr(detail))
        got, detail = await refused(c, "whoami", {"project": "gamma"})
        check(f"[{mode}] gamma: answered as an unknown project, listing only alpha and beta",
              got is not None and got[0] == -32602 and isinstance(got[1], dict)
              and got[1].get("kind") == "unknown_project" and got[1].get("registered") == ["alpha", "beta"],
              repr(detail))


async def main():
    storage = MemoryStorage()
    provider = ClientCredentialsOAuthProvider(
        server_url=URL,
        storage=storage,
        client_id=CLIENT_ID,
        client_secret=CLIENT_SECRET,
        issuer=ISSUER,
    )
    async with httpx2.AsyncClient(auth=provider) as http:
        await era(http, "legacy")
        await era(http, "2026-07-28")
    check("got a token by client credentials", storage.tokens is not None and bool(storage.tokens.access_token), storage.tokens)

    passed = sum(results)
    failed = len(results) - passed
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


anyio.run(main)

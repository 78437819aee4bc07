"""The official Python MCP SDK (PyPI `mcp`) against the gateway as an OAuth resource server:
its client-credentials provider meets the 401, reads the protected resource metadata it points
at, finds the authorization server's metadata, gets a token for the gateway's resource, and
works with it in both eras.

Run by tests/tests/oauth.rs as `python_oauth_client.py URL ISSUER CLIENT_ID CLIENT_SECRET`; the
gateway fronts projects alpha (the default) and beta, and trusts ISSUER (npm's oidc-provider).
Prints one line per check and a closing "N passed, N failed" line; exits non-zero on any
failure.
"""

import sys

import anyio
import httpx2
from mcp import Client
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.streamable_http import streamable_http_client

URL, ISSUER, CLIENT_ID, CLIENT_SECRET = sys.argv[1:5]
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


async def main():
    # Without credentials the gateway answers 401 and the SDK gives up.
    try:
        async with Client(URL, mode="legacy") as c:
            await c.list_tools()
        check("without a token: refused", False, "the session worked")
    except BaseException as e:  # noqa: BLE001 (anyio wraps errors in groups)
        check("without a token: refused", "401" in repr(e) or "Unauthorized" in repr(e), repr(e))

    storage = MemoryStorage()
    provider = ClientCredentialsOAuthProvider(
        server_url=URL,
        storage=storage,
        client_id=CLIENT_ID,
        client_secret=CLIENT_SECRET,
        issuer=ISSUER,
    )
    async with httpx2.AsyncClient(auth=provider) as http:
        async with Client(streamable_http_client(URL, http_client=http), mode="legacy") as c:
            tools = [t.name for t in (await c.list_tools()).tools]
            check("[legacy] tools/list with the token", "whoami" in tools and "list_projects" in tools, tools)
            r = await c.call_tool("whoami", {"project": "beta"})
            check("[legacy] a call to beta", r.structured_content["project"] == "beta", r)
            r = await c.call_tool("create_story", {"name": "from the oauth client", "acceptance_criteria": []})
            check("[legacy] a write to the default project", r.structured_content["story"]["id"].startswith("alpha-"), r)

        prm = provider.context.protected_resource_metadata
        check("discovered the protected resource metadata", prm is not None and str(prm.resource) == URL, prm)
        check("it names the provider", prm is not None and [str(s).rstrip("/") for s in prm.authorization_servers] == [ISSUER], prm)
        meta = provider.context.oauth_metadata
        check("found the authorization server's metadata", meta is not None and str(meta.issuer).rstrip("/") == ISSUER, meta)
        tokens = storage.tokens
        check("got a token by client credentials", tokens is not None and bool(tokens.access_token), tokens)
        check("with the scope the challenge named", tokens is not None and tokens.scope == "mcp", tokens)

        async with Client(streamable_http_client(URL, http_client=http), mode="2026-07-28") as c:
            r = await c.call_tool("whoami", {"project": "alpha"})
            check("[2026-07-28] the same token in the stateless era", r.structured_content["project"] == "alpha", r)

    passed = sum(results)
    failed = len(results) - passed
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


anyio.run(main)

"""A client with client credentials gets into a gateway with [oauth], as the Python MCP SDK
(PyPI `mcp` 2.3) does it, and prints the tools it may use.

    GATEWAY_URL=https://gateway.example.com/mcp OAUTH_ISSUER=https://id.example.com/realms/ops \
    OAUTH_CLIENT_ID=ops-agent OAUTH_CLIENT_SECRET_FILE=/path/to/secret python3 oauth_client.py

The client secret comes from the file OAUTH_CLIENT_SECRET_FILE names (or OAUTH_CLIENT_SECRET),
never from the command line.
"""

import os

import anyio
import httpx2
from mcp import Client
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.streamable_http import streamable_http_client

URL = os.environ.get("GATEWAY_URL", "https://gateway.example.com/mcp")
ISSUER = os.environ.get("OAUTH_ISSUER", "https://id.example.com/realms/ops")
CLIENT_ID = os.environ.get("OAUTH_CLIENT_ID", "ops-agent")
if "OAUTH_CLIENT_SECRET_FILE" in os.environ:
    with open(os.environ["OAUTH_CLIENT_SECRET_FILE"]) as f:
        CLIENT_SECRET = f.read().strip()
else:
    CLIENT_SECRET = os.environ["OAUTH_CLIENT_SECRET"]


class MemoryStorage:  # where the SDK keeps the token; this one forgets it at exit
    def __init__(self): self.tokens, self.client_info = None, None
    async def get_tokens(self): return self.tokens
    async def set_tokens(self, tokens): self.tokens = tokens
    async def get_client_info(self): return self.client_info
    async def set_client_info(self, info): self.client_info = info


async def main():
    auth = ClientCredentialsOAuthProvider(server_url=URL, storage=MemoryStorage(),
        client_id=CLIENT_ID, client_secret=CLIENT_SECRET, issuer=ISSUER)
    async with httpx2.AsyncClient(auth=auth) as http:
        async with Client(streamable_http_client(URL, http_client=http)) as c:
            for tool in (await c.list_tools()).tools:
                print(tool.name)


anyio.run(main)

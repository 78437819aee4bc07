#!/bin/bash
# A session with curl, against `gateway demo` (projects alpha, beta and gamma; new sessions
# start on alpha). Each answer is printed on a line of its own.
set -eu
URL=${MCP_GATEWAY_URL:-http://127.0.0.1:7878/mcp}
H=(-H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream')

# 1. initialize: the answer carries this session's Mcp-Session-Id header.
INIT=$(curl -si $URL "${H[@]}" -d '{"jsonrpc":"2.0","id":1,"method":"initialize",
  "params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"curl","version":"0"}}}')
S="Mcp-Session-Id: $(printf '%s\n' "$INIT" | awk -F': ' 'tolower($1)=="mcp-session-id"{print $2}' | tr -d '\r')"
printf '%s\n' "$INIT" | tail -n 1    # the answer's body: the protocol version, the capabilities

# 2. tools/list: the gateway's 18 tools (switch_project, list_projects, the fleet tools
#    gateway_health, aggregate_pipeline_status, fleet_identity, and the 13 coordination tools
#    checkin … wait), then alpha's tools, each with a `project` property.
curl -s $URL "${H[@]}" -H "$S" -d '{"jsonrpc":"2.0","id":2,"method":"tools/list"}'; echo

# 3. Create a story on beta, without switching anything: the per-call `project` argument.
curl -s $URL "${H[@]}" -H "$S" -d '{"jsonrpc":"2.0","id":3,"method":"tools/call",
  "params":{"name":"create_story","arguments":{"name":"Fix login bug","acceptance_criteria":["login works"],"project":"beta"}}}'; echo
# -> {"result":{"structuredContent":{"project":"beta","story":{"id":"beta-…",…}},…}}

# 4. An unknown project is -32602 and names the registered ones.
curl -s $URL "${H[@]}" -H "$S" -d '{"jsonrpc":"2.0","id":4,"method":"tools/call",
  "params":{"name":"show","arguments":{"story_id":"x","project":"zeta"}}}'; echo
# -> {"error":{"code":-32602,"message":"Unknown project 'zeta'; registered projects: alpha, beta, gamma",
#      "data":{"kind":"unknown_project","project":"zeta","registered":["alpha","beta","gamma"]}}}

# 5. Make beta this session's default (no other session is affected), then call without `project`.
curl -s $URL "${H[@]}" -H "$S" -d '{"jsonrpc":"2.0","id":5,"method":"tools/call",
  "params":{"name":"switch_project","arguments":{"project":"beta"}}}'; echo
curl -s $URL "${H[@]}" -H "$S" -d '{"jsonrpc":"2.0","id":6,"method":"tools/call",
  "params":{"name":"pipeline_status","arguments":{}}}'; echo

# 6. End the session.
curl -s -X DELETE $URL -H "$S" -o /dev/null -w '%{http_code}\n'     # 204

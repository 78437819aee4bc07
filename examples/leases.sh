#!/bin/bash
# Two sessions share beta through a lease, against `gateway demo`: A claims a story, B's write
# to it is refused naming A, B waits, and A's release wakes B. Each answer on a line of its own.
set -eu
U=${MCP_GATEWAY_URL:-http://127.0.0.1:7878/mcp}; H='-H content-type:application/json -H accept:application/json,text/event-stream'
A=$(curl -si $U $H -d '{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"a","version":"0"}}}' | awk -F': ' 'tolower($1)=="mcp-session-id"{print $2}' | tr -d '\r')
B=$(curl -si $U $H -d '{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"b","version":"0"}}}' | awk -F': ' 'tolower($1)=="mcp-session-id"{print $2}' | tr -d '\r')
call() { echo "$(curl -s $U $H -H "mcp-session-id: $1" -H mcp-protocol-version:2025-11-25 -d "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"$2\",\"arguments\":$3}}")"; }
call $A claim '{"project":"beta","resource":"story:beta-1"}'                  # acquired, fence 1
call $B move_story '{"project":"beta","story_id":"beta-1","stage":"review"}'  # -32000 lease_held, naming A
call $B wait '{"projects":["alpha","beta"]}' &                                # parks...
sleep 1
call $A release '{"project":"beta","resource":"story:beta-1"}'                # ...and this wakes it
wait                                                                          # B's wait answers

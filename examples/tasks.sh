#!/bin/bash
# Tasks against `gateway demo --client-token-file a.token --client-token-file b.token`:
# caller A (a.token) starts run_tests on beta as a task, lists its tasks, polls it, gets its
# result, and cancels a second one; caller B (b.token, its own session) sees neither: each task
# id is sealed to the token and session that made it. Run as `examples/tasks.sh a.token b.token`.
# The tokens go to curl in header files, never on a command line. Each answer on a line of its own.
set -eu
U=${MCP_GATEWAY_URL:-http://127.0.0.1:7878/mcp}; H='-H content-type:application/json -H accept:application/json,text/event-stream'
hdr() { f=$(mktemp); chmod 600 "$f"; printf 'authorization: Bearer %s\n' "$(tr -d '[:space:]' < "$1")" > "$f"; echo "$f"; }
KA=$(hdr "$1"); KB=$(hdr "$2"); trap 'rm -f "$KA" "$KB"' EXIT
init() { curl -si $U $H -H @"$1" -d '{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}' | awk -F': ' 'tolower($1)=="mcp-session-id"{print $2}' | tr -d '\r'; }
A=$(init "$KA"); B=$(init "$KB")
rpc() { curl -s $U $H -H @"$1" -H "mcp-session-id: $2" -H mcp-protocol-version:2025-11-25 -d "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"$3\",\"params\":$4}"; echo; }
id() { grep -o '"taskId":"[^"]*"' | head -1 | cut -d'"' -f4; }
RUN='{"name":"run_tests","arguments":{"project":"beta"},"task":{"ttl":60000}}'
R=$(rpc "$KA" $A tools/call "$RUN"); echo "$R"; T1=$(echo "$R" | id)  # CreateTaskResult: working
rpc "$KA" $A tasks/list '{}'                                     # A's tasks: T1
until rpc "$KA" $A tasks/get "{\"taskId\":\"$T1\"}" | grep -q '"status":"completed"'; do sleep 0.5; done
rpc "$KA" $A tasks/get "{\"taskId\":\"$T1\"}"                    # completed
rpc "$KA" $A tasks/result "{\"taskId\":\"$T1\"}"                 # beta's test results
T2=$(rpc "$KA" $A tools/call "$RUN" | id)
rpc "$KA" $A tasks/cancel "{\"taskId\":\"$T2\"}"                 # status cancelled
for m in tasks/get tasks/result; do rpc "$KB" $B $m "{\"taskId\":\"$T1\"}"; done  # -32602 unknown_task
rpc "$KB" $B tasks/cancel "{\"taskId\":\"$T2\"}"                 # -32602 unknown_task
rpc "$KB" $B tasks/list '{}'                                     # B's tasks: none

#!/bin/bash
# Tasks against `gateway demo`: session A starts run_tests on beta as a task, lists its tasks,
# polls it, gets its result, and cancels a second one; session B sees neither (each task id is
# sealed to the session that made it). Each answer on a line of its own.
set -eu
U=${MCP_GATEWAY_URL:-http://127.0.0.1:7878/mcp}; H='-H content-type:application/json -H accept:application/json,text/event-stream'
init() { curl -si $U $H -d '{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"'$1'","version":"0"}}}' | awk -F': ' 'tolower($1)=="mcp-session-id"{print $2}' | tr -d '\r'; }
A=$(init a); B=$(init b)
rpc() { curl -s $U $H -H "mcp-session-id: $1" -H mcp-protocol-version:2025-11-25 -d "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"$2\",\"params\":$3}"; echo; }
id() { grep -o '"taskId":"[^"]*"' | head -1 | cut -d'"' -f4; }
RUN='{"name":"run_tests","arguments":{"project":"beta"},"task":{"ttl":60000}}'
R=$(rpc $A tools/call "$RUN"); echo "$R"; T1=$(echo "$R" | id)  # CreateTaskResult: working
rpc $A tasks/list '{}'                                      # A's tasks: T1
until rpc $A tasks/get "{\"taskId\":\"$T1\"}" | grep -q '"status":"completed"'; do sleep 0.5; done
rpc $A tasks/get "{\"taskId\":\"$T1\"}"                     # completed
rpc $A tasks/result "{\"taskId\":\"$T1\"}"                  # beta's test results
T2=$(rpc $A tools/call "$RUN" | id)
rpc $A tasks/cancel "{\"taskId\":\"$T2\"}"                  # status cancelled
for m in tasks/get tasks/result; do rpc $B $m "{\"taskId\":\"$T1\"}"; done  # -32602 unknown_task
rpc $B tasks/cancel "{\"taskId\":\"$T2\"}"                  # -32602 unknown_task
rpc $B tasks/list '{}'                                      # B's tasks: none

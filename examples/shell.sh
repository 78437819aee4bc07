#!/bin/sh
# The gateway from a shell, against `gateway demo` (MCP_GATEWAY_URL, else the demo's URL).
# This shell's agent handle is kept in $MCP_GATEWAY_AGENT_FILE, else under $XDG_STATE_HOME;
# OTHER is a second agent's.
set -eu
OTHER=${TMPDIR:-/tmp}/other-agent
gateway list-projects
gateway health                                      # gateway_health
gateway call show --project beta story_id=beta-1    # any project tool; values are JSON if they parse
gateway claim story:beta-1 --project beta           # {"acquired":true,"fence":1,...}
MCP_GATEWAY_AGENT_FILE=$OTHER gateway move-story --project beta story_id=beta-1 stage=review ||
  echo "refused (exit $?): this shell's agent holds story:beta-1"
# gateway: Refused: story:beta-1 of project 'beta' is leased by agent-1 ... [lease_held]   (exit 1)
gateway release story:beta-1 --project beta         # the same holder, one command later
gateway send "build is green" --project beta        # to beta's channel
gateway board-set release/v2 '{"ready":true}' --project beta --if-revision 0
gateway listen --project beta --until +60 &         # exit 0 with the event as JSON, 2 after 60 s
MCP_GATEWAY_AGENT_FILE=$OTHER gateway send "deployed" --project beta   # wakes it
wait $!
gateway inbox --project beta                        # the message that woke it
gateway doctor                                      # checks the deployment end to end

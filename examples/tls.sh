#!/bin/sh
# One gateway that speaks only TLS (HTTPS and WSS), as README.md's "TLS" shows, on one
# machine: a CA and a certificate for localhost made here with openssl (for real, your CA's
# certificate for your host), the gateway with --tls-cert and --tls-key, sled-sim dialing
# wss:// and trusting only that CA, and the shell doing the same. Run it from a directory
# holding your projects.toml (examples/projects.toml will do), with gateway, sled-sim and
# openssl on PATH. Ctrl-C stops it all.
set -eu
# Everything started here stops with the script (Ctrl-C, kill, or any step failing).
trap 'trap - EXIT INT TERM; kill 0' EXIT INT TERM

# A CA, and the gateway's certificate for localhost and 127.0.0.1, signed by it.
mkdir -p tls
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 825 \
  -subj "/CN=mcp-gateway example CA" -keyout tls/ca-key.pem -out tls/ca.pem 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" \
  -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
  -keyout tls/key.pem -out tls/gateway.csr 2>/dev/null
openssl x509 -req -in tls/gateway.csr -CA tls/ca.pem -CAkey tls/ca-key.pem -days 825 \
  -copy_extensions copy -out tls/fullchain.pem 2>/dev/null

# Every port of the gateway speaks only TLS; sleds prove their identity for --public-name,
# the host they dial it by.
gateway serve --config projects.toml --listen 127.0.0.1:8443 \
  --tls-cert tls/fullchain.pem --tls-key tls/key.pem --public-name localhost &
sleep 1

# The sleds dial wss://localhost:8443/uplink, trusting only this CA.
sled-sim --gateway https://localhost:8443 --project alpha --project beta --ca-file tls/ca.pem &

# The shell (and `gateway stdio`) take the https:// URL and the same CA.
sleep 2
gateway --ca-file tls/ca.pem list-projects --url https://localhost:8443/mcp
wait

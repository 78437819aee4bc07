#!/bin/sh
# Three gateway replicas on one machine, as README.md's "Replicas" shows: nats-server with
# examples/nats-server.conf (mutual TLS, a certificate per replica), the cluster secret, the
# replicas, nginx with examples/nginx.conf in front, and sled-sim serving alpha and beta through
# it. Run it from a directory holding your projects.toml (examples/projects.toml will do), with
# gateway, sled-sim, nats-server, nginx and openssl on PATH. Ctrl-C stops it all.
set -eu
examples=$(cd "$(dirname "$0")" && pwd)
# Everything started here stops with the script (Ctrl-C, kill, or any step failing).
trap 'trap - EXIT INT TERM; kill 0' EXIT INT TERM

mkdir -p nats/tls && cp "$examples/nats-server.conf" nats/ && cd nats
# The cluster's CA, the NATS server's certificate (for 127.0.0.1 and localhost), and one
# client certificate per replica, whose DNS name is its NATS user in nats-server.conf.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 825 \
  -subj "/CN=mcp-gateway cluster CA" -keyout tls/ca-key.pem -out tls/ca.pem 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" \
  -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
  -keyout tls/nats-server-key.pem -out tls/nats-server.csr 2>/dev/null
openssl x509 -req -in tls/nats-server.csr -CA tls/ca.pem -CAkey tls/ca-key.pem -days 825 \
  -copy_extensions copy -out tls/nats-server.pem 2>/dev/null
for r in r1 r2 r3; do
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$r" \
    -addext "subjectAltName=DNS:$r" -addext "extendedKeyUsage=clientAuth" \
    -keyout "tls/$r-key.pem" -out "tls/$r.csr" 2>/dev/null
  openssl x509 -req -in "tls/$r.csr" -CA tls/ca.pem -CAkey tls/ca-key.pem -days 825 \
    -copy_extensions copy -out "tls/$r.pem" 2>/dev/null
done
nats-server -c nats-server.conf &   # 127.0.0.1:4222, TLS required, JetStream in nats/store
sleep 1 && cd ..                    # (a replica that finds no NATS at start exits)

# The cluster secret: the same file on every replica, never in NATS. Everything the replicas
# share through NATS is sealed under it; a replica does not start without it.
[ -f cluster.secret ] || (umask 077 && openssl rand -hex 32 > cluster.secret)

# Each replica has a name (its NATS user), a port and a pin file of its own. At a stop it
# serves 1.5 s more, telling nginx to let go of its connections (see nginx.conf).
port=7001
for r in r1 r2 r3; do
  gateway serve --config projects.toml --listen "127.0.0.1:$port" \
    --cluster nats://127.0.0.1:4222 --replica "$r" --cluster-secret-file cluster.secret \
    --nats-ca-file nats/tls/ca.pem --nats-client-cert "nats/tls/$r.pem" \
    --nats-client-key "nats/tls/$r-key.pem" \
    --pin-file "pins-$r.toml" --trusted-proxy 127.0.0.1 --drain-settle-ms 1500 &
  port=$((port + 1))
done

mkdir -p nginx && cp "$examples/nginx.conf" nginx/
nginx -p "$PWD/nginx" -c nginx.conf -e error.log &   # 127.0.0.1:8080, round-robin

# The sleds dial the balancer, as a project's container would; clients use
# http://127.0.0.1:8080/mcp.
sled-sim --gateway http://127.0.0.1:8080 --project alpha --project beta

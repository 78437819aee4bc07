// A real OpenID provider for tests/tests/oauth.rs: npm's oidc-provider (OpenID certified), with
// the client-credentials grant and resource indicators, issuing JWT access tokens (ES256) whose
// audience is the resource asked for.
//
//   node oidc_provider.mjs RESOURCE OTHER_RESOURCE
//
// Listens on a free loopback port and prints `READY <issuer>` once it serves. The client
// `ops-agent` (secret `ops-agent-secret-0123456789`, client_secret_basic or _post) may ask for
// scopes `mcp` and `other`, for RESOURCE or OTHER_RESOURCE; so may `reader-agent` (secret
// `reader-agent-secret-0123456789`, client_secret_basic), whose tokens also carry
// `groups: ["readers"]` (for tests/tests/rights.rs). `POST /test/rotate` rotates the
// signing key: a new key signs from then on, and the old ones stay in the JWKS (as a provider
// keeps them while tokens they signed live); it answers with the new key's id.

import crypto from 'node:crypto';
import http from 'node:http';

import Provider, { errors } from 'oidc-provider';

const [resource, otherResource] = process.argv.slice(2);
if (!resource || !otherResource) {
  console.error('usage: node oidc_provider.mjs RESOURCE OTHER_RESOURCE');
  process.exit(2);
}

function newKey() {
  const { privateKey } = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' });
  return { ...privateKey.export({ format: 'jwk' }), kid: crypto.randomUUID(), alg: 'ES256', use: 'sig' };
}

function makeProvider(issuer, keys) {
  const provider = new Provider(issuer, {
    clients: [
      {
        client_id: 'ops-agent',
        client_secret: 'ops-agent-secret-0123456789',
        grant_types: ['client_credentials'],
        redirect_uris: [],
        response_types: [],
        scope: 'mcp other',
      },
      {
        client_id: 'ops-agent-post',
        client_secret: 'ops-agent-secret-0123456789',
        grant_types: ['client_credentials'],
        redirect_uris: [],
        response_types: [],
        scope: 'mcp other',
        token_endpoint_auth_method: 'client_secret_post',
      },
      {
        client_id: 'reader-agent',
        client_secret: 'reader-agent-secret-0123456789',
        grant_types: ['client_credentials'],
        redirect_uris: [],
        response_types: [],
        scope: 'mcp other',
      },
    ],
    // A group claim in the access tokens of reader-agent (the tokens' `groups`).
    extraTokenClaims: (_ctx, token) =>
      token.clientId === 'reader-agent' ? { groups: ['readers'] } : undefined,
    clientDefaults: { id_token_signed_response_alg: 'ES256' },
    scopes: ['mcp', 'other'],
    jwks: { keys },
    features: {
      devInteractions: { enabled: false },
      clientCredentials: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: () => undefined,
        useGrantedResource: () => true,
        getResourceServerInfo: (_ctx, indicator) => {
          if (indicator !== resource && indicator !== otherResource) {
            throw new errors.InvalidTarget();
          }
          return {
            scope: 'mcp other',
            audience: indicator,
            accessTokenTTL: 300,
            accessTokenFormat: 'jwt',
            jwt: { sign: { alg: 'ES256' } },
          };
        },
      },
    },
  });
  provider.on('server_error', (_ctx, err) => console.error('server_error', err));
  return provider;
}

let keys = [newKey()];
let current;
let issuer;

const server = http.createServer((req, res) => {
  if (req.method === 'POST' && req.url === '/test/rotate') {
    keys = [newKey(), ...keys];
    current = makeProvider(issuer, keys);
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ kid: keys[0].kid }));
    return;
  }
  current.callback()(req, res);
});

server.listen(0, '127.0.0.1', () => {
  issuer = `http://127.0.0.1:${server.address().port}`;
  current = makeProvider(issuer, keys);
  console.log(`READY ${issuer}`);
});

process.stdin.on('end', () => process.exit(0));
process.stdin.resume();

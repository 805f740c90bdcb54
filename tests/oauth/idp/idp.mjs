// A real OpenID provider for the OAuth tests (tests/oauth): oidc-provider 8.x, on loopback.
//
//   node idp.mjs CONFIG.json
//
// CONFIG (written by tests/oauth/idp_support.py):
//   {"jwks": {"keys": [private JWKs]}, "alg": "ES256",
//    "clients": [oidc-provider client metadata, plus "access_token_ttl" (s)],
//    "users": {"<login>": {"password": "...", "claims": {...extra access-token claims}}},
//    "resources": {"<resource indicator>": {"scope": "engram:read ...", "format": "jwt" | "opaque"}}}
//
// Prints one line `{"issuer": "http://127.0.0.1:PORT"}` on stdout once it listens (CONFIG's "port",
// or one the OS chooses), and one line `jwks served` on stderr per key-set request (a test counts
// how often the adapter fetches). The login and consent steps are JSON endpoints, so a test drives them over HTTP:
//   GET  /interaction/:uid          -> {"uid", "prompt", "missing_scopes"}
//   POST /interaction/:uid/login    {"login", "password"}          -> 303 back to the authorization
//   POST /interaction/:uid/consent  {"reject": ["engram:forget"]}  -> 303 back to the authorization
// A rejected scope is recorded on the grant as rejected (oidc-provider then stops asking for it), so
// the token simply lacks it: a person who consents to read and write but not to forget.
// Not a production provider: in-memory storage, fixed cookie keys, plain HTTP on loopback only.

import { readFileSync } from 'node:fs';
import http from 'node:http';

import Provider, { errors } from 'oidc-provider';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const users = config.users;
const clientTtl = Object.fromEntries(config.clients.map((c) => [c.client_id, c.access_token_ttl ?? 600]));
const clients = config.clients.map(({ access_token_ttl, ...metadata }) => metadata);

let provider;

function json(res, status, body) {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
}

async function readJson(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return chunks.length ? JSON.parse(Buffer.concat(chunks).toString('utf8')) : {};
}

async function interaction(req, res, uid, step) {
  const details = await provider.interactionDetails(req, res);
  if (details.uid !== uid) return json(res, 400, { error: 'interaction mismatch' });
  if (!step) {
    const missing = details.prompt.details.missingResourceScopes ?? {};
    return json(res, 200, { uid, prompt: details.prompt.name, missing_scopes: missing });
  }
  const body = await readJson(req);
  if (step === 'login') {
    const user = users[body.login];
    if (!user || user.password !== body.password) return json(res, 401, { error: 'bad credentials' });
    return provider.interactionFinished(req, res, { login: { accountId: body.login } },
      { mergeWithLastSubmission: false });
  }
  if (step === 'consent') {
    const { prompt: { details: missing }, params, session } = details;
    const grant = details.grantId
      ? await provider.Grant.find(details.grantId)
      : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
    const rejected = new Set(body.reject ?? []);
    if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(' '));
    if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
    for (const [indicator, scopes] of Object.entries(missing.missingResourceScopes ?? {})) {
      const granted = scopes.filter((s) => !rejected.has(s));
      const refused = scopes.filter((s) => rejected.has(s));
      if (granted.length) grant.addResourceScope(indicator, granted.join(' '));
      if (refused.length) grant.rejectResourceScope(indicator, refused.join(' '));
    }
    const grantId = await grant.save();
    const result = { consent: details.grantId ? {} : { grantId } };
    return provider.interactionFinished(req, res, result, { mergeWithLastSubmission: true });
  }
  return json(res, 404, { error: 'unknown step' });
}

const server = http.createServer((req, res) => {
  const match = /^\/interaction\/([^/?]+)(?:\/(login|consent))?$/.exec(req.url.split('?')[0]);
  if (match) {
    interaction(req, res, match[1], match[2]).catch((err) => json(res, 500, { error: String(err) }));
    return;
  }
  if (req.url.startsWith('/jwks')) process.stderr.write('jwks served\n');
  provider.callback()(req, res);
});

server.listen(config.port ?? 0, '127.0.0.1', () => {
  const issuer = `http://127.0.0.1:${server.address().port}`;
  provider = new Provider(issuer, {
    clients,
    jwks: config.jwks,
    findAccount: async (ctx, id) => (users[id] ? { accountId: id, claims: async () => ({ sub: id }) } : undefined),
    // The claims the binding policy maps, carried in every access token of the user.
    extraTokenClaims: async (ctx, token) => users[token.accountId]?.claims,
    scopes: ['openid', 'offline_access', ...new Set(Object.values(config.resources)
      .flatMap((r) => r.scope.split(' ')))],
    interactions: { url: (ctx, details) => `/interaction/${details.uid}` },
    issueRefreshToken: async (ctx, client) => client.grantTypeAllowed('refresh_token'),
    ttl: {
      AccessToken: (ctx, token, client) => clientTtl[client.clientId] ?? 600,
      RefreshToken: 3600,
      Grant: 3600,
      Session: 3600,
      Interaction: 600,
      AuthorizationCode: 60,
    },
    cookies: { keys: ['engram-test-idp-cookie-key-not-secret'] },
    pkce: { required: () => true },
    features: {
      devInteractions: { enabled: false },
      introspection: { enabled: true },
      revocation: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: async (ctx, client, oneOf) => oneOf ?? undefined,
        useGrantedResource: async () => true,
        getResourceServerInfo: async (ctx, indicator) => {
          const resource = config.resources[indicator];
          if (!resource) throw new errors.InvalidTarget();
          return {
            scope: resource.scope,
            accessTokenFormat: resource.format,
            ...(resource.format === 'jwt' ? { jwt: { sign: { alg: config.alg } } } : {}),
          };
        },
      },
    },
  });
  provider.on('server_error', (ctx, err) => process.stderr.write(`idp server_error: ${err.stack}\n`));
  process.stdout.write(`${JSON.stringify({ issuer })}\n`);
});

import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { base64url, exportJWK, generateKeyPair, SignJWT } from 'jose';
import ts from 'typescript';
import { beforeAll, describe, expect, it } from 'vitest';
import {
  createGuard,
  type GuardEvent,
  type GuardOptions,
  type GuardResult,
  type IssuerOptions,
  type Principal,
  policy,
  requireRoles,
  requireScopes,
} from '../src/index.js';
import { handlerServer, jsonAnswer } from './support/handler-server.js';
import { manualClock, START_MS } from './support/tokens.js';

// Audit (branch audit-idp): the token and JWKS shapes that real identity providers issue, rebuilt
// locally with jose from each provider's public documentation, against a real HTTP JWKS endpoint on
// a loopback port, with the clock injected. For each provider: the configuration a user would write
// from docs/guard.md accepts the provider's access token and refuses the tokens it must not take
// (an ID token, another tenant's or another client's token). Where a shape could not be confirmed
// from public documentation, the comment says so.
//
// The issuer options and predicates come from the block titled identity-providers.ts in
// docs/guard.md ("Identity providers"), compiled and imported as it is on the page; only `jwksUri`
// is pointed at the local endpoint.

const root = fileURLToPath(new URL('../../..', import.meta.url));
const recipeSource = /^```ts title="identity-providers\.ts"\n([\s\S]*?)^```\s*$/m.exec(
  readFileSync(join(root, 'docs', 'guard.md'), 'utf8'),
)?.[1];

interface Recipe {
  auth0(domain: string): IssuerOptions;
  keycloak(baseUrl: string, realm: string): IssuerOptions;
  entraTenants(tenantIds: readonly string[]): IssuerOptions[];
  okta(issuer: string): IssuerOptions;
  google: IssuerOptions[];
  githubActions: IssuerOptions;
  kubernetes(issuer: string, jwksUri: string): IssuerOptions;
  cognito(region: string, userPoolId: string): IssuerOptions;
  auth0Permission(permission: string): (p: Principal) => boolean;
  clientIs(...clients: string[]): (p: Principal) => boolean;
}
let recipe: Recipe;

beforeAll(async () => {
  expect(recipeSource, 'the identity-providers.ts block of docs/guard.md').toBeDefined();
  // The block imports types only, so its JavaScript runs from anywhere.
  const js = ts.transpileModule(recipeSource as string, {
    compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022, verbatimModuleSyntax: true },
  }).outputText;
  const file = join(mkdtempSync(join(tmpdir(), 'idem-idp-recipe-')), 'identity-providers.mjs');
  writeFileSync(file, js);
  recipe = (await import(pathToFileURL(file).href)) as Recipe;
});

// The recipe's issuer options with the keys fetched from the local endpoint.
const local = (options: IssuerOptions, url: string): IssuerOptions => ({ ...options, jwksUri: url });

const nowSeconds = Math.floor(START_MS / 1000);
const code = (result: GuardResult) => (result.ok ? 'ok' : result.error.code);

type Alg = 'RS256' | 'PS256' | 'ES256' | 'ES512' | 'EdDSA';

async function keyPair(alg: Alg) {
  const { publicKey, privateKey } = await generateKeyPair(alg, { extractable: true });
  return { jwk: await exportJWK(publicKey), privateKey };
}

// An opaque x5c entry and its x5t, as the providers publish them next to `n` and `e`. The guard reads
// `n` and `e` only, so the certificate bytes need not be a real certificate here.
function x509Members() {
  const der = randomBytes(600);
  return {
    x5c: [der.toString('base64')],
    x5t: base64url.encode(createHash('sha1').update(der).digest()),
  };
}

async function sign(privateKey: CryptoKey, header: Record<string, unknown> & { alg: string }, claims: object) {
  return new SignJWT({ ...claims }).setProtectedHeader(header).sign(privateKey);
}

async function jwksEndpoint(body: { keys: unknown[] }, headers: Record<string, string> = {}) {
  return handlerServer(jsonAnswer(body, headers));
}

function guardFor(options: Omit<GuardOptions, 'now' | 'cache' | 'onEvent'>) {
  const clock = manualClock();
  const events: GuardEvent[] = [];
  const guard = createGuard({ ...options, now: clock.now, cache: false, onEvent: (event) => events.push(event) });
  return { guard, clock, events };
}

const dropped = (events: GuardEvent[]) =>
  events.flatMap((event) => (event.type === 'jwks-key-dropped' ? [`${event.kid}:${event.reason}`] : []));

describe('Auth0', () => {
  // Auth0 access tokens (default "access_token" dialect): `typ: JWT`, the tenant URL with its trailing
  // slash as `iss`, `aud` an array naming the API and the tenant's /userinfo when `openid` was asked,
  // `scope` a string, `azp` the client, `permissions` with RBAC on. JWKS keys carry x5c/x5t, `alg`, `use`.
  const issuer = 'https://acme.eu.auth0.com/';
  it('accepts an access token; refuses the ID token and, by policy, another client', async () => {
    const key = await keyPair('RS256');
    const server = await jwksEndpoint(
      { keys: [{ ...key.jwk, alg: 'RS256', use: 'sig', kid: 'auth0-k1', ...x509Members() }] },
      { 'cache-control': 'public, max-age=15, stale-while-revalidate=15, stale-if-error=86400' },
    );
    const { guard } = guardFor({
      audience: 'https://api.example',
      issuers: [local(recipe.auth0('acme.eu.auth0.com'), server.url)],
    });
    const header = { alg: 'RS256', typ: 'JWT', kid: 'auth0-k1' };
    const access = await sign(key.privateKey, header, {
      iss: issuer,
      sub: 'auth0|65f0c0ffee',
      aud: ['https://api.example', `${issuer}userinfo`],
      iat: nowSeconds,
      exp: nowSeconds + 86_400,
      scope: 'openid profile read:orders',
      azp: 'client-web',
      permissions: ['read:orders', 'write:orders'],
    });
    const result = await guard.verify(access);
    expect(code(result)).toBe('ok');
    if (!result.ok) return;
    expect(result.principal.scope.has('read:orders')).toBe(true);
    expect(result.principal.aud).toEqual(['https://api.example', `${issuer}userinfo`]);
    // `permissions` is not a scope claim: an RBAC check reads it with a policy.
    expect(guard.authorize(result.principal, [policy(recipe.auth0Permission('write:orders'))]).ok).toBe(true);
    expect(guard.authorize(result.principal, [policy(recipe.auth0Permission('delete:orders'))]).ok).toBe(false);
    // Another client's token for the same API passes the guard: `azp` is the client.
    const onlyWeb = policy(recipe.clientIs('client-web'));
    expect(guard.authorize(result.principal, [onlyWeb]).ok).toBe(true);
    const other = await guard.verify(
      await sign(key.privateKey, header, {
        iss: issuer,
        sub: 'client-batch@clients',
        aud: 'https://api.example',
        iat: nowSeconds,
        exp: nowSeconds + 86_400,
        gty: 'client-credentials',
        azp: 'client-batch',
      }),
    );
    expect(other.ok && guard.authorize(other.principal, [onlyWeb]).ok).toBe(false);

    // The ID token: `aud` is the client id, and it carries `nonce`.
    const idToken = await sign(key.privateKey, header, {
      iss: issuer,
      sub: 'auth0|65f0c0ffee',
      aud: 'client-web',
      iat: nowSeconds,
      exp: nowSeconds + 36_000,
      nonce: 'n-0S6_WzA2Mj',
      sid: 'sid-1',
    });
    expect(code(await guard.verify(idToken))).toBe('type_invalid');
  });
});

describe('Keycloak', () => {
  // Keycloak: realm URL as `iss`, header `typ: JWT`, a payload `typ: Bearer`, `azp`, `aud` "account"
  // (or the API via an audience mapper), `realm_access.roles`, `sid`. The realm's JWKS (certs
  // endpoint) also lists its RSA-OAEP encryption key with `use: enc`.
  const issuer = 'https://sso.example/realms/acme';
  it('accepts an access token with the enc key in the set; roles from realm_access by policy', async () => {
    const key = await keyPair('RS256');
    const enc = await generateKeyPair('RSA-OAEP', { extractable: true });
    const server = await jwksEndpoint(
      {
        keys: [
          {
            ...(await exportJWK(enc.publicKey)),
            kid: 'kc-enc',
            alg: 'RSA-OAEP',
            use: 'enc',
            ...x509Members(),
            'x5t#S256': 'AAAA',
          },
          { ...key.jwk, kid: 'kc-sig', alg: 'RS256', use: 'sig', ...x509Members(), 'x5t#S256': 'BBBB' },
        ],
      },
      { 'cache-control': 'no-cache' },
    );
    const { guard, events } = guardFor({
      audience: 'orders-api',
      issuers: [local(recipe.keycloak('https://sso.example', 'acme'), server.url)],
    });
    const header = { alg: 'RS256', typ: 'JWT', kid: 'kc-sig' };
    const claims = {
      exp: nowSeconds + 300,
      iat: nowSeconds,
      auth_time: nowSeconds - 10,
      jti: randomUUID(),
      iss: issuer,
      aud: ['orders-api', 'account'],
      sub: randomUUID(),
      typ: 'Bearer',
      azp: 'web-app',
      sid: randomUUID(),
      acr: '1',
      'allowed-origins': ['https://app.example'],
      realm_access: { roles: ['default-roles-acme', 'offline_access', 'clerk'] },
      resource_access: { account: { roles: ['manage-account'] } },
      scope: 'openid profile email',
      email_verified: true,
      preferred_username: 'alice',
    };
    const result = await guard.verify(await sign(key.privateKey, header, claims));
    expect(code(result)).toBe('ok');
    expect(dropped(events)).toEqual(['kc-enc:wrong-use']);
    if (!result.ok) return;
    // Realm roles through rolesClaim's path; a client's roles (resource_access) are not realm roles.
    expect([...result.principal.roles]).toEqual(['default-roles-acme', 'offline_access', 'clerk']);
    expect(guard.authorize(result.principal, [requireRoles('clerk')]).ok).toBe(true);
    expect(guard.authorize(result.principal, [requireRoles('admin')]).ok).toBe(false);
    expect(guard.authorize(result.principal, [requireRoles('manage-account')]).ok).toBe(false);
    // The ID token of the same login: payload `typ: ID`, `aud` the client, `nonce`.
    const idToken = await sign(key.privateKey, header, {
      ...claims,
      typ: 'ID',
      aud: 'web-app',
      nonce: 'n-1',
      realm_access: undefined,
    });
    expect(code(await guard.verify(idToken))).toBe('type_invalid');
    // One without a nonce (the client sent none) whose aud is the API's too: refused by the recipe's
    // claimValues, not let through as an access token.
    const bareIdToken = await sign(key.privateKey, header, { ...claims, typ: 'ID', realm_access: undefined });
    expect(code(await guard.verify(bareIdToken))).toBe('claim_invalid');
    // Keycloak before 25 also copied the login's nonce into the access token (keycloak/keycloak#26893):
    // refused as an ID token, as docs/guard.md says under "Identity providers".
    expect(code(await guard.verify(await sign(key.privateKey, header, { ...claims, nonce: 'n-1' })))).toBe(
      'type_invalid',
    );
  });
});

describe('Microsoft Entra ID', () => {
  // Entra: header `typ: JWT`, `kid` (v1 also `x5t`, the same value). v1 access tokens: `iss`
  // https://sts.windows.net/{tid}/, `ver: "1.0"`, `appid`. v2: https://login.microsoftonline.com/{tid}/v2.0,
  // `ver: "2.0"`, `azp`, `aud` the API's client id. `scp` space-separated, `roles` an array, `tid`.
  // The discovery keys carry `x5c`, `x5t` and `issuer` but no `alg`. Graph tokens carry a `nonce` in
  // the protected header, replaced after signing, so their signature never verifies outside Graph.
  const tenantA = '72f988bf-86f1-41af-91ab-2d7cd011db47';
  const tenantB = 'f8cdef31-a31e-4b4a-93e4-5f571e91255a';
  const tenantC = '9188040d-6c67-4c5b-b112-36a304b66dad';
  const v2 = (tid: string) => `https://login.microsoftonline.com/${tid}/v2.0`;
  const apiClientId = '6e74172b-be56-4843-9ff4-e66a39bb12e3';

  async function entraKeys() {
    const key = await keyPair('RS256');
    const kid = 'L1KfKFI_jnXbwWc22xZxw1sUHH0';
    const server = await jwksEndpoint(
      {
        keys: [
          {
            kty: 'RSA',
            use: 'sig',
            kid,
            n: key.jwk.n,
            e: key.jwk.e,
            ...x509Members(),
            issuer: 'https://login.microsoftonline.com/{tenantid}/v2.0',
          },
        ],
      },
      { 'cache-control': 'max-age=86400, private' },
    );
    return { key, kid, server };
  }

  const v2Access = (tid: string, extra: Record<string, unknown> = {}) => ({
    aud: apiClientId,
    iss: v2(tid),
    iat: nowSeconds,
    nbf: nowSeconds,
    exp: nowSeconds + 3600,
    aio: 'AWQAm/8TAAAA',
    azp: 'c44b4083-3bb0-49c1-b47d-974e53cbdf3c',
    azpacr: '0',
    name: 'Abe Lincoln',
    oid: '690222be-ff1a-4d56-abd1-7e4f7d38e474',
    preferred_username: 'abeli@microsoft.com',
    rh: '0.AAAA',
    scp: 'orders.read orders.write',
    roles: ['Orders.Admin'],
    sub: 'HKZpfaHyWadeOouYlitjrI-KffTm222X5rrV3xDqfKQ',
    tid,
    uti: 'fqiBqXLPj0eQa82S-IYFAA',
    ver: '2.0',
    ...extra,
  });

  it('v2, multi-tenant by listing tenants: accepts the listed tenants, refuses another tenant and v1', async () => {
    const { key, kid, server } = await entraKeys();
    // No issuer template: every accepted tenant is its own issuer, with the common keys.
    const { guard } = guardFor({
      audience: apiClientId,
      issuers: recipe.entraTenants([tenantA, tenantB]).map((options) => local(options, server.url)),
    });
    const header = { typ: 'JWT', alg: 'RS256', kid };
    const a = await guard.verify(await sign(key.privateKey, header, v2Access(tenantA)));
    expect(code(a)).toBe('ok');
    if (!a.ok) return;
    expect([...a.principal.scope]).toEqual(['orders.read', 'orders.write']);
    expect(a.principal.roles.has('Orders.Admin')).toBe(true);
    expect(guard.authorize(a.principal, [requireScopes('orders.write'), requireRoles('Orders.Admin')]).ok).toBe(true);
    expect(code(await guard.verify(await sign(key.privateKey, header, v2Access(tenantB))))).toBe('ok');
    // Another tenant, signed by the same (common) keys: not a listed issuer.
    expect(code(await guard.verify(await sign(key.privateKey, header, v2Access(tenantC))))).toBe('issuer_unknown');
    // `iss` of tenant A but `tid` of tenant C: the issuer decides, and a policy can hold them together.
    const mixed = await guard.verify(await sign(key.privateKey, header, v2Access(tenantA, { tid: tenantC })));
    const tidMatchesIss = policy((p) => p.iss === v2(String(p.claims.tid)));
    expect(mixed.ok && guard.authorize(mixed.principal, [tidMatchesIss]).ok).toBe(false);
    // A v1 token of the same tenant: another issuer string.
    const v1 = await sign(
      key.privateKey,
      { ...header, x5t: kid },
      { ...v2Access(tenantA), iss: `https://sts.windows.net/${tenantA}/`, ver: '1.0', aud: `api://${apiClientId}` },
    );
    expect(code(await guard.verify(v1))).toBe('issuer_unknown');
    expect(server.requests).toBe(2); // one fetch per listed tenant
  });

  it('a token with 200 groups (Entra overage starts above that) needs limits.maxTokenLength raised', async () => {
    const { key, kid, server } = await entraKeys();
    const groups = Array.from({ length: 200 }, () => randomUUID());
    const token = await sign(key.privateKey, { typ: 'JWT', alg: 'RS256', kid }, v2Access(tenantA, { groups }));
    expect(token.length).toBeGreaterThan(8192);
    const issuers = recipe.entraTenants([tenantA]).map((options) => local(options, server.url));
    expect(code(await guardFor({ audience: apiClientId, issuers }).guard.verify(token))).toBe('token_too_large');
    const raised = guardFor({ audience: apiClientId, issuers, limits: { maxTokenLength: 16_384 } }).guard;
    expect(code(await raised.verify(token))).toBe('ok');
  });

  it('v1: the x5t header and the alg-less keys verify; a Graph token (header nonce) does not', async () => {
    const { key, kid, server } = await entraKeys();
    const issuer = `https://sts.windows.net/${tenantA}/`;
    // v1 tokens: the recipe's options under the v1 issuer (docs/guard.md, Identity providers).
    const v1Issuer = { ...recipe.entraTenants([tenantA])[0], issuer };
    const { guard } = guardFor({ audience: `api://${apiClientId}`, issuers: [local(v1Issuer, server.url)] });
    const header = { typ: 'JWT', alg: 'RS256', x5t: kid, kid };
    const claims = {
      ...v2Access(tenantA),
      iss: issuer,
      aud: `api://${apiClientId}`,
      ver: '1.0',
      appid: 'c44b4083-3bb0-49c1-b47d-974e53cbdf3c',
      appidacr: '0',
      azp: undefined,
    };
    expect(code(await guard.verify(await sign(key.privateKey, header, claims)))).toBe('ok');
    // A Graph token as Graph makes it: signed over the SHA-256 of the nonce, sent with the nonce.
    const nonce = base64url.encode(randomBytes(32));
    const graphClaims = { ...claims, aud: '00000003-0000-0000-c000-000000000000' };
    const signed = await sign(
      key.privateKey,
      { ...header, nonce: base64url.encode(createHash('sha256').update(nonce).digest()) },
      graphClaims,
    );
    const [, payload, signature] = signed.split('.');
    const sent = `${base64url.encode(JSON.stringify({ ...header, nonce }))}.${payload}.${signature}`;
    expect(code(await guard.verify(sent))).toBe('signature_invalid');
    // Even accepted by audience, it never verifies: the signature covers another header.
    const graphGuard = guardFor({
      audience: '00000003-0000-0000-c000-000000000000',
      issuers: [local(v1Issuer, server.url)],
    }).guard;
    expect(code(await graphGuard.verify(sent))).toBe('signature_invalid');
  });
});

describe('AWS Cognito', () => {
  // Cognito user pools: header `{kid, alg}` without `typ`; the access token has no `aud` but
  // `client_id`, `token_use: "access"`, `scope`, `cognito:groups`, `username`; the ID token has
  // `aud` = the app client id and `token_use: "id"`. The pool's JWKS keys carry `alg` and `use`.
  const issuer = 'https://cognito-idp.us-east-1.amazonaws.com/us-east-1_EXAMPLE';
  const clientId = '1example23456789';

  async function cognito() {
    const access = await keyPair('RS256');
    const id = await keyPair('RS256');
    const server = await jwksEndpoint({
      keys: [
        { ...access.jwk, alg: 'RS256', kid: 'access-kid', use: 'sig' },
        { ...id.jwk, alg: 'RS256', kid: 'id-kid', use: 'sig' },
      ],
    });
    const accessClaims = {
      sub: 'aaaaaaaa-bbbb-cccc-dddd-example',
      'cognito:groups': ['admin'],
      iss: issuer,
      version: 2,
      client_id: clientId,
      origin_jti: 'aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee',
      event_id: 'aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee',
      token_use: 'access',
      scope: 'aws.cognito.signin.user.admin openid orders/read',
      auth_time: nowSeconds,
      exp: nowSeconds + 3600,
      iat: nowSeconds,
      jti: 'aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee',
      username: 'alice',
    };
    const idClaims = {
      sub: accessClaims.sub,
      'cognito:groups': ['admin'],
      iss: issuer,
      'cognito:username': 'alice',
      aud: clientId,
      token_use: 'id',
      auth_time: nowSeconds,
      exp: nowSeconds + 3600,
      iat: nowSeconds,
      jti: 'bbbbbbbb-bbbb-cccc-dddd-eeeeeeeeeeee',
      email: 'alice@example.com',
    };
    return {
      server,
      accessToken: await sign(access.privateKey, { kid: 'access-kid', alg: 'RS256' }, accessClaims),
      idToken: await sign(id.privateKey, { kid: 'id-kid', alg: 'RS256' }, idClaims),
    };
  }

  it('without audienceClaim the access token is refused (no aud) and its ID token passes on its aud', async () => {
    const { server, accessToken, idToken } = await cognito();
    const { guard } = guardFor({
      audience: clientId,
      issuers: [{ issuer, jwksUri: server.url, algorithms: ['RS256'], typ: [null] }],
    });
    expect(code(await guard.verify(accessToken))).toBe('claim_invalid');
    expect(code(await guard.verify(idToken))).toBe('ok');
  });

  // Was a defect: a Cognito user pool's access token could not pass the guard under any configuration.
  // It has no `aud` (RFC 9068 requires one; Cognito names the app client in `client_id`, and marks the
  // kind in `token_use`), and the guard always read the audience from `aud`: 401 claim_invalid. The
  // only Cognito token that could pass was the ID token, the one an API must not take. Now an issuer
  // may name the claim its audience is in (`audienceClaim: 'client_id'`); the ID token, which has
  // `aud` but no `client_id`, is refused, and the principal's `aud` is the client the token was for.
  it('a Cognito access token passes with audienceClaim client_id, its ID token does not', async () => {
    const { server, accessToken, idToken } = await cognito();
    const pool = local(recipe.cognito('us-east-1', 'us-east-1_EXAMPLE'), server.url);
    expect(pool.issuer).toBe(issuer);
    const { guard } = guardFor({ audience: clientId, issuers: [pool] });
    const accepted = await guard.verify(accessToken);
    expect(code(accepted)).toBe('ok');
    expect(accepted.ok && accepted.principal.aud).toEqual([clientId]);
    expect(code(await guard.verify(idToken))).toBe('claim_invalid');
    // Another app client's access token is another audience.
    const other = guardFor({ audience: 'another-app-client', issuers: [pool] });
    expect(code(await other.guard.verify(accessToken))).toBe('audience_invalid');
  });

  it('refuses an audienceClaim that names a claim with a meaning of its own', () => {
    for (const name of ['sub', 'iss', 'scope', 'jti']) {
      expect(() =>
        guardFor({ audience: clientId, issuers: [{ issuer, jwks: { keys: [] }, audienceClaim: name }] }),
      ).toThrow(`audienceClaim cannot be ${name}`);
    }
  });

  it('an ID token configured by its aud is told apart from an access token by claimValues (or a policy)', async () => {
    const { server, idToken } = await cognito();
    const { guard } = guardFor({
      audience: clientId,
      issuers: [{ issuer, jwksUri: server.url, algorithms: ['RS256'], typ: [null] }],
    });
    const result = await guard.verify(idToken);
    expect(code(result)).toBe('ok');
    const accessOnly = policy((p) => p.claims.token_use === 'access');
    expect(result.ok && guard.authorize(result.principal, [accessOnly]).ok).toBe(false);
    // The same rule for every route of the issuer, where no route can forget it.
    const ruled = guardFor({
      audience: clientId,
      issuers: [
        { issuer, jwksUri: server.url, algorithms: ['RS256'], typ: [null], claimValues: { token_use: 'access' } },
      ],
    });
    expect(code(await ruled.guard.verify(idToken))).toBe('claim_invalid');
  });
});

describe('Okta', () => {
  // Okta custom authorization server: header `{kid, alg}`, `ver: 1`, `jti` "AT.…", `aud` "api://default",
  // `cid` the client, `uid` the user id, `scp` an array, `sub` the login. The ID token: `aud` the client
  // id, `nonce`, `amr`, `idp`. Whether Okta access tokens carry a header `typ` could not be confirmed
  // from the stored documentation; the issuer below accepts both.
  const issuer = 'https://dev-133337.okta.com/oauth2/default';
  it('accepts an access token (scp array); refuses the ID token; another client by policy on cid', async () => {
    const key = await keyPair('RS256');
    const server = await jwksEndpoint({ keys: [{ ...key.jwk, kty: 'RSA', alg: 'RS256', kid: 'okta-k1', use: 'sig' }] });
    const { guard } = guardFor({
      audience: 'api://default',
      issuers: [local(recipe.okta(issuer), server.url)],
    });
    const header = { kid: 'okta-k1', alg: 'RS256' };
    const result = await guard.verify(
      await sign(key.privateKey, header, {
        ver: 1,
        jti: 'AT.0mP4JKAZX1iACIT4vbEDF7LpvDVjxypPMf0D7uX39RE',
        iss: issuer,
        aud: 'api://default',
        iat: nowSeconds,
        exp: nowSeconds + 3600,
        cid: '0oaoesxtxmPf08QHk0h7',
        uid: '00uid4BxXw6I6TV4m0g3',
        scp: ['openid', 'orders:read'],
        auth_time: nowSeconds,
        sub: 'john.doe@example.com',
      }),
    );
    expect(code(result)).toBe('ok');
    if (!result.ok) return;
    expect(guard.authorize(result.principal, [requireScopes('orders:read')]).ok).toBe(true);
    expect(guard.authorize(result.principal, [policy(recipe.clientIs('0oaoesxtxmPf08QHk0h7'))]).ok).toBe(true);
    expect(guard.authorize(result.principal, [policy(recipe.clientIs('another-client'))]).ok).toBe(false);
    const idToken = await sign(key.privateKey, header, {
      sub: '00uid4BxXw6I6TV4m0g3',
      ver: 1,
      iss: issuer,
      aud: '0oaoesxtxmPf08QHk0h7',
      iat: nowSeconds,
      exp: nowSeconds + 3600,
      jti: 'ID.4eAWJOCMB3SX8XewDfVR',
      amr: ['pwd'],
      idp: '00ok1u7AsAkrwdZL3z0g3',
      nonce: 'n-0S6_WzA2Mj',
      auth_time: nowSeconds,
    });
    expect(code(await guard.verify(idToken))).toBe('type_invalid');
  });
});

describe('Google', () => {
  // Google ID tokens used between services (Cloud Run, IAP): header `typ: JWT`, `iss`
  // https://accounts.google.com (older tokens: accounts.google.com without the scheme), `aud` the
  // receiving service, `azp` the calling service account, no `nonce`. JWKS keys carry `alg`, `use`.
  it('accepts both issuer spellings when both are listed; refuses a token for another audience', async () => {
    const key = await keyPair('RS256');
    const server = await jwksEndpoint(
      { keys: [{ ...key.jwk, alg: 'RS256', use: 'sig', kid: 'g-k1' }] },
      { 'cache-control': 'public, max-age=20895, must-revalidate, no-transform', age: '1358' },
    );
    const audience = 'https://orders-abc123-uc.a.run.app';
    const { guard } = guardFor({
      audience,
      issuers: recipe.google.map((options) => local(options, server.url)),
    });
    const claims = (iss: string, aud = audience) => ({
      aud,
      azp: '113774264463038321964',
      email: 'caller@project.iam.gserviceaccount.com',
      email_verified: true,
      exp: nowSeconds + 3600,
      iat: nowSeconds,
      iss,
      sub: '113774264463038321964',
    });
    const header = { alg: 'RS256', kid: 'g-k1', typ: 'JWT' };
    expect(code(await guard.verify(await sign(key.privateKey, header, claims('https://accounts.google.com'))))).toBe(
      'ok',
    );
    expect(code(await guard.verify(await sign(key.privateKey, header, claims('accounts.google.com'))))).toBe('ok');
    expect(
      code(
        await guard.verify(
          await sign(key.privateKey, header, claims('https://accounts.google.com', 'https://other.a.run.app')),
        ),
      ),
    ).toBe('audience_invalid');
  });
});

describe('GitHub Actions OIDC', () => {
  // token.actions.githubusercontent.com: header `typ: JWT`, `x5t`, `kid`; `aud` the audience the
  // workflow asked for; `sub` repo:OWNER/REPO:… (long with a customised template); `repository`,
  // `ref`, `job_workflow_ref`, `environment`. JWKS keys: `alg`, `use`, `x5c`, `x5t`.
  const issuer = 'https://token.actions.githubusercontent.com';
  it('accepts the workflow token for its audience; a policy pins the repository and ref', async () => {
    const key = await keyPair('RS256');
    const x509 = x509Members();
    const server = await jwksEndpoint({ keys: [{ ...key.jwk, alg: 'RS256', use: 'sig', kid: 'gh-k1', ...x509 }] });
    const { guard } = guardFor({
      audience: 'https://deploy.example',
      issuers: [local(recipe.githubActions, server.url)],
    });
    const sub =
      'repo:octo-org/octo-repo:environment:Production:ref:refs/heads/main:job_workflow_ref:octo-org/octo-automation/.github/workflows/oidc.yml@refs/heads/main:repository_owner_id:1234567:repository_id:7654321:context:push';
    const token = await sign(
      key.privateKey,
      { typ: 'JWT', alg: 'RS256', x5t: x509.x5t, kid: 'gh-k1' },
      {
        jti: randomUUID(),
        sub,
        environment: 'Production',
        aud: 'https://deploy.example',
        ref: 'refs/heads/main',
        sha: 'example-sha',
        repository: 'octo-org/octo-repo',
        repository_owner: 'octo-org',
        actor_id: '12',
        repository_visibility: 'private',
        repository_id: '74',
        repository_owner_id: '65',
        run_id: 'example-run-id',
        run_number: '10',
        run_attempt: '2',
        runner_environment: 'github-hosted',
        actor: 'octocat',
        workflow: 'example-workflow',
        head_ref: '',
        base_ref: '',
        event_name: 'workflow_dispatch',
        ref_type: 'branch',
        job_workflow_ref: 'octo-org/octo-automation/.github/workflows/oidc.yml@refs/heads/main',
        iss: issuer,
        nbf: nowSeconds,
        exp: nowSeconds + 300,
        iat: nowSeconds,
      },
    );
    const result = await guard.verify(token);
    expect(code(result)).toBe('ok');
    if (!result.ok) return;
    expect(result.principal.sub).toBe(sub);
    const mainOfRepo = policy(
      (p) => p.claims.repository === 'octo-org/octo-repo' && p.claims.ref === 'refs/heads/main',
    );
    expect(guard.authorize(result.principal, [mainOfRepo]).ok).toBe(true);
  });
});

describe('Kubernetes service account tokens', () => {
  // Projected service account tokens: header `{alg, kid}` without `typ`; `aud` an array; `iss` the
  // cluster's service-account issuer; `sub` system:serviceaccount:NS:NAME; the nested `kubernetes.io`
  // claim. JWKS from /openid/v1/jwks: `use: sig`, `alg: RS256` (or ES256 for an EC signing key).
  const issuer = 'https://oidc.eks.eu-west-1.amazonaws.com/id/EXAMPLED539D4633E53DE1B71EXAMPLE';
  it('accepts a projected token with its nested claim; refuses one for another audience', async () => {
    const key = await keyPair('ES256');
    const server = await jwksEndpoint({ keys: [{ use: 'sig', ...key.jwk, kid: 'k8s-k1', alg: 'ES256' }] });
    const { guard } = guardFor({
      audience: 'orders-api',
      issuers: [recipe.kubernetes(issuer, server.url)],
    });
    const claims = (aud: string[]) => ({
      aud,
      exp: nowSeconds + 3600,
      iat: nowSeconds,
      iss: issuer,
      jti: randomUUID(),
      'kubernetes.io': {
        namespace: 'shop',
        node: { name: 'ip-10-0-0-1', uid: randomUUID() },
        pod: { name: 'checkout-7d9f', uid: randomUUID() },
        serviceaccount: { name: 'checkout', uid: randomUUID() },
        warnafter: nowSeconds + 3000,
      },
      nbf: nowSeconds,
      sub: 'system:serviceaccount:shop:checkout',
    });
    const header = { alg: 'ES256', kid: 'k8s-k1' };
    const result = await guard.verify(await sign(key.privateKey, header, claims(['orders-api'])));
    expect(code(result)).toBe('ok');
    if (!result.ok) return;
    const namespace = policy((p) => (p.claims['kubernetes.io'] as { namespace?: string }).namespace === 'shop');
    expect(guard.authorize(result.principal, [namespace]).ok).toBe(true);
    expect(code(await guard.verify(await sign(key.privateKey, header, claims(['vault']))))).toBe('audience_invalid');
  });
});

describe('JWKS documents as providers serve them', () => {
  it('RSA-PSS, Ed25519, ES512, key_ops and an enc key sharing a kid with a sig key', async () => {
    const ps = await keyPair('PS256');
    const ed = await keyPair('EdDSA');
    const es = await keyPair('ES512');
    const enc = await generateKeyPair('ECDH-ES', { crv: 'P-256', extractable: true });
    const server = await jwksEndpoint({
      keys: [
        { ...ps.jwk, alg: 'PS256', kid: 'ps', use: 'sig' },
        { ...ed.jwk, alg: 'EdDSA', kid: 'ed', key_ops: ['verify'] },
        { ...es.jwk, alg: 'ES512', kid: 'es' },
        // RFC 7517 4.5: two keys may share a kid when they are alternatives; one is for encryption.
        { ...(await exportJWK(enc.publicKey)), alg: 'ECDH-ES', kid: 'es', use: 'enc' },
      ],
    });
    const { guard, events } = guardFor({
      audience: 'api',
      issuers: [{ issuer: 'https://id.example', jwksUri: server.url, algorithms: ['PS256', 'EdDSA', 'ES512'] }],
    });
    const claims = { iss: 'https://id.example', sub: 'u1', aud: 'api', iat: nowSeconds, exp: nowSeconds + 60 };
    for (const [alg, kid, pair] of [
      ['PS256', 'ps', ps],
      ['EdDSA', 'ed', ed],
      ['ES512', 'es', es],
    ] as const) {
      expect(code(await guard.verify(await sign(pair.privateKey, { alg, kid, typ: 'at+jwt' }, claims))), alg).toBe(
        'ok',
      );
    }
    expect(dropped(events)).toEqual(['es:wrong-use']);
    expect(server.requests).toBe(1);
  });
});

describe('JWKS cache headers as providers send them', () => {
  // The number of fetches after verifications at each of `at` (seconds after the first fetch). A
  // verification past the set's lifetime waits for the refetch, so the count is exact there; points
  // before the last tenth of the lifetime start no background refresh.
  async function fetchesAt(headers: Record<string, string>, at: number[]) {
    const key = await keyPair('ES256');
    const server = await jwksEndpoint({ keys: [{ ...key.jwk, kid: 'k1', alg: 'ES256', use: 'sig' }] }, headers);
    const { guard, clock } = guardFor({
      audience: 'api',
      issuers: [{ issuer: 'https://id.example', jwksUri: server.url }],
    });
    const token = await sign(
      key.privateKey,
      { alg: 'ES256', kid: 'k1', typ: 'at+jwt' },
      { iss: 'https://id.example', sub: 'u1', aud: 'api', iat: nowSeconds, exp: nowSeconds + 200_000 },
    );
    expect(code(await guard.verify(token))).toBe('ok');
    const counts: number[] = [];
    let elapsed = 0;
    for (const point of at) {
      clock.advance(point - elapsed);
      elapsed = point;
      expect(code(await guard.verify(token))).toBe('ok');
      counts.push(server.requests);
    }
    return counts;
  }

  it('Auth0 max-age=15 is raised to minTtl (30 s); Microsoft max-age=86400, private is kept a day', async () => {
    // Auth0's and Microsoft's JWKS headers as publicly reported; not confirmed from stored first-party docs.
    const auth0 = { 'cache-control': 'public, max-age=15, stale-while-revalidate=15, stale-if-error=86400' };
    expect(await fetchesAt(auth0, [20, 31])).toEqual([1, 2]);
    expect(await fetchesAt({ 'cache-control': 'max-age=86400, private' }, [3600, 70_000, 86_401])).toEqual([1, 1, 2]);
    // Google's certs behind its front end: max-age less Age.
    const google = { 'cache-control': 'public, max-age=3000, must-revalidate, no-transform', age: '1358' };
    expect(await fetchesAt(google, [1400, 1643])).toEqual([1, 2]);
    // Keycloak's certs endpoint answers `no-cache`: minTtl.
    expect(await fetchesAt({ 'cache-control': 'no-cache' }, [20, 31])).toEqual([1, 2]);
  });

  // Was wrong: an `Expires` that is not a date (`0`, `-1`: what IIS and ASP.NET send, typically with
  // `Pragma: no-cache`) gave the 600 s defaultTtl, as if the response carried no freshness at all.
  // RFC 9111 5.3: a cache recipient MUST read an invalid Expires, especially "0", as a time in the
  // past. A past date already gave minTtl; the invalid forms now do too.
  it('an invalid Expires (0, -1) is already expired: minTtl, not the 600 s defaultTtl', async () => {
    for (const expires of ['0', '-1', 'Thu, 01 Jan 1970 00:00:00 GMT']) {
      expect(await fetchesAt({ expires, pragma: 'no-cache' }, [20, 31]), expires).toEqual([1, 2]);
    }
  });
});

// The other half of optional-undefined.audit.test.ts: the types say every optional setting takes
// `undefined`, so the run time must take it as "left out". Each factory here gets every optional
// setting its options type declares (read from the type with the compiler, so a new one is covered
// without a line here), all set to `undefined`, and must accept them and behave as without them.
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createClient, resolveRetry } from '@idem/client';
import {
  assertStoredResponse,
  createHttpIdempotency,
  createIdempotency,
  fingerprintRequest,
  foldRoutePath,
  IdempotencyError,
  makeIdempotent,
  memoryStore,
  parseIdempotencyKey,
  principalScope,
} from '@idem/core';
import { guard as expressGuard, idempotency as expressIdempotency } from '@idem/express';
import { authPlugin, idempotency as fastifyIdempotency } from '@idem/fastify';
import {
  authorizeRequest,
  createGuard,
  createInternalTokenIssuer,
  createInternalVerifier,
  forwardHeaders,
  GuardError,
  principalFromClaims,
  requireAuthentication,
  stripIdentityHeaders,
} from '@idem/guard';
import { idempotency as koaIdempotency } from '@idem/koa';
import { postgresStore } from '@idem/postgres';
import { redisStore } from '@idem/redis';
import { transactionalMemoryStore } from '@idem/testkit';
import {
  createBackoff,
  createOutbox,
  createReceiver,
  createSender,
  createSigner,
  createVerifier,
  expressWebhook,
  fastifyWebhook,
  generateSecret,
  koaWebhook,
  WebhookError,
} from '@idem/webhooks';
import Fastify from 'fastify';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));
const packages = ['client', 'core', 'express', 'fastify', 'guard', 'koa', 'postgres', 'redis', 'testkit', 'webhooks'];

let checker: ts.TypeChecker;
let program: ts.Program;

beforeAll(() => {
  const config = ts.readConfigFile(join(root, 'tsconfig.json'), ts.sys.readFile);
  const parsed = ts.parseJsonConfigFileContent(config.config, ts.sys, root);
  program = ts.createProgram(
    packages.map((name) => join(root, 'packages', name, 'src', 'index.ts')),
    { ...parsed.options, noEmit: true },
  );
  checker = program.getTypeChecker();
}, 60_000);

// `{ name: undefined }` for every optional property of the options type `pkg`'s entry exports as
// `typeName`, except those in `keep` (given by the case itself).
function leftOut(pkg: string, typeName: string, keep: readonly string[] = []): Record<string, undefined> {
  const source = program.getSourceFile(join(root, 'packages', pkg, 'src', 'index.ts'));
  const module = source && checker.getSymbolAtLocation(source);
  let symbol = module && checker.getExportsOfModule(module).find((s) => s.name === typeName);
  if (!symbol) throw new Error(`@idem/${pkg} exports no ${typeName}`);
  if (symbol.flags & ts.SymbolFlags.Alias) symbol = checker.getAliasedSymbol(symbol);
  const names = checker
    .getPropertiesOfType(checker.getDeclaredTypeOfSymbol(symbol))
    .filter((property) => property.flags & ts.SymbolFlags.Optional && !keep.includes(property.name))
    .map((property) => property.name);
  if (names.length === 0) throw new Error(`${typeName} has no optional setting to leave out`);
  return Object.fromEntries(names.map((name) => [name, undefined]));
}

const issuerEntry = { issuer: 'https://id.example', jwksUri: 'https://id.example/jwks' };
const guardOptions = { audience: 'https://api.example', issuers: [issuerEntry] };
const webhookSecret = (generateSecret('v1') as { secret: string }).secret;

describe('every optional setting given as undefined is taken as left out', () => {
  it('core', () => {
    const store = memoryStore(leftOut('core', 'MemoryStoreOptions'));
    expect(() => createIdempotency({ store, ...leftOut('core', 'IdempotencyOptions') })).not.toThrow();
    expect(() => createHttpIdempotency({ store, ...leftOut('core', 'HttpIdempotencyOptions') })).not.toThrow();
    expect(() => createIdempotency({ store, replayCache: { ttl: '1s', entries: undefined } })).not.toThrow();
    expect(() =>
      createHttpIdempotency({ store, fingerprint: leftOut('core', 'HttpFingerprintOptions') }),
    ).not.toThrow();
    const parts = { method: 'POST' };
    expect(
      fingerprintRequest({ ...parts, ...leftOut('core', 'RequestParts') }, leftOut('core', 'FingerprintOptions')),
    ).toBe(fingerprintRequest(parts));
    expect(parseIdempotencyKey('"k1"', leftOut('core', 'ParseKeyOptions'))).toEqual(parseIdempotencyKey('"k1"'));
    expect(foldRoutePath('/A/b', leftOut('core', 'RoutePathOptions'))).toBe(foldRoutePath('/A/b', {}));
    expect(principalScope({ sub: 'u1' }, leftOut('core', 'PrincipalScopeOptions'))).toBe(principalScope({ sub: 'u1' }));
    const engine = createIdempotency({ store });
    expect(() =>
      makeIdempotent(async () => 'done', {
        engine,
        operation: 'op',
        key: () => 'k',
        payload: () => 'p',
        ...leftOut('core', 'MakeIdempotentOptions', ['engine', 'operation', 'key', 'payload']),
      }),
    ).not.toThrow();
    const error = new IdempotencyError('key_missing', 'no key', leftOut('core', 'IdempotencyErrorOptions'));
    expect(error.code).toBe('key_missing');
    const response = { status: 201, headers: {}, body: new Uint8Array(3) };
    expect(() => assertStoredResponse(response, leftOut('core', 'StoredResponseLimits'))).not.toThrow();
  });

  it('client', async () => {
    expect(resolveRetry(leftOut('client', 'RetryOptions'))).toEqual(resolveRetry({}));
    // Laid over a client's retry settings, a request's undefined ones keep the client's.
    const clientRetry = resolveRetry({ maxAttempts: 2, baseDelay: '2s', timeout: false });
    expect(resolveRetry(leftOut('client', 'RetryOptions'), clientRetry)).toEqual(clientRetry);
    const seen: Request[] = [];
    const fetch = async (input: Request | URL | string, init?: RequestInit) => {
      seen.push(new Request(input, init));
      return new Response('{"ok":true}', { status: 201, headers: { 'content-type': 'application/json' } });
    };
    const client = createClient({ baseUrl: 'https://api.example', ...leftOut('client', 'ClientOptions'), fetch });
    const result = await client.post('/orders', {
      json: { a: 1 },
      ...leftOut('client', 'RequestWithBodyOptions', ['json']),
    });
    expect(result.status).toBe(201);
    expect(seen[0]?.headers.get('idempotency-key')).toBeTruthy();
  });

  it('guard', async () => {
    const guard = createGuard({
      ...guardOptions,
      ...leftOut('guard', 'GuardOptions', ['audience', 'issuers']),
      issuers: [{ ...issuerEntry, ...leftOut('guard', 'IssuerOptions', ['issuer', 'jwksUri']) }],
    });
    expect(guard.realm).toBe(createGuard(guardOptions).realm);
    expect(() =>
      createGuard({
        ...guardOptions,
        issuers: [{ ...issuerEntry, jwksOptions: leftOut('guard', 'RemoteJwksOptions') }],
        dpop: leftOut('guard', 'DpopOptions'),
        cache: { maxEntries: undefined },
      }),
    ).not.toThrow();
    expect(() =>
      createGuard({ ...guardOptions, dpop: { nonce: { secret: undefined, lifetime: undefined } } }),
    ).not.toThrow();
    const issuer = createInternalTokenIssuer({
      issuer: 'https://gateway.example',
      ...leftOut('guard', 'InternalTokenIssuerOptions', ['issuer']),
    });
    expect(() => issuer.rotate(undefined, { delay: undefined })).not.toThrow();
    expect(() =>
      createInternalVerifier({
        issuer: 'https://gateway.example',
        audience: 'orders',
        jwksUri: 'https://gateway.example/jwks',
        ...leftOut('guard', 'InternalVerifierOptions', ['issuer', 'audience', 'jwksUri']),
      }),
    ).not.toThrow();
    const principal = principalFromClaims(
      { sub: 'u1', iss: 'https://id.example', aud: 'api', scope: 'a' },
      { rolesClaim: undefined, audienceClaim: undefined, issuer: undefined, audience: undefined },
    );
    expect(principal).toEqual(principalFromClaims({ sub: 'u1', iss: 'https://id.example', aud: 'api', scope: 'a' }));
    expect(() => requireAuthentication({ acrValues: undefined, maxAge: 300 })).not.toThrow();
    const request = { method: 'GET', url: '/', headers: {} };
    expect(authorizeRequest(principal, [], request, leftOut('guard', 'AuthorizeOptions'))).toEqual(
      authorizeRequest(principal, [], request),
    );
    const headers = { 'x-user-id': 'forged', accept: 'text/plain' };
    expect(stripIdentityHeaders(headers, leftOut('guard', 'StripOptions'))).toEqual(stripIdentityHeaders(headers));
    const forwarded = await forwardHeaders(headers, principal, {
      issuer,
      audience: 'orders',
      ...leftOut('guard', 'ForwardOptions', ['issuer', 'audience']),
    });
    expect(Object.keys(forwarded)).toContain('accept');
    expect(new GuardError('token_missing', leftOut('guard', 'GuardErrorOptions')).code).toBe('token_missing');
  });

  it('webhooks', async () => {
    const sender = createSender({
      secret: webhookSecret,
      ...leftOut('webhooks', 'SenderOptions', ['secret', 'fetch']),
      schedule: leftOut('webhooks', 'ScheduleOptions'),
      fetch: async () => new Response(null, { status: 204 }),
    });
    const message = { url: 'https://hooks.example/in', id: 'msg_1', body: '{}' };
    const sent = await sender.send({ ...message, ...leftOut('webhooks', 'WebhookMessage') }, { signal: undefined });
    expect(sent.outcome).toBe('delivered');
    const added: unknown[][] = [];
    const tx = {
      query: async (_text: string, values?: unknown[]) => {
        added.push(values ?? []);
        return { rows: [], rowCount: 1 };
      },
    };
    await createOutbox().add(tx, { url: message.url, body: { a: 1 }, ...leftOut('webhooks', 'OutboxEvent') });
    expect(String(added[0]?.[0])).toMatch(/^evt_/);
    expect(added[0]?.slice(3)).toEqual(['application/json', '{}']);
    expect(createBackoff(leftOut('webhooks', 'BackoffOptions')).ceiling(3)).toBe(createBackoff().ceiling(3));
    const outbox = createOutbox(leftOut('webhooks', 'OutboxOptions'));
    expect(() =>
      outbox.relay({
        db: { query: async () => ({ rows: [], rowCount: 0 }) },
        sender,
        ...leftOut('webhooks', 'RelayOptions', ['db', 'sender']),
      }),
    ).not.toThrow();
    const receiver = createReceiver({
      store: memoryStore(),
      secret: webhookSecret,
      apply: () => {},
      ...leftOut('webhooks', 'ReceiverOptions', ['store', 'secret', 'apply']),
    });
    expect(() => expressWebhook(receiver, leftOut('webhooks', 'GlueOptions'))).not.toThrow();
    expect(() => koaWebhook(receiver, leftOut('webhooks', 'KoaWebhookOptions'))).not.toThrow();
    expect(() =>
      fastifyWebhook(receiver, { path: '/hooks', ...leftOut('webhooks', 'FastifyWebhookOptions', ['path']) }),
    ).not.toThrow();
    expect(() => createSigner({ secret: webhookSecret })).not.toThrow();
    expect(() =>
      createVerifier({ secret: webhookSecret, ...leftOut('webhooks', 'VerifierOptions', ['secret']) }),
    ).not.toThrow();
    const error = new WebhookError('signature_mismatch', 'no match', leftOut('webhooks', 'WebhookErrorOptions'));
    expect([error.cause, error.details]).toEqual([undefined, {}]);
  });

  it('stores', () => {
    const redisClient = { send: async () => null };
    expect(() =>
      redisStore({ client: redisClient as never, ...leftOut('redis', 'RedisStoreOptions', ['client']) }),
    ).not.toThrow();
    const pgClient = { query: async () => ({ rows: [], rowCount: 0 }) };
    expect(() =>
      postgresStore({ client: pgClient as never, ...leftOut('postgres', 'PostgresStoreOptions', ['client']) }),
    ).not.toThrow();
    expect(() => transactionalMemoryStore(leftOut('testkit', 'TransactionalMemoryOptions'))).not.toThrow();
  });

  describe('adapters', () => {
    const app = Fastify();
    afterAll(() => app.close());

    it('express, koa and fastify', async () => {
      const store = memoryStore();
      expect(() => expressIdempotency({ store, ...leftOut('express', 'ExpressIdempotencyOptions') })).not.toThrow();
      expect(() => expressGuard(guardOptions, leftOut('express', 'GuardGlueOptions'))).not.toThrow();
      expect(() => koaIdempotency({ store, ...leftOut('koa', 'KoaIdempotencyOptions') })).not.toThrow();
      await app.register(fastifyIdempotency, { store, ...leftOut('fastify', 'FastifyIdempotencyOptions') });
      await app.register(authPlugin, leftOut('fastify', 'AuthPluginOptions'));
      await app.ready();
    });
  });
});

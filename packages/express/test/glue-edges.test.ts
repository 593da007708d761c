import { memoryStore } from '@idem/core';
import { authorize, guard, idempotency, internalAuth } from '@idem/express';
import {
  createGuard,
  createInternalTokenIssuer,
  defaultInternalTokenHeader,
  policy,
  principalFromClaims,
} from '@idem/guard';
import express from 'express';
import { decodeJwt } from 'jose';
import { describe, expect, it } from 'vitest';
import { AUDIENCE, ISSUER, makeToken, manualClock, SECRET } from '../../guard/test/support/tokens.js';
import { forwardHeaders } from '../src/auth.js';
import { send, serve } from './support.js';

const postJson = (url: string, key: string | undefined, body: unknown = { amount: 1 }) =>
  send(
    url,
    'POST',
    [
      ['content-type', 'application/json'],
      ...(key === undefined ? [] : ([['idempotency-key', key]] as Array<[string, string]>)),
    ],
    JSON.stringify(body),
  );

describe('@idem/express idempotency, beyond the scenario table', () => {
  it('with required: false, a request that sends a key is still made idempotent; one without a key runs each time', async () => {
    const app = express();
    let runs = 0;
    app.use(idempotency({ store: memoryStore(), scope: () => 'tenant-1', required: false }));
    app.use(express.json());
    app.post('/charges', (_req, res) => {
      res.status(201).json({ run: ++runs });
    });
    await serve(app, async (url) => {
      const first = await postJson(`${url}/charges`, 'optional-1');
      expect(first.status).toBe(201);
      const retry = await postJson(`${url}/charges`, 'optional-1');
      expect(retry.status).toBe(201);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(JSON.parse(retry.body)).toEqual({ run: 1 });
      expect((await postJson(`${url}/charges`, undefined)).status).toBe(201);
      expect((await postJson(`${url}/charges`, undefined)).status).toBe(201);
      expect(runs).toBe(3);
    });
  });

  it('a scope function that throws is a 500 through the error handlers, never a hung request nor the handler', async () => {
    const app = express();
    let runs = 0;
    const scope = () => {
      throw new Error('tenant lookup failed');
    };
    app.use(idempotency({ store: memoryStore(), scope }));
    app.post('/charges', (_req, res) => {
      runs++;
      res.json({ ok: true });
    });
    const seen: unknown[] = [];
    app.use((error: unknown, _req: express.Request, res: express.Response, _next: express.NextFunction) => {
      seen.push(error);
      res.status(500).json({ failed: true });
    });
    await serve(app, async (url) => {
      const answer = await postJson(`${url}/charges`, 'scope-throws');
      expect(answer.status).toBe(500);
      expect(JSON.parse(answer.body)).toEqual({ failed: true });
      expect((seen[0] as Error).message).toBe('tenant lookup failed');
      expect(runs).toBe(0);
    });
  });

  it('mounted with app.use, an answer from a plain middleware (no route) is an answer: stored and replayed', async () => {
    const app = express();
    let runs = 0;
    app.use(idempotency({ store: memoryStore(), scope: () => 'tenant-1' }));
    app.use(express.json());
    // A catch-all middleware, not a route: req.route stays undefined.
    app.use((_req, res) => {
      res.status(202).json({ run: ++runs });
    });
    await serve(app, async (url) => {
      expect((await postJson(`${url}/anything`, 'plain-mw')).status).toBe(202);
      const retry = await postJson(`${url}/anything`, 'plain-mw');
      expect(retry.status).toBe(202);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(runs).toBe(1);
    });
  });

  it('without idempotencyErrors(), a handler that throws gets its 500 stored and replayed (thrown is not known)', async () => {
    const app = express();
    let runs = 0;
    app.use(idempotency({ store: memoryStore(), scope: () => 'tenant-1' }));
    app.post('/charges', () => {
      runs++;
      throw new Error('boom');
    });
    await serve(app, async (url) => {
      expect((await postJson(`${url}/charges`, 'thrown-500')).status).toBe(500);
      const retry = await postJson(`${url}/charges`, 'thrown-500');
      expect(retry.status).toBe(500);
      expect(retry.headers['idempotent-replayed']).toBe('true');
      expect(runs).toBe(1);
    });
  });
});

describe('@idem/express guard glue, beyond the scenario table', () => {
  const clock = manualClock();
  const edge = () => createGuard({ audience: AUDIENCE, now: clock.now, issuers: [{ issuer: ISSUER, secret: SECRET }] });
  const bearer = (claims: Record<string, unknown> = {}): [string, string] => [
    'authorization',
    `Bearer ${makeToken({ claims })}`,
  ];

  it("a guard that fails unexpectedly (its injected clock throws) is a 500 through Express's error handlers, never a hung request", async () => {
    let broken = false;
    const failing = createGuard({
      audience: AUDIENCE,
      now: () => {
        if (broken) throw new Error('clock failed');
        return clock.now();
      },
      issuers: [{ issuer: ISSUER, secret: SECRET }],
    });
    const app = express();
    let runs = 0;
    app.get('/orders', guard(failing), (_req, res) => {
      runs++;
      res.json({ ok: true });
    });
    await serve(app, async (url) => {
      broken = true;
      expect((await send(`${url}/orders`, 'GET', [bearer()])).status).toBe(500);
      expect(runs).toBe(0);
    });
  });

  it("authorize() on a router's route: a policy sees the URL as the client sent it, mount path included", async () => {
    const app = express();
    const api = express.Router();
    let runs = 0;
    api.get(
      '/tenants/:tenant/orders',
      guard(edge()),
      authorize(policy((_principal, request) => request.url?.startsWith('/api/tenants/t1/') === true)),
      (_req, res) => {
        runs++;
        res.json({ ok: true });
      },
    );
    app.use('/api', api);
    await serve(app, async (url) => {
      expect((await send(`${url}/api/tenants/t1/orders`, 'GET', [bearer()])).status).toBe(200);
      expect((await send(`${url}/api/tenants/t2/orders`, 'GET', [bearer()])).status).toBe(403);
      expect(runs).toBe(1);
    });
  });

  it('authorize() hands the route parameters to policies: one tenant reaches only its own orders', async () => {
    const app = express();
    let runs = 0;
    app.get(
      '/tenants/:tenant/orders',
      guard(edge()),
      authorize(
        policy((principal, request) => (request.params as { tenant?: string }).tenant === principal.claims.tenant),
      ),
      (_req, res) => {
        runs++;
        res.json({ ok: true });
      },
    );
    await serve(app, async (url) => {
      expect((await send(`${url}/tenants/t1/orders`, 'GET', [bearer({ tenant: 't1' })])).status).toBe(200);
      const other = await send(`${url}/tenants/t2/orders`, 'GET', [bearer({ tenant: 't1' })]);
      expect(other.status).toBe(403);
      expect(JSON.parse(other.body)).toMatchObject({ code: 'insufficient_scope' });
      expect(runs).toBe(1);
    });
  });

  it('authorize() after something other than guard() set req.auth: 401 problem, never a 500 nor the handler', async () => {
    const app = express();
    let runs = 0;
    app.use((req, _res, next) => {
      req.auth = { sub: 'forged', iss: 'nobody', scope: new Set(['orders:read']) } as unknown as typeof req.auth;
      next();
    });
    app.get('/orders', authorize(), (_req, res) => {
      runs++;
      res.json({ ok: true });
    });
    await serve(app, async (url) => {
      const answer = await send(`${url}/orders`, 'GET', []);
      expect(answer.status).toBe(401);
      expect(answer.headers['content-type']).toMatch(/^application\/problem\+json/);
      expect(answer.headers['www-authenticate']).toMatch(/^Bearer/);
      expect(runs).toBe(0);
    });
  });

  it("forwardHeaders() with an explicit issuer mints with it: over the guard's internalTokens, or for a caller no guard authenticated", async () => {
    const own = createInternalTokenIssuer({ issuer: 'https://gateway.example', now: clock.now });
    const other = createInternalTokenIssuer({ issuer: 'https://other-gateway.example', now: clock.now });
    const withTokens = createGuard({
      audience: AUDIENCE,
      now: clock.now,
      internalTokens: own,
      issuers: [{ issuer: ISSUER, secret: SECRET }],
    });
    const app = express();
    app.get('/forward', guard(withTokens), async (req, res) => {
      res.json(await forwardHeaders(req, { audience: 'orders', issuer: other }));
    });
    // A caller authenticated by the app's own middleware, not by guard(): the explicit issuer is all it needs.
    app.get(
      '/forward-own-auth',
      (req, _res, next) => {
        req.auth = principalFromClaims({ sub: 'user-2', iss: ISSUER }, { issuer: ISSUER });
        next();
      },
      async (req, res) => {
        res.json(await forwardHeaders(req, { audience: 'orders', issuer: other }));
      },
    );
    await serve(app, async (url) => {
      for (const [path, sub] of [
        ['/forward', 'user-1'],
        ['/forward-own-auth', 'user-2'],
      ] as const) {
        const answer = await send(`${url}${path}`, 'GET', [bearer()]);
        expect(answer.status, path).toBe(200);
        const headers = JSON.parse(answer.body) as Record<string, string>;
        const claims = decodeJwt(String(headers[defaultInternalTokenHeader]));
        expect(claims.iss, path).toBe('https://other-gateway.example');
        expect(claims.sub, path).toBe(sub);
      }
    });
  });

  it('forwardHeaders() answers plain strings, even for a request header Node keeps as a list', async () => {
    const own = createInternalTokenIssuer({ issuer: 'https://gateway.example', now: clock.now });
    const withTokens = createGuard({
      audience: AUDIENCE,
      now: clock.now,
      internalTokens: own,
      issuers: [{ issuer: ISSUER, secret: SECRET }],
    });
    const app = express();
    app.get('/forward', guard(withTokens), async (req, res) => {
      res.json(await forwardHeaders(req, { audience: 'orders' }));
    });
    await serve(app, async (url) => {
      const answer = await send(`${url}/forward`, 'GET', [bearer(), ['set-cookie', 'a=1'], ['set-cookie', 'b=2']]);
      const headers = JSON.parse(answer.body) as Record<string, unknown>;
      for (const value of Object.values(headers)) expect(typeof value).toBe('string');
      expect(headers['set-cookie']).toBe('a=1, b=2');
    });
  });
  it('internalAuth() built from options (not a Guard) verifies the internal token and sets req.auth', async () => {
    const issuer = createInternalTokenIssuer({ issuer: 'https://gateway.example', now: clock.now });
    const app = express();
    app.get(
      '/internal',
      internalAuth({ issuer: 'https://gateway.example', audience: 'orders', jwks: issuer.jwks(), now: clock.now }),
      (req, res) => {
        res.json({ sub: req.auth?.sub });
      },
    );
    const verified = await edge().verify(makeToken());
    if (!verified.ok) throw new Error('the test token must verify');
    const token = await issuer.mint(verified.principal, { audience: 'orders' });
    await serve(app, async (url) => {
      const answer = await send(`${url}/internal`, 'GET', [[defaultInternalTokenHeader, token]]);
      expect(answer.status).toBe(200);
      expect(JSON.parse(answer.body)).toEqual({ sub: 'user-1' });
      expect((await send(`${url}/internal`, 'GET', [bearer()])).status).toBe(401);
    });
  });

  it('forwardHeaders() on a request no guard authenticated throws, even with an explicit issuer: nothing is minted', async () => {
    const other = createInternalTokenIssuer({ issuer: 'https://other-gateway.example', now: clock.now });
    const app = express();
    app.get('/forward', async (req, res) => {
      try {
        res.json(await forwardHeaders(req, { audience: 'orders', issuer: other }));
      } catch (error) {
        res.status(500).json({ name: (error as Error).name, message: (error as Error).message });
      }
    });
    await serve(app, async (url) => {
      const answer = await send(`${url}/forward`, 'GET', []);
      expect(answer.status).toBe(500);
      expect(JSON.parse(answer.body)).toEqual({
        name: 'TypeError',
        message: 'forwardHeaders needs an authenticated request (mount guard() first)',
      });
    });
  });
});

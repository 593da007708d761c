// Runs docs/guides/nestjs.md against real NestJS apps (12.6, Express and Fastify platforms), mounted
// as the page says, with real HTTP requests on ephemeral ports. NestJS's decorators are applied as
// plain calls: the project compiles without `experimentalDecorators`, and vitest emits no decorator
// metadata, so nothing here relies on either (no constructor injection).
import 'reflect-metadata';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { memoryStore, type Store } from '@idem/core';
import * as idemExpress from '@idem/express';
import * as idemFastify from '@idem/fastify';
import { redisStore } from '@idem/redis';
import { redisAnswers, serviceAvailable } from '@idem/testkit';
import {
  type ArgumentsHost,
  BadRequestException,
  Body,
  Catch,
  Controller,
  Header,
  HttpCode,
  HttpException,
  type INestApplication,
  type MiddlewareConsumer,
  Module,
  NotFoundException,
  Param,
  Post,
  StreamableFile,
} from '@nestjs/common';
import { BaseExceptionFilter, NestFactory } from '@nestjs/core';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { Redis } from 'ioredis';
import { SignJWT } from 'jose';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { until } from '../../packages/core/test/support/timeouts-kit.js';
import { deleteKeys } from '../../packages/redis/test/redis-env.js';

const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const withRedis = serviceAvailable(
  `Redis at ${redisUrl}`,
  await redisAnswers(redisUrl),
  'the NestJS guide run on Redis',
);
const redis = withRedis ? new Redis(redisUrl) : undefined;
const redisPrefix = `audit-nest:${randomBytes(4).toString('hex')}:`;
let redisStores = 0;
afterAll(async () => {
  if (redis === undefined) return;
  await deleteKeys(redis, redisPrefix);
  await redis.quit();
});

const stores: Array<[string, () => Store]> = [['memory', () => memoryStore()]];
if (redis !== undefined)
  stores.push(['redis', () => redisStore({ client: redis, prefix: `${redisPrefix}${++redisStores}:` })]);

// The guard of the page's `guard(edge)` / `authPlugin, { guard: edge }`: a real token check.
const secret = new TextEncoder().encode('a-test-secret-of-at-least-32-bytes!!');
const issuer = 'https://id.example';
const audience = 'https://api.example';
const edge = { audience, issuers: [{ issuer, secret }] };
const token = (sub: string) =>
  new SignJWT({ scope: 'orders:write' })
    .setProtectedHeader({ alg: 'HS256', typ: 'at+jwt' })
    .setIssuer(issuer)
    .setAudience(audience)
    .setSubject(sub)
    .setIssuedAt()
    .setExpirationTime('5m')
    .sign(secret);

const page = readFileSync(fileURLToPath(new URL('../guides/nestjs.md', import.meta.url)), 'utf8');
const thisFile = readFileSync(fileURLToPath(import.meta.url), 'utf8');
const nestVersion = (
  JSON.parse(readFileSync(fileURLToPath(import.meta.resolve('@nestjs/core/package.json')), 'utf8')) as {
    version: string;
  }
).version;

type Platform = 'express' | 'fastify';
const platforms: Platform[] = ['express', 'fastify'];

/** What the controller's handlers did, per app. */
interface Runs {
  count: number;
  /** Set by a test that wants the `slow` handler held until it lets go. */
  hold?: Promise<void> | undefined;
  /** The bodies the handlers received, parsed by NestJS. */
  bodies: unknown[];
}

function decorate(target: object, name: string, ...decorators: MethodDecorator[]) {
  const proto = (target as { prototype: object }).prototype;
  const descriptor = Object.getOwnPropertyDescriptor(proto, name);
  if (descriptor === undefined) throw new Error(`no method ${name}`);
  for (const decorator of decorators) decorator(proto, name, descriptor);
}

/** An orders controller, one handler per claim of the page, counting its runs in `runs`. */
function ordersController(runs: Runs) {
  class OrdersController {
    create(body: unknown) {
      runs.count++;
      runs.bodies.push(body);
      return { id: `ord_${runs.count}`, body };
    }
    accept(body: unknown) {
      runs.count++;
      runs.bodies.push(body);
      return { accepted: runs.count };
    }
    tagged() {
      runs.count++;
      return { tagged: runs.count };
    }
    file() {
      runs.count++;
      return new StreamableFile(Buffer.from(`%PDF-1.7 order ${runs.count}\n`), {
        type: 'application/pdf',
        disposition: 'attachment; filename="order.pdf"',
      });
    }
    async slow() {
      runs.count++;
      await runs.hold;
      return { slow: runs.count };
    }
    bad() {
      runs.count++;
      throw new BadRequestException('amount must be positive');
    }
    boom() {
      runs.count++;
      throw new Error('the database is down');
    }
    cancel() {
      runs.count++;
    }
    missing() {
      runs.count++;
      throw new NotFoundException('no such order');
    }
    refund(id: string) {
      runs.count++;
      return { refund: runs.count, order: id };
    }
  }
  Controller('orders')(OrdersController);
  decorate(OrdersController, 'create', Post());
  Body()(OrdersController.prototype, 'create', 0);
  decorate(OrdersController, 'accept', Post('accept'), HttpCode(202));
  Body()(OrdersController.prototype, 'accept', 0);
  decorate(OrdersController, 'tagged', Post('tagged'), Header('x-order-tag', 'blue'), Header('x-other', 'green'));
  decorate(OrdersController, 'file', Post('file'));
  decorate(OrdersController, 'slow', Post('slow'));
  decorate(OrdersController, 'bad', Post('bad'));
  decorate(OrdersController, 'boom', Post('boom'));
  decorate(OrdersController, 'cancel', Post('cancel'), HttpCode(204));
  decorate(OrdersController, 'missing', Post('missing'));
  decorate(OrdersController, 'refund', Post(':id/refunds'));
  Param('id')(OrdersController.prototype, 'refund', 0);
  return OrdersController;
}

// The page's filter, as written there.
class IdempotencyExceptionFilter extends BaseExceptionFilter {
  override catch(error: unknown, host: ArgumentsHost) {
    const req = host.switchToHttp().getRequest();
    if (!(error instanceof HttpException)) req.idempotency?.release();
    // With app.setGlobalPrefix() on Express, NestJS answers unknown paths from a catch-all route,
    // so their 404 looks like a route's answer and would be stored: give those keys back too.
    if (error instanceof NotFoundException && req.route?.path === '*path') req.idempotency?.release();
    super.catch(error, host);
  }
}
Catch()(IdempotencyExceptionFilter);

interface Mount {
  store?: Store;
  /** The guard before idempotency, as the page says; else a `scope` (or neither, when `scope` is null). */
  guarded?: boolean;
  /** The guard mounted (registered) after idempotency instead. */
  guardAfter?: boolean;
  scope?: null;
  /** Through a `MiddlewareConsumer` instead of app.use / app.register (@idem/express on both platforms). */
  consumer?: boolean;
  storeOutcome?: 'stripe';
  replayHeaders?: string[];
  filter?: boolean;
  prefix?: string;
}

interface Running {
  url: string;
  runs: Runs;
  app: INestApplication;
}

const apps: INestApplication[] = [];
afterEach(async () => {
  await Promise.all(apps.splice(0).map((app) => app.close()));
});

async function start(platform: Platform, mount: Mount = {}): Promise<Running> {
  const runs: Runs = { count: 0, bodies: [] };
  const controller = ordersController(runs);
  const store = mount.store ?? memoryStore();
  const scope = mount.guarded || mount.guardAfter || mount.scope === null ? undefined : () => 'tenant-1';
  const options = {
    store,
    ...(scope ? { scope } : {}),
    ...(mount.storeOutcome ? { storeOutcome: mount.storeOutcome } : {}),
    ...(mount.replayHeaders ? { replayHeaders: mount.replayHeaders } : {}),
  };
  class AppModule {
    configure(consumer: MiddlewareConsumer) {
      if (mount.consumer) consumer.apply(idemExpress.idempotency(options)).forRoutes(controller);
    }
  }
  Module({ controllers: [controller] })(AppModule);
  let app: INestApplication;
  if (platform === 'express') {
    app = await NestFactory.create(AppModule, { logger: false });
    if (mount.guarded) app.use(idemExpress.guard(edge));
    if (!mount.consumer) app.use(idemExpress.idempotency(options));
    if (mount.guardAfter) app.use(idemExpress.guard(edge));
  } else {
    const fastify = await NestFactory.create<NestFastifyApplication>(AppModule, new FastifyAdapter(), {
      logger: false,
    });
    if (mount.guarded) await fastify.register(idemFastify.authPlugin, { guard: edge });
    if (!mount.consumer) await fastify.register(idemFastify.idempotency, options);
    if (mount.guardAfter) await fastify.register(idemFastify.authPlugin, { guard: edge });
    app = fastify;
  }
  apps.push(app);
  if (mount.prefix) app.setGlobalPrefix(mount.prefix);
  if (mount.filter) app.useGlobalFilters(new IdempotencyExceptionFilter(app.getHttpAdapter()));
  await app.listen(0, '127.0.0.1');
  return { url: await app.getUrl(), runs, app };
}

interface Answer {
  status: number;
  headers: Headers;
  body: Buffer;
  json: () => unknown;
}

async function post(
  url: string,
  key: string,
  body = '{"amount":500,"note":"é"}',
  headers: Record<string, string> = {},
): Promise<Answer> {
  const response = await fetch(url, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      'idempotency-key': `"${key}"`,
      ...headers,
    },
    body,
  });
  const bytes = Buffer.from(await response.arrayBuffer());
  return { status: response.status, headers: response.headers, body: bytes, json: () => JSON.parse(bytes.toString()) };
}

const allowlisted = (headers: Headers) =>
  Object.fromEntries(
    ['content-type', 'content-length', 'content-disposition', 'etag', 'location'].flatMap((name) => {
      const value = headers.get(name);
      return value === null ? [] : [[name, value]];
    }),
  );

describe.each(platforms)('docs/guides/nestjs.md on NestJS %s', (platform) => {
  describe.each(stores)('mounted as the page says, on the %s store', (_name, store) => {
    it('replays byte for byte: the 201 a POST answers, its body and its allowlisted headers', async () => {
      const { url, runs } = await start(platform, { store: store() });
      const first = await post(`${url}/orders`, 'k-201');
      expect(first.status).toBe(201);
      expect(first.headers.get('idempotency-key')).toBe('"k-201"');
      expect(first.json()).toEqual({ id: 'ord_1', body: { amount: 500, note: 'é' } });
      const again = await post(`${url}/orders`, 'k-201');
      expect(again.status).toBe(201);
      expect(again.headers.get('idempotent-replayed')).toBe('true');
      expect(again.headers.get('cache-control')).toBe('no-store');
      expect(again.body.equals(first.body)).toBe(true);
      expect(allowlisted(again.headers)).toEqual(allowlisted(first.headers));
      // Nothing else of the first answer: only what idem adds, and what the server sets on every response.
      const own = ['idempotent-replayed', 'idempotency-key', 'cache-control', 'date', 'connection', 'keep-alive'];
      const server = ['x-powered-by', 'content-length', 'transfer-encoding'];
      const names: string[] = [];
      again.headers.forEach((_value, name) => {
        if (!own.includes(name) && !server.includes(name)) names.push(name);
      });
      expect(names.sort()).toEqual(
        Object.keys(allowlisted(first.headers))
          .filter((n) => n !== 'content-length')
          .sort(),
      );
      expect(runs.count).toBe(1);
    });

    it('keeps an @HttpCode status on replay', async () => {
      const { url, runs } = await start(platform, { store: store() });
      const first = await post(`${url}/orders/accept`, 'k-202');
      expect(first.status).toBe(202);
      const again = await post(`${url}/orders/accept`, 'k-202');
      expect([again.status, again.headers.get('idempotent-replayed')]).toEqual([202, 'true']);
      expect(again.body.equals(first.body)).toBe(true);
      expect(runs.count).toBe(1);
    });

    it('keeps an @HttpCode(204) on replay, with no body', async () => {
      const { url, runs } = await start(platform, { store: store() });
      expect((await post(`${url}/orders/cancel`, 'k-204')).status).toBe(204);
      const again = await post(`${url}/orders/cancel`, 'k-204');
      expect([again.status, again.headers.get('idempotent-replayed'), again.body.length]).toEqual([204, 'true', 0]);
      expect(runs.count).toBe(1);
    });

    it('answers 422 fingerprint_mismatch for another body under the same key', async () => {
      const { url, runs } = await start(platform, { store: store() });
      expect((await post(`${url}/orders`, 'k-422')).status).toBe(201);
      const other = await post(`${url}/orders`, 'k-422', '{"amount":900}');
      expect(other.status).toBe(422);
      expect(other.headers.get('content-type')).toMatch(/^application\/problem\+json/);
      expect(other.json()).toMatchObject({ code: 'fingerprint_mismatch', status: 422 });
      expect(runs.count).toBe(1);
    });

    it('runs the handler once for 20 concurrent duplicates: the others get 409 in_progress or the replay', async () => {
      const { url, runs } = await start(platform, { store: store() });
      let letGo = () => {};
      runs.hold = new Promise<void>((resolve) => {
        letGo = resolve;
      });
      let answered = 0;
      const answers = Array.from({ length: 20 }, () =>
        post(`${url}/orders/slow`, 'k-concurrent').then((answer) => {
          answered++;
          return answer;
        }),
      );
      // The 19 that lost the claim are answered while the winner is held.
      await until(() => answered === 19);
      const whileHeld = answered;
      letGo();
      const all = await Promise.all(answers);
      expect(runs.count).toBe(1);
      const ran = all.filter((a) => a.status === 201 && a.headers.get('idempotent-replayed') === null);
      const busy = all.filter((a) => a.status === 409);
      expect(ran).toHaveLength(1);
      expect(whileHeld).toBe(19);
      for (const answer of busy) {
        expect(answer.json()).toMatchObject({ code: 'in_progress' });
        expect(answer.headers.get('retry-after')).not.toBeNull();
      }
      const replays = all.filter((a) => a.headers.get('idempotent-replayed') === 'true');
      expect(busy.length + replays.length).toBe(19);
      for (const replay of replays) expect(replay.body.equals((ran[0] as Answer).body)).toBe(true);
    });

    it('replays a StreamableFile: its bytes, Content-Type and Content-Disposition (its file name)', async () => {
      const { url, runs } = await start(platform, { store: store() });
      const first = await post(`${url}/orders/file`, 'k-file');
      expect(first.status).toBe(201);
      expect(first.headers.get('content-type')).toBe('application/pdf');
      expect(first.body.toString()).toBe('%PDF-1.7 order 1\n');
      const again = await post(`${url}/orders/file`, 'k-file');
      expect(again.headers.get('idempotent-replayed')).toBe('true');
      expect(again.status).toBe(201);
      expect(again.body.equals(first.body)).toBe(true);
      expect(again.headers.get('content-disposition')).toBe('attachment; filename="order.pdf"');
      expect(allowlisted(again.headers)).toEqual(allowlisted(first.headers));
      expect(runs.count).toBe(1);
    });
  });

  it('replays an @Header() header only when replayHeaders names it', async () => {
    const { url } = await start(platform, { replayHeaders: ['x-order-tag'] });
    const first = await post(`${url}/orders/tagged`, 'k-tag');
    expect([first.headers.get('x-order-tag'), first.headers.get('x-other')]).toEqual(['blue', 'green']);
    const again = await post(`${url}/orders/tagged`, 'k-tag');
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect([again.headers.get('x-order-tag'), again.headers.get('x-other')]).toEqual(['blue', null]);
  });

  it('a thrown HttpException is answered by NestJS and stored as the answer: the retry gets the same 400', async () => {
    const { url, runs } = await start(platform, { storeOutcome: 'stripe', filter: true });
    const first = await post(`${url}/orders/bad`, 'k-400');
    expect(first.status).toBe(400);
    expect(first.json()).toMatchObject({ message: 'amount must be positive' });
    const again = await post(`${url}/orders/bad`, 'k-400');
    expect([again.status, again.headers.get('idempotent-replayed')]).toEqual([400, 'true']);
    expect(again.body.equals(first.body)).toBe(true);
    expect(runs.count).toBe(1);
  });

  it("the page's filter keeps a handler's own thrown NotFoundException: its 404 is replayed", async () => {
    const { url, runs } = await start(platform, { storeOutcome: 'stripe', filter: true, prefix: 'api' });
    expect((await post(`${url}/api/orders/missing`, 'k-own-404')).status).toBe(404);
    const again = await post(`${url}/api/orders/missing`, 'k-own-404');
    expect([again.status, again.headers.get('idempotent-replayed')]).toEqual([404, 'true']);
    expect(runs.count).toBe(1);
  });

  it("a thrown Error under storeOutcome 'stripe': its 500 is stored without the filter, released with it", async () => {
    const bare = await start(platform, { storeOutcome: 'stripe' });
    expect((await post(`${bare.url}/orders/boom`, 'k-500')).status).toBe(500);
    const replayed = await post(`${bare.url}/orders/boom`, 'k-500');
    expect([replayed.status, replayed.headers.get('idempotent-replayed')]).toEqual([500, 'true']);
    expect(bare.runs.count).toBe(1);

    const filtered = await start(platform, { storeOutcome: 'stripe', filter: true });
    expect((await post(`${filtered.url}/orders/boom`, 'k-500')).status).toBe(500);
    const retried = await post(`${filtered.url}/orders/boom`, 'k-500');
    expect([retried.status, retried.headers.get('idempotent-replayed')]).toEqual([500, null]);
    expect(filtered.runs.count).toBe(2);
  });

  it('after the guard, keys are scoped by the verified caller: A replays, B runs on its own', async () => {
    const { url, runs } = await start(platform, { guarded: true });
    const as = async (sub: string) => ({ authorization: `Bearer ${await token(sub)}` });
    const alice = await post(`${url}/orders`, 'shared', undefined, await as('alice'));
    expect(alice.status).toBe(201);
    expect(
      (await post(`${url}/orders`, 'shared', undefined, await as('alice'))).headers.get('idempotent-replayed'),
    ).toBe('true');
    const bob = await post(`${url}/orders`, 'shared', undefined, await as('bob'));
    expect([bob.status, bob.headers.get('idempotent-replayed')]).toEqual([201, null]);
    expect((await post(`${url}/orders`, 'shared')).status).toBe(401);
    expect(runs.count).toBe(2);
  });

  it('with neither a guard before it nor a scope, every keyed request is 500 scope_missing and nothing runs', async () => {
    const { url, runs } = await start(platform, { scope: null });
    const answer = await post(`${url}/orders`, 'k-unscoped');
    expect(answer.status).toBe(500);
    expect(answer.json()).toMatchObject({ code: 'scope_missing' });
    expect(runs.count).toBe(0);
  });

  it(
    platform === 'express'
      ? 'app.use(idempotency) before app.use(guard): no caller yet, so 500 scope_missing and nothing runs'
      : 'authPlugin registered after idempotency still scopes the keys: its onRequest hook runs before idem',
    async () => {
      const { url, runs } = await start(platform, { guardAfter: true });
      const alice = { authorization: `Bearer ${await token('alice')}` };
      const answer = await post(`${url}/orders`, 'k-order', undefined, alice);
      if (platform === 'express') {
        expect([answer.status, (answer.json() as { code: string }).code]).toEqual([500, 'scope_missing']);
        expect(runs.count).toBe(0);
      } else {
        expect(answer.status).toBe(201);
        expect((await post(`${url}/orders`, 'k-order', undefined, alice)).headers.get('idempotent-replayed')).toBe(
          'true',
        );
        const bob = { authorization: `Bearer ${await token('bob')}` };
        expect((await post(`${url}/orders`, 'k-order', undefined, bob)).headers.get('idempotent-replayed')).toBeNull();
        expect(runs.count).toBe(2);
      }
    },
  );

  it('@idem/express through a MiddlewareConsumer also works: replay, 422, one run', async () => {
    const { url, runs } = await start(platform, { consumer: true });
    const first = await post(`${url}/orders`, 'k-consumer');
    expect(first.status).toBe(201);
    const again = await post(`${url}/orders`, 'k-consumer');
    expect([again.status, again.headers.get('idempotent-replayed')]).toEqual([201, 'true']);
    expect(again.body.equals(first.body)).toBe(true);
    expect((await post(`${url}/orders`, 'k-consumer', '{"amount":900}')).status).toBe(422);
    expect(runs.count).toBe(1);
    expect(runs.bodies).toEqual([{ amount: 500, note: 'é' }]);
  });
});

describe('docs/guides/nestjs.md: what each mount takes as the operation and the body', () => {
  const form = { 'content-type': 'application/x-www-form-urlencoded' };

  // `b=2` and `b=%32` are other bytes of one form: NestJS's urlencoded parser makes the same fields of both.
  it('on Express, app.use runs before the NestJS body parser: the raw bytes are fingerprinted, and the handler still gets the parsed body', async () => {
    const { url, runs } = await start('express');
    expect((await post(`${url}/orders`, 'k-form', 'a=1&b=2', form)).status).toBe(201);
    expect((await post(`${url}/orders`, 'k-form', 'a=1&b=%32', form)).status).toBe(422);
    expect(runs.bodies).toEqual([{ a: '1', b: '2' }]);
  });

  it('on Express, through a MiddlewareConsumer it runs after the parser and fingerprints the parsed req.body', async () => {
    const { url, runs } = await start('express', { consumer: true });
    expect((await post(`${url}/orders`, 'k-form', 'a=1&b=2', form)).status).toBe(201);
    const again = await post(`${url}/orders`, 'k-form', 'a=1&b=%32', form);
    expect([again.status, again.headers.get('idempotent-replayed')]).toEqual([201, 'true']);
    expect(runs.count).toBe(1);
  });

  it.each([
    ['fastify', {}],
    ['express', { consumer: true }],
  ] as const)(
    "on %s (%o), the operation is the route template: a key reused for another order's refund is 422",
    async (platform, mount) => {
      const { url, runs } = await start(platform, mount);
      expect((await post(`${url}/orders/1/refunds`, 'k-refund')).status).toBe(201);
      expect((await post(`${url}/orders/2/refunds`, 'k-refund')).json()).toMatchObject({
        code: 'fingerprint_mismatch',
      });
      expect(runs.count).toBe(1);
    },
  );

  it('on Fastify, @idem/express through a MiddlewareConsumer takes the concrete path: that reuse runs', async () => {
    const { url, runs } = await start('fastify', { consumer: true });
    expect((await post(`${url}/orders/1/refunds`, 'k-refund')).status).toBe(201);
    const other = await post(`${url}/orders/2/refunds`, 'k-refund');
    expect([other.status, other.headers.get('idempotent-replayed')]).toEqual([201, null]);
    expect(runs.count).toBe(2);
  });

  it("on Express with setGlobalPrefix, an unknown path's 404 is stored without the filter, released with it", async () => {
    const bare = await start('express', { prefix: 'api' });
    expect((await post(`${bare.url}/api/nowhere`, 'k-404')).status).toBe(404);
    expect((await post(`${bare.url}/api/nowhere`, 'k-404')).headers.get('idempotent-replayed')).toBe('true');

    const filtered = await start('express', { prefix: 'api', filter: true });
    expect((await post(`${filtered.url}/api/nowhere`, 'k-404')).status).toBe(404);
    expect((await post(`${filtered.url}/api/nowhere`, 'k-404')).headers.get('idempotent-replayed')).toBeNull();
    // A route's own answers are still kept behind the prefix.
    expect((await post(`${filtered.url}/api/orders`, 'k-201')).status).toBe(201);
    expect((await post(`${filtered.url}/api/orders`, 'k-201')).headers.get('idempotent-replayed')).toBe('true');
  });

  it.each([
    ['express', undefined],
    ['fastify', undefined],
    ['fastify', 'api'],
  ] as const)(
    'on %s (global prefix: %s), without the filter, an unknown path is not stored',
    async (platform, prefix) => {
      const { url } = await start(platform, prefix ? { prefix } : {});
      const path = prefix ? `/${prefix}/nowhere` : '/nowhere';
      expect((await post(`${url}${path}`, 'k-404')).status).toBe(404);
      const again = await post(`${url}${path}`, 'k-404');
      expect([again.status, again.headers.get('idempotent-replayed')]).toEqual([404, null]);
    },
  );
});

describe('docs/guides/nestjs.md, the page itself', () => {
  it('says its claims are run by this file, on the NestJS installed here', () => {
    const [major, minor] = nestVersion.split('.');
    const intro = page.slice(0, page.indexOf('\n## '));
    expect(intro.replace(/\s+/g, ' ')).toContain(
      `run by \`docs/test/nestjs-guide.int.test.ts\` on NestJS ${major}.${minor} on both platforms`,
    );
  });

  it("the filter run here is the page's, line for line", () => {
    const block = /```ts\n(import[^\n]*@nestjs\/common[\s\S]*?)```/.exec(page)?.[1] ?? '';
    const body = block.slice(block.indexOf('catch('), block.indexOf('super.catch'));
    const lines = body
      .split('\n')
      .slice(1)
      .map((line) => line.trim())
      .filter(Boolean);
    expect(lines.length).toBeGreaterThan(3);
    for (const line of lines) expect(thisFile).toContain(line);
  });
});

// Audit of docs/webhooks.md and docs/guides/queues.md against behaviour: the claims of those pages
// that no other test pins (packages/webhooks/test/docs-claims*.ts, the *.audit.* files, the queue
// tests and docs/test/documented-defaults.test.ts pin the rest). One describe per page section.
// Real HTTP servers on port 0, real PostgreSQL for the outbox, injected clocks.
import { createServer, type IncomingMessage, type Server } from 'node:http';
import { createIdempotency, type IdempotencyEngine, makeIdempotent, memoryStore, type Store } from '@idem/core';
import { postgresAnswers, serviceAvailable } from '@idem/testkit';
import {
  createOutbox,
  createReceiver,
  createSender,
  createSigner,
  createVerifier,
  generateSecret,
  koaWebhook,
  type ReceiverEvent,
  sign,
  verify,
  WebhookError,
  webhookErrorTable,
} from '@idem/webhooks';
import Koa from 'koa';
import pg from 'pg';
import { Webhook } from 'standardwebhooks';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { listen } from '../../packages/core/test/support/timeouts-kit.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const withPostgres = serviceAvailable(
  `PostgreSQL at ${databaseUrl}`,
  await postgresAnswers(databaseUrl),
  'the webhooks page audit on PostgreSQL',
);

const closers: (() => Promise<void>)[] = [];
afterEach(async () => {
  while (closers.length) await closers.pop()?.();
});

/** Serves `server` on port 0 until the test ends; the URL of its /hooks path. */
async function serveHooks(server: Server): Promise<string> {
  const { url, close } = await listen(server);
  closers.push(close);
  return `${url}/hooks`;
}

async function readAll(request: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of request) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

describe('## Signing and verifying', () => {
  const body = Buffer.from('{"type":"payment.succeeded"}');
  const at = 1_767_225_600;

  // docs/webhooks.md, the paragraph after the first example: "The `sign()` and `verify()` functions take the
  // same options as the factories".
  it('sign() and verify() take the factories options: several secrets, tolerance and now', () => {
    const other = generateSecret('v1');
    if (other.version !== 'v1') throw new Error('unreachable');
    const secrets = [SECRET, other.secret];
    const headers = sign({ secret: secrets, id: 'msg_1', body, timestamp: at });
    expect(headers).toEqual(createSigner({ secret: secrets }).sign({ id: 'msg_1', body, timestamp: at }));
    expect(headers['webhook-signature'].split(' ')).toHaveLength(2);
    const now = () => (at + 30) * 1000;
    expect(verify({ secret: other.secret, tolerance: '1m', now, headers, body }).ok).toBe(true);
    const late = verify({ secret: other.secret, tolerance: '10s', now, headers, body });
    expect(late.ok === false && late.error.code).toBe('timestamp_too_old');
  });

  // docs/webhooks.md, the first example and the **Secrets.** table: generateSecret('v1a') gives a whsk_/whpk_
  // pair; a whsk_ key signs "(and verify)"; a whpk_ key verifies only. The v1 secret is whsec_ and 24 to 64
  // bytes.
  it('generateSecret: a v1a pair whose private key signs and verifies, whose public key verifies only', () => {
    const pair = generateSecret('v1a');
    expect(pair).toEqual({
      version: 'v1a',
      privateKey: expect.stringMatching(/^whsk_/),
      publicKey: expect.stringMatching(/^whpk_/),
    });
    if (pair.version !== 'v1a') throw new Error('unreachable');
    const headers = createSigner({ secret: pair.privateKey }).sign({ id: 'msg_1', body, timestamp: at });
    expect(headers['webhook-signature']).toMatch(/^v1a,/);
    const now = () => at * 1000;
    for (const secret of [pair.privateKey, pair.publicKey]) {
      const result = createVerifier({ secret, now }).verify({ headers, body });
      expect(result.ok && result.webhook.version).toBe('v1a');
    }
    const v1 = generateSecret();
    if (v1.version !== 'v1') throw new Error('unreachable');
    expect(v1.secret).toMatch(/^whsec_/);
    const bytes = Buffer.from(v1.secret.slice('whsec_'.length), 'base64').length;
    expect(bytes).toBeGreaterThanOrEqual(24);
    expect(bytes).toBeLessThanOrEqual(64);
  });

  // docs/webhooks.md, the **Secrets.** table: "`whsec_<base64>` (or bare base64, or a `Uint8Array`)": one
  // key, three forms.
  it('a whsec_ secret, its bare base64 and its bytes are one key', () => {
    const base64 = SECRET.slice('whsec_'.length);
    const signatures = [SECRET, base64, new Uint8Array(Buffer.from(base64, 'base64'))].map(
      (secret) => createSigner({ secret }).sign({ id: 'msg_1', body, timestamp: at })['webhook-signature'],
    );
    expect(new Set(signatures).size).toBe(1);
  });

  // docs/webhooks.md, **Timestamp tolerance.**: "The check runs before any signature work and before any
  // store access".
  it('a stale timestamp is refused as too old before the signature is looked at, and the store is never asked', async () => {
    let storeCalls = 0;
    const inner = memoryStore();
    const counting = new Proxy(inner, {
      get(target, name, receiver) {
        const value = Reflect.get(target, name, receiver);
        if (typeof value !== 'function') return value;
        return (...args: unknown[]) => {
          storeCalls++;
          return (value as (...a: unknown[]) => unknown).apply(target, args);
        };
      },
    }) as Store;
    const now = () => (at + 3600) * 1000;
    const receiver = createReceiver({
      store: counting,
      secret: SECRET,
      now,
      apply: () => undefined,
      onWarning: () => undefined,
    });
    storeCalls = 0;
    const response = await receiver.handle({
      headers: { 'webhook-id': 'msg_1', 'webhook-timestamp': String(at), 'webhook-signature': 'v1,AAAA' },
      body,
    });
    expect(response.outcome).toBe('rejected');
    expect(JSON.parse(Buffer.from(response.body).toString()).code).toBe('timestamp_too_old');
    expect(storeCalls).toBe(0);
  });
  // docs/webhooks.md, **Strict headers.**, after the refused timestamps `1700000000abc`, ` 1700000000`,
  // `1.7e9` and `-5`. Was: "The reference libraries parse the timestamp with `parseInt` and accept all of
  // these inputs". parseInt reads `1.7e9` as 1 and `-5` as -5, which the standardwebhooks package then
  // refuses as too old: it accepts the first two (the signature covers the number it parsed, not the text
  // sent), not all four.
  it('the standardwebhooks package accepts a timestamp with trailing text or a leading space, and refuses 1.7e9 and -5 as too old', () => {
    const reference = new Webhook(SECRET);
    const seconds = Math.floor(Date.now() / 1000);
    const payload = '{"type":"payment.succeeded"}';
    const signature = reference.sign('msg_1', new Date(seconds * 1000), payload);
    const deliver = (timestamp: string) => {
      try {
        reference.verify(payload, {
          'webhook-id': 'msg_1',
          'webhook-timestamp': timestamp,
          'webhook-signature': signature,
        });
        return 'accepted';
      } catch (error) {
        return (error as Error).message;
      }
    };
    expect(deliver(`${seconds}abc`)).toBe('accepted');
    expect(deliver(` ${seconds}`)).toBe('accepted');
    expect(deliver('1.7e9')).toBe('Message timestamp too old');
    expect(deliver('-5')).toBe('Message timestamp too old');
    // Ours refuses all four as malformed.
    const ours = createVerifier({ secret: SECRET });
    for (const timestamp of [`${seconds}abc`, ` ${seconds}`, '1.7e9', '-5']) {
      const result = ours.verify({
        headers: { 'webhook-id': 'msg_1', 'webhook-timestamp': timestamp, 'webhook-signature': signature },
        body: payload,
      });
      expect(result.ok === false && result.error.code, timestamp).toBe('header_invalid');
    }
  });

  // docs/webhooks.md, **Bytes, not text.**: "`standardwebhooks` ... decode[s] lossily and accept[s] that
  // swap": its signature over a body with byte 0xff (decoded to U+FFFD) verifies the body with 0xfe there
  // too. Ours, over the same headers, refuses it.
  it('the standardwebhooks package takes its signature over 0xff for a body with 0xfe; ours refuses it', () => {
    const reference = new Webhook(SECRET);
    const seconds = Math.floor(Date.now() / 1000);
    const signed = Buffer.from([0x7b, 0xff, 0x7d]);
    const swapped = Buffer.from([0x7b, 0xfe, 0x7d]);
    const headers = {
      'webhook-id': 'msg_1',
      'webhook-timestamp': String(seconds),
      'webhook-signature': reference.sign('msg_1', new Date(seconds * 1000), signed),
    };
    expect(() => reference.verify(swapped, headers, { jsonParse: false })).not.toThrow();
    const result = createVerifier({ secret: SECRET }).verify({ headers, body: swapped });
    expect(result.ok === false && result.error.code).toBe('signature_mismatch');
  });

  // docs/webhooks.md, **Interoperability.**: the two interoperate "for bodies that are valid UTF-8: over
  // other bytes `standardwebhooks` signs and checks its lossy decoding, so neither side verifies the other's
  // signature".
  it('over a body that is not UTF-8, neither verifies the other; over UTF-8 each does (the control)', () => {
    const reference = new Webhook(SECRET);
    const seconds = Math.floor(Date.now() / 1000);
    const ours = createVerifier({ secret: SECRET });
    const signer = createSigner({ secret: SECRET });
    for (const [body, agree] of [
      [Buffer.from('{"note":"Zoë"}'), true],
      [Buffer.from([0x7b, 0xff, 0x7d]), false],
    ] as const) {
      const theirs = {
        'webhook-id': 'msg_1',
        'webhook-timestamp': String(seconds),
        'webhook-signature': reference.sign('msg_1', new Date(seconds * 1000), body),
      };
      expect(ours.verify({ headers: theirs, body }).ok).toBe(agree);
      const headers = signer.sign({ id: 'msg_1', body, timestamp: seconds });
      const accepted = (() => {
        try {
          reference.verify(body, headers, { jsonParse: false });
          return true;
        } catch {
          return false;
        }
      })();
      expect(accepted).toBe(agree);
    }
  });
});

describe('## Receiving', () => {
  const body = Buffer.from('{"data":{"id":"pay_1","amount":5}}');

  // docs/webhooks.md, ## Receiving (`handle()` returns `{ status, headers, body, outcome, id }`) and its
  // **Events.** table: `id` once the headers were verified (a `rejected` event has none), `code` of a
  // rejected delivery is the verification code, `at` is the receiver's `now`.
  it("onEvent: at is the receiver's now, a rejected event has no id and the verification code", async () => {
    let clock = 1_767_225_600_000;
    const events: ReceiverEvent[] = [];
    const receiver = createReceiver({
      store: memoryStore({ now: () => clock }),
      secret: SECRET,
      now: () => clock,
      apply: () => undefined,
      onEvent: (event) => events.push(event),
    });
    const headers = createSigner({ secret: SECRET }).sign({ id: 'evt_1', body, timestamp: new Date(clock) });
    const applied = await receiver.handle({ headers, body });
    expect(Object.keys(applied).sort()).toEqual(['body', 'headers', 'id', 'outcome', 'status']);
    expect(applied).toMatchObject({ status: 200, outcome: 'applied', id: 'evt_1' });
    clock += 1234;
    const rejected = await receiver.handle({ headers, body: Buffer.from('{}') });
    expect(rejected.outcome).toBe('rejected');
    expect(rejected.id).toBeUndefined();
    expect(events).toEqual([
      { type: 'applied', id: 'evt_1', at: 1_767_225_600_000 },
      // With the verifier's error, whose details say how long the body received was.
      {
        type: 'rejected',
        code: 'signature_mismatch',
        at: 1_767_225_601_234,
        error: expect.objectContaining({
          code: 'signature_mismatch',
          details: expect.objectContaining({ bodyBytes: 2 }),
        }),
      },
    ]);
  });
});

describe('## Raw body per framework (Koa)', () => {
  const body = Buffer.from('{"data":{"id":"pay_1"}}');

  async function koaServer(receiverApply: () => void, before: (ctx: Koa.Context) => void) {
    const receiver = createReceiver({
      store: memoryStore(),
      secret: SECRET,
      apply: receiverApply,
      onWarning: () => undefined,
    });
    const app = new Koa();
    app.use(async (ctx, next) => {
      before(ctx);
      await next();
    });
    const misconfigured: WebhookError[] = [];
    app.use(koaWebhook(receiver, { path: '/hooks', onMisconfigured: (error) => misconfigured.push(error) }));
    const url = await serveHooks(createServer(app.callback()));
    return { url, misconfigured };
  }

  const post = (url: string) =>
    fetch(url, {
      method: 'POST',
      headers: {
        ...createSigner({ secret: SECRET }).sign({ id: 'evt_k', body, timestamp: new Date() }),
        'content-type': 'application/json',
      },
      body,
    });

  // docs/webhooks.md, ## Raw body per framework, **Koa.**: "`ctx.request.rawBody` from `@koa/bodyparser` is
  // never trusted: it is a decoded string". A parser ran (its object and its rawBody are there, the stream
  // drained): refused, whatever rawBody holds, even the exact bytes.
  it('fails closed under a parsed body even when rawBody holds the exact text', async () => {
    let applied = 0;
    const { url, misconfigured } = await koaServer(
      () => void applied++,
      (ctx) => {
        ctx.req.resume();
        const request = ctx.request as unknown as { body: unknown; rawBody: string };
        request.body = JSON.parse(body.toString());
        request.rawBody = body.toString();
      },
    );
    const response = await post(url);
    expect(response.status).toBe(500);
    expect((await response.json()).code).toBe('raw_body_required');
    expect(applied).toBe(0);
    expect(misconfigured).toHaveLength(1);
  });

  // docs/webhooks.md, **Koa.**, as corrected: a Buffer that a raw parser left in ctx.request.body is the
  // exact bytes (as with express.raw()), and is taken; anything else set there fails closed.
  it('takes a Buffer a raw parser left in ctx.request.body, as Express takes express.raw()', async () => {
    let applied = 0;
    const { url } = await koaServer(
      () => void applied++,
      (ctx) => {
        ctx.req.resume();
        (ctx.request as unknown as { body: unknown }).body = Buffer.from(body);
      },
    );
    const response = await post(url);
    expect(response.status).toBe(200);
    expect(applied).toBe(1);
  });
});

describe('## Sending', () => {
  // docs/webhooks.md, ## Sending, **Giving up.**: "Each attempt record holds its number, start time, signed
  // timestamp, duration, result, status, `Retry-After`, the first KiB of the response body and the wait that
  // followed."
  it('an attempt record holds each field the page lists', async () => {
    let calls = 0;
    const url = await serveHooks(
      createServer(async (request, response) => {
        await readAll(request);
        calls++;
        if (calls === 1) response.writeHead(503, { 'retry-after': '7' }).end('down for maintenance');
        else response.writeHead(204).end();
      }),
    );
    let clock = 1_767_225_600_500;
    const slept: number[] = [];
    const sender = createSender({
      secret: SECRET,
      now: () => clock,
      random: () => 0,
      sleep: async (ms) => {
        slept.push(ms);
        clock += ms;
      },
    });
    const result = await sender.send({ url, id: 'evt_rec', body: '{}' });
    expect(result.outcome).toBe('delivered');
    const [first, second] = result.attempts;
    expect(first).toEqual({
      attempt: 1,
      startedAt: 1_767_225_600_500,
      timestamp: 1_767_225_600,
      durationMs: expect.any(Number),
      result: 'failed',
      status: 503,
      retryAfterMs: 7000,
      responseBody: 'down for maintenance',
      waitMs: 7000,
    });
    expect(slept).toEqual([7000]);
    expect(second).toMatchObject({
      attempt: 2,
      startedAt: 1_767_225_607_500,
      timestamp: 1_767_225_607,
      result: 'delivered',
      status: 204,
    });
  });

  // docs/webhooks.md, ## Sending, **A message no attempt could send.**: "`send()` rejects with a `TypeError`
  // before any request goes out: ... (or a header value that is not a string; ...), a `contentType` that is
  // not a string".
  it('send() refuses a header value or a contentType that is not a string, before any request', async () => {
    let requests = 0;
    const url = await serveHooks(
      createServer((request, response) => {
        requests++;
        request.resume();
        response.end();
      }),
    );
    const sender = createSender({ secret: SECRET });
    await expect(
      sender.send({ url, id: 'evt_h', body: '{}', headers: { 'x-n': 5 as unknown as string } }),
    ).rejects.toBeInstanceOf(TypeError);
    await expect(
      sender.send({ url, id: 'evt_c', body: '{}', contentType: 5 as unknown as string }),
    ).rejects.toBeInstanceOf(TypeError);
    expect(requests).toBe(0);
  });
});

describe.skipIf(!withPostgres)('## The transactional outbox (PostgreSQL)', () => {
  let pool: pg.Pool;
  beforeAll(() => {
    pool = new pg.Pool({ connectionString: databaseUrl, max: 4 });
    pool.on('error', () => undefined);
  });
  afterAll(async () => {
    await pool?.end();
  });
  const tables: string[] = [];
  afterEach(async () => {
    while (tables.length) await pool.query(`DROP TABLE IF EXISTS "${tables.pop()}"`);
  });
  const fresh = (label: string) => {
    const name = `audit_webhooksdoc_${label}_${Math.random().toString(16).slice(2, 10)}`;
    tables.push(name);
    return name;
  };

  // docs/webhooks.md, "The table has these columns": the columns, and five partial indexes with their columns
  // and predicates.
  it('migrate() makes exactly the columns and the five partial indexes the page lists', async () => {
    const table = fresh('cols');
    await createOutbox({ table }).migrate(pool);
    const { rows: columns } = await pool.query(
      `SELECT column_name FROM information_schema.columns WHERE table_name = $1 ORDER BY ordinal_position`,
      [table],
    );
    expect(columns.map((c) => c.column_name)).toEqual([
      'id',
      'url',
      'body',
      'content_type',
      'headers',
      'status',
      'attempts',
      'claims',
      'created_at',
      'requeued_at',
      'next_attempt_at',
      'locked_until',
      'locked_by',
      'delivered_at',
      'dead_reason',
      'dead_at',
      'last_attempt',
      'history',
    ]);
    const { rows: bodyType } = await pool.query(
      `SELECT data_type FROM information_schema.columns WHERE table_name = $1 AND column_name = 'body'`,
      [table],
    );
    expect(bodyType[0].data_type).toBe('bytea');
    const { rows: indexes } = await pool.query(
      `SELECT indexname, indexdef FROM pg_indexes WHERE tablename = $1 AND indexname <> $1 || '_pkey' ORDER BY indexname`,
      [table],
    );
    const shape = indexes.map((i) => [
      i.indexname.slice(table.length),
      /\((.*?)\) WHERE \(status = '(\w+)'/.exec(i.indexdef)?.slice(1),
    ]);
    expect(shape).toEqual([
      ['_dead', ['created_at, id', 'dead']],
      ['_dead_at', ['dead_at, next_attempt_at', 'dead']],
      ['_delivered', ['delivered_at', 'delivered']],
      ['_due', ['next_attempt_at', 'pending']],
      ['_url', ['url, next_attempt_at', 'pending']],
    ]);
  });

  // docs/webhooks.md, ## The transactional outbox (PostgreSQL), the `add(tx, event)` item (`id` defaults to
  // `evt_<uuid>`; an object body is sent as its JSON) and the options table: `table` defaults to
  // 'idem_webhook_outbox'; `relayId` is a random UUID.
  it('add(): an evt_<uuid> id, an object body sent as its JSON; the default table and relayId', async () => {
    expect(createOutbox().table).toBe('idem_webhook_outbox');
    const table = fresh('add');
    const outbox = createOutbox({ table });
    await outbox.migrate(pool);
    const received: { id: string; type: string; body: string }[] = [];
    const url = await serveHooks(
      createServer(async (request, response) => {
        const bytes = await readAll(request);
        received.push({
          id: String(request.headers['webhook-id']),
          type: String(request.headers['content-type']),
          body: bytes.toString(),
        });
        response.end();
      }),
    );
    const { id, added } = await outbox.add(pool, { url, body: { type: 'order.paid', order: 'ord_7' } });
    expect(added).toBe(true);
    expect(id).toMatch(/^evt_[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    const relay = outbox.relay({ db: pool, sender: createSender({ secret: SECRET }) });
    expect(relay.relayId).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    // docs/webhooks.md, the `runOnce()` item: "`runOnce()` resolves to what the round did: `{ claimed,
    // delivered, retrying, dead, fenced }`".
    expect(await relay.runOnce()).toEqual({ claimed: 1, delivered: 1, retrying: 0, dead: 0, fenced: 0 });
    expect(received).toEqual([{ id, type: 'application/json', body: '{"type":"order.paid","order":"ord_7"}' }]);
  });

  // docs/webhooks.md, the paragraph on an endpoint that says it is overloaded, as corrected: "a 429, or any
  // failed answer with a `Retry-After`" holds the URL's other waiting rows. Was "any answer": a 2xx that
  // carries a `Retry-After` is a delivery, and holds nothing.
  it('a 2xx with a Retry-After holds none of the URL’s other rows; a 503 with one does (the control)', async () => {
    const table = fresh('hold');
    const outbox = createOutbox({ table });
    await outbox.migrate(pool);
    let status = 200;
    const url = await serveHooks(
      createServer(async (request, response) => {
        await readAll(request);
        response.writeHead(status, { 'retry-after': '3600' }).end();
      }),
    );
    const relay = outbox.relay({ db: pool, sender: createSender({ secret: SECRET }), batchSize: 1 });
    const waiting = async () =>
      (
        await pool.query(
          `SELECT id FROM "${table}" WHERE status = 'pending' AND next_attempt_at > now() + interval '30 minutes' ORDER BY id`,
        )
      ).rows.map((row) => row.id);
    for (const id of ['evt_a', 'evt_b', 'evt_c']) await outbox.add(pool, { id, url, body: '{}' });
    await pool.query(
      `UPDATE "${table}" SET next_attempt_at = now() - (CASE id WHEN 'evt_a' THEN 2 ELSE 1 END) * interval '1 second'`,
    );
    expect(await relay.runOnce()).toMatchObject({ claimed: 1, delivered: 1 });
    expect(await waiting()).toEqual([]);
    status = 503;
    expect(await relay.runOnce()).toMatchObject({ claimed: 1, retrying: 1 });
    // The row answered and the one left: both put off by the hour the endpoint asked for.
    expect(await waiting()).toEqual(['evt_b', 'evt_c']);
  });

  // docs/webhooks.md, the `requeue(db, id)` item: "puts a dead row back to pending". What it does with a row
  // that is not dead, and what it resolves to, the page did not say then (it does now): it changes nothing
  // and resolves to false (true when it requeued).
  it('requeue() of a row that is not dead changes nothing and resolves to false', async () => {
    const table = fresh('requeue');
    const outbox = createOutbox({ table });
    await outbox.migrate(pool);
    await outbox.add(pool, { id: 'evt_p', url: 'https://example.invalid/hooks', body: '{}' });
    await pool.query(`UPDATE "${table}" SET next_attempt_at = now() + interval '1 hour', attempts = 3`);
    expect(await outbox.requeue(pool, 'evt_p')).toBe(false);
    expect(await outbox.requeue(pool, 'evt_unknown')).toBe(false);
    const { rows } = await pool.query(`SELECT attempts, requeued_at, next_attempt_at > now() AS later FROM "${table}"`);
    expect(rows).toEqual([{ attempts: 3, requeued_at: null, later: true }]);
  });
});

describe('## Errors', () => {
  // docs/webhooks.md, ## Errors: "`toProblem()`, which gives an RFC 9457 body whose `type` is
  // `https://idem.dev/problems/<code with - for _>`" for every code of the table.
  it('every code of the table has its problem type, and the statuses the table gives', () => {
    const documented: Record<string, number | 'thrown'> = {
      headers_missing: 400,
      header_invalid: 400,
      timestamp_too_old: 400,
      timestamp_too_new: 400,
      signature_unsupported: 400,
      signature_mismatch: 400,
      event_id_reused: 422,
      body_too_large: 413,
      body_encoding_unsupported: 415,
      body_incomplete: 400,
      apply_failed: 500,
      raw_body_required: 500,
      secret_invalid: 'thrown',
      event_id_contended: 'thrown',
      relay_round_timeout: 'thrown',
    };
    expect(Object.keys(webhookErrorTable).sort()).toEqual(Object.keys(documented).sort());
    for (const [code, status] of Object.entries(documented)) {
      const error = new WebhookError(code as keyof typeof webhookErrorTable, 'x');
      expect(error.toProblem().type).toBe(`https://idem.dev/problems/${code.replaceAll('_', '-')}`);
      if (status !== 'thrown') expect(error.status, code).toBe(status);
    }
  });
});

describe('docs/guides/queues.md: Lost lease', () => {
  // docs/guides/queues.md, ## Settings for consumers, **Lost lease.**: "one that finishes anyway has made its
  // effect, and the wrapper acks it": the wrapper resolves with the result; a redelivery that came after gets
  // it too (nobody had taken the key over).
  it('a handler that finishes past its lost lease resolves with its result; the redelivery gets it without running', async () => {
    const engine: IdempotencyEngine = createIdempotency({
      store: memoryStore(),
      storeOutcome: 'stripe',
      lease: '400ms',
      maxExecution: '100ms',
    });
    let runs = 0;
    const handle = makeIdempotent(
      async (_order: { id: string }, run) => {
        runs++;
        await new Promise<void>((resolve) => run.signal.addEventListener('abort', () => resolve(), { once: true }));
        return { charged: true };
      },
      { engine, operation: 'processOrder', key: (order) => order.id, payload: (order) => JSON.stringify(order) },
    );
    const order = { id: `order-${Math.random()}` };
    await expect(handle(order)).resolves.toEqual({ charged: true });
    await expect(handle(order)).resolves.toEqual({ charged: true });
    expect(runs).toBe(1);
  });
});

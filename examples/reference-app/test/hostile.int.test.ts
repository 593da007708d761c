// Hostile input against the whole resource side of the reference app (gateway, API, receiver and its
// admin API), through the gateway as a real caller would reach it, with a valid admin token and with
// broken ones. DESIGN's rule: bad input gets a clear error, never a 500, a hang or a lost record. So
// every answer must come within the time limit, below 500, and every refusal must be the README's
// problem+json with a stable `code` and the status it states. fast-check generates the paths, query
// strings, content types, bodies and Idempotency-Key values; a failure prints the shrunk request.
import { randomUUID } from 'node:crypto';
import { Agent } from 'node:http';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type HostileAnswer, type HostileRequest, sendHostile } from './hostile-send.js';
import { startTestStack, type TestStack } from './test-stack.js';

const limitMs = 5000;
let test: TestStack;
let adminToken: string;
let answered = 0;
/** How often each status came back, to show the input reached past the first refusals. */
const statuses: Record<number, number> = {};

beforeAll(async () => {
  test = await startTestStack('hostile');
  adminToken = await test.token({ roles: ['admin'] });
}, 60_000);
afterAll(async () => {
  await test?.close();
  console.info(`[figures] hostile reference-app requests ${JSON.stringify({ answered, statuses })}`);
});

type Hostile = HostileRequest;

interface Answer extends HostileAnswer {
  replayed: boolean;
}

/**
 * Sends `input` to `base` (the gateway unless named), counting its status; each request has a
 * connection of its own unless `agent` pools them.
 */
async function send(
  input: Hostile,
  base = test.stack.gateway.url,
  agent: Agent | false = false,
): Promise<Answer | undefined> {
  const answer = await sendHostile(input, base, { limitMs, agent });
  if (!answer) return undefined;
  answered++;
  statuses[answer.status] = (statuses[answer.status] ?? 0) + 1;
  return { ...answer, replayed: answer.headers['idempotent-replayed'] === 'true' };
}

/** The rule every answer keeps: no 5xx, and a refusal is a problem document that names its code. */
function expectClearAnswer(answer: Answer, input: Hostile): void {
  const where = `${input.method} ${input.path}`;
  expect(answer.status, where).toBeGreaterThanOrEqual(200);
  expect(answer.status, `${where} answered ${answer.status}: ${answer.text.slice(0, 300)}`).toBeLessThan(500);
  // A HEAD answer has the head of the GET's, no body.
  if (answer.status < 400 || input.method === 'HEAD') return;
  expect(answer.contentType, where).toMatch(/^application\/problem\+json/);
  const problem = JSON.parse(answer.text) as { status?: unknown; code?: unknown; type?: unknown };
  expect(problem.status, where).toBe(answer.status);
  expect(problem.code, where).toMatch(/^[a-z][a-z0-9_]*$/);
}

// Path segments as a client could send them: printable text percent-encoded or not, encodings
// that do not decode, traversal, NULs, and very long ones.
const segment = fc.oneof(
  fc.string({ maxLength: 40 }).map((text) => encodeURIComponent(text)),
  fc.constantFrom('%', '%zz', '%00', '%E0%A4%A', '..', '%2e%2e', '%2F', 'evt_', ' ', '%C0%AF', '~', '@', ';x=1'),
  fc.string({ unit: 'grapheme-ascii', maxLength: 20 }).map((text) => text.replace(/[\s#?/]/g, '_') || '_'),
  fc.nat({ max: 4000 }).map((length) => 'a'.repeat(length)),
);

const query = fc.oneof(
  fc.constant(''),
  fc.string({ maxLength: 40 }).map((text) => `?item=${encodeURIComponent(text)}`),
  fc.constantFrom('?', '?item', '?item=', '?item=%', '?item=a&item=b', '?item[]=a', '?item[x]=1', '?=&&=', '?%zz=1'),
  fc.nat({ max: 9000 }).map((length) => `?item=${'x'.repeat(length)}`),
);

// Every route the stack serves, with the parts a caller controls left to the generator.
const route = fc.oneof(
  fc.constant(['POST', '/charges']),
  fc.constant(['POST', '/photos']),
  fc.constant(['GET', '/photos']),
  segment.map((id) => ['DELETE', `/photos/${id}`]),
  fc.constant(['GET', '/settings']),
  fc.constant(['PUT', '/settings']),
  fc.constant(['GET', '/stock']),
  fc.constant(['POST', '/stock/batch']),
  segment.map((item) => ['PUT', `/stock/${item}`]),
  fc.constant(['GET', '/webhook-events']),
  segment.map((id) => ['GET', `/webhook-events/${id}`]),
  segment.map((id) => ['POST', `/webhook-events/${id}/notes`]),
  fc
    .tuple(fc.constantFrom('GET', 'POST', 'PATCH', 'PUT', 'DELETE', 'OPTIONS', 'HEAD'), segment)
    .map(([m, s]) => [m, `/${s}`]),
  fc.constantFrom('PATCH', 'DELETE', 'OPTIONS').map((method) => [method, '/charges']),
) as fc.Arbitrary<[string, string]>;

const contentType = fc.oneof(
  { weight: 6, arbitrary: fc.constant('application/json') },
  fc.constantFrom(
    'application/json',
    'application/json; charset=utf-8',
    'application/json; charset=utf-16',
    'application/json; charset=latin1',
    'application/merge-patch+json',
    'text/plain',
    'application/x-www-form-urlencoded',
    'multipart/form-data; boundary=x',
    'multipart/form-data',
    'application/octet-stream',
    '*/*',
    'json',
    ';',
    '',
  ),
  fc.string({ unit: 'grapheme-ascii', maxLength: 30 }),
);

// Values that look like what the routes read, and what they never expect in those places.
const oddValue = fc.oneof(
  fc.jsonValue({ maxDepth: 3 }),
  fc.constantFrom(-1, 0, 1e308, -0, 2 ** 53 + 1, 1.5, '100', '', 'usd', 'USD', '\u0000', '\ud800', null, true),
  fc.string({ maxLength: 600 }),
);
const shapedBody = fc.oneof(
  fc.record(
    {
      amount: fc.oneof(fc.integer({ min: -5, max: 2_000_000_000 }), oddValue),
      currency: fc.oneof(fc.constantFrom('USD', 'EUR', 'usd', 'US', 'USDD'), oddValue),
    },
    { requiredKeys: [] },
  ),
  fc.record({ title: oddValue, url: oddValue }, { requiredKeys: [] }),
  fc.record({ theme: oddValue }, { requiredKeys: [] }),
  fc.record({ text: oddValue }, { requiredKeys: [] }),
  fc.record({ quantity: oddValue, count: oddValue }, { requiredKeys: [] }),
  fc.record({ items: fc.oneof(oddValue, fc.array(oddValue, { maxLength: 300 })) }, { requiredKeys: [] }),
  fc.array(oddValue, { maxLength: 60 }),
);
const body = fc.oneof(
  shapedBody.map((value) => Buffer.from(JSON.stringify(value))),
  fc.jsonValue().map((value) => Buffer.from(JSON.stringify(value))),
  fc.uint8Array({ maxLength: 300 }).map((bytes) => Buffer.from(bytes)),
  fc
    .constantFrom('', '{', '{"amount":', 'null', '[]', '{"__proto__":{"admin":true}}', '{"a":1,"a":2}', '"\\ud800"')
    .map((text) => Buffer.from(text)),
  fc.nat({ max: 3000 }).map((depth) => Buffer.from(`${'['.repeat(depth)}${']'.repeat(depth)}`)),
  fc.nat({ max: 200_000 }).map((length) => Buffer.from(JSON.stringify({ amount: 1, pad: 'x'.repeat(length) }))),
);

// A few keys come back again and again, so replays, in-flight conflicts and mismatches happen too.
const reusedKeys = Array.from({ length: 6 }, () => `"${randomUUID()}"`);
const idempotencyKey = fc.oneof(
  fc.constant(undefined),
  { weight: 3, arbitrary: fc.constantFrom(...reusedKeys) },
  fc.uuid().map((uuid) => `"${uuid}"`),
  fc.uuid(),
  fc.string({ maxLength: 300 }),
  fc.constantFrom('""', '"', 'a,b', '"a", "b"', ' ', ':x:', `"${'k'.repeat(256)}"`),
);

const hostile = fc
  .record({
    route,
    query,
    contentType: fc.option(contentType, { nil: undefined }),
    body: fc.option(body, { nil: undefined }),
    key: idempotencyKey,
    auth: fc.oneof(
      { weight: 8, arbitrary: fc.constant('admin') },
      { weight: 1, arbitrary: fc.constant(undefined) },
      { weight: 1, arbitrary: fc.string({ maxLength: 60 }).map((text) => `Bearer ${text}`) },
      { weight: 1, arbitrary: fc.constantFrom('Bearer', 'Basic YTpi', 'bearer  x.y.z', 'Bearer a.b.c') },
    ),
  })
  .map(({ route: [method, path], query: search, contentType: type, body: bytes, key, auth }): Hostile => {
    const headers: Record<string, string> = {};
    if (auth === 'admin') headers.authorization = `Bearer ${adminToken}`;
    else if (auth !== undefined) headers.authorization = auth;
    if (type !== undefined) headers['content-type'] = type;
    if (key !== undefined) headers['idempotency-key'] = key;
    const input: Hostile = { method, path: `${path}${search}`, headers };
    // GET and HEAD with a body is legal HTTP, and clients do send it; keep a few.
    if (bytes !== undefined) input.body = bytes;
    return input;
  });

describe('the resource stack under hostile input, through the gateway', () => {
  it('answers every generated request in time, below 500, with a problem document for each refusal', async () => {
    // Every charge the API answered 201 for the first time is one row, and no row exists without one.
    let charged = 0;
    await fc.assert(
      fc.asyncProperty(hostile, async (input) => {
        const answer = await send(input);
        fc.pre(answer !== undefined);
        if (!answer) return;
        expectClearAnswer(answer, input);
        if (input.method === 'POST' && input.path.startsWith('/charges') && answer.status === 201 && !answer.replayed)
          charged++;
      }),
      { numRuns: 1500 },
    );
    expect(await chargeRows()).toBe(charged);
    // The stack is still whole: a plain charge with a fresh key goes through once, and replays.
    const charge = chargeRequest(`"${randomUUID()}"`, { amount: 1200, currency: 'USD' });
    const first = await send(charge);
    const again = await send(charge);
    expect(first?.status).toBe(201);
    expect(again?.status).toBe(201);
    expect(again?.text).toBe(first?.text);
  }, 240_000);

  it('refuses a request straight to the API, past the gateway, with 401 whatever it carries', async () => {
    await fc.assert(
      fc.asyncProperty(hostile, async (input) => {
        const answer = await send(input, test.stack.api.url);
        fc.pre(answer !== undefined);
        if (!answer) return;
        expectClearAnswer(answer, input);
        // The gateway's bearer token is not the API's credential, only its internal token is, and the
        // API checks it before it looks at the path, the body or the key: nothing gets further.
        expect(answer.status, `${input.method} ${input.path}`).toBe(401);
      }),
      { numRuns: 150 },
    );
  }, 120_000);

  it('runs each charge once under bursts of concurrent, nearly valid charges that reuse keys', async () => {
    // Charges that mostly pass validation, sent eight at a time with keys from a small pool: the
    // bursts race on one key, repeat a key with other parameters, and replay. Whatever the mix, each
    // first 201 is one row, a repeat is a replay, a 409 or a 422, and nothing is a 5xx.
    // Through a keep-alive pool, as real clients send, each request still saying `Connection: close`:
    // the gateway once copied the API's `connection: keep-alive` into its answer, the pool reused the
    // connection the gateway was about to close, and a burst got resets and a 400 for a valid charge.
    const agent = new Agent({ keepAlive: true, maxSockets: 8 });
    const pool = Array.from({ length: 40 }, () => `"${randomUUID()}"`);
    const before = await chargeRows();
    let charged = 0;
    const firstAnswer = new Map<string, string>();
    const charge = fc.record({
      key: fc.constantFrom(...pool),
      amount: fc.oneof({ weight: 4, arbitrary: fc.integer({ min: 1, max: 2 }) }, oddValue),
      currency: fc.oneof({ weight: 4, arbitrary: fc.constantFrom('USD', 'EUR') }, oddValue),
    });
    const property = fc.asyncProperty(fc.array(charge, { minLength: 2, maxLength: 8 }), async (burst) => {
      const answers = await Promise.all(
        burst.map(({ key, amount, currency }) =>
          send(chargeRequest(key, { amount, currency }), test.stack.gateway.url, agent),
        ),
      );
      // First runs before replays: a burst's requests race, so the replay of a key can come back
      // ahead of its first run in the burst's order (its request waited for a pooled socket).
      for (const [index, answer] of answers.entries()) {
        if (!answer) throw new Error('node:http refused a plain JSON charge');
        expect([201, 409, 422]).toContain(answer.status);
        const { key } = burst[index] as { key: string };
        if (answer.status === 201 && !answer.replayed) {
          charged++;
          expect(firstAnswer.has(key), `a second first run for ${key}`).toBe(false);
          firstAnswer.set(key, answer.text);
        }
        if (answer.status === 422) expect(JSON.parse(answer.text).code, `${index}`).toMatch(/^[a-z_]+$/);
      }
      for (const [index, answer] of answers.entries()) {
        const { key } = burst[index] as { key: string };
        if (answer?.replayed) expect(answer.text, `the replay of ${key}`).toBe(firstAnswer.get(key));
      }
    });
    try {
      await fc.assert(property, { numRuns: 120 });
    } finally {
      agent.destroy();
    }
    expect((await chargeRows()) - before).toBe(charged);
    // Every key of the pool that ran holds one charge at most.
    const { rows } = await test.db.query<{ n: number }>(
      'select count(*)::int as n from api_charges group by idempotency_key having count(*) > 1',
    );
    expect(rows).toEqual([]);
  }, 240_000);
});

/** A JSON charge through the gateway, as the admin, with `key`. */
function chargeRequest(key: string, charge: { amount: unknown; currency: unknown }): Hostile {
  return {
    method: 'POST',
    path: '/charges',
    headers: { authorization: `Bearer ${adminToken}`, 'content-type': 'application/json', 'idempotency-key': key },
    body: Buffer.from(JSON.stringify(charge)),
  };
}

async function chargeRows(): Promise<number> {
  const { rows } = await test.db.query<{ n: number }>('select count(*)::int as n from api_charges');
  return rows[0]?.n ?? -1;
}

// Spec rows the per-route files left unproven, on the running stack (gateway, API, receiver): rule 3.1
// ("exactly one side effect") on every keyed route, not the charges alone; keys scoped to the
// operation type (2.1, 8); the stored response replayed unchanged (2.1), byte for byte.
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningResourceStack } from '../src/api/resource-stack.js';
import type { Database } from '../src/db.js';
import { startTestStack, type TestStack } from './test-stack.js';

let test: TestStack;
let db: Database;
let stack: RunningResourceStack;

beforeAll(async () => {
  test = await startTestStack('spec_rows');
  ({ db, stack } = test);
}, 60_000);

afterAll(async () => {
  await test?.close();
});

interface Answer {
  status: number;
  headers: Headers;
  text: string;
}

/** POSTs `body` as JSON through the gateway, as alice with every scope and the admin role. */
async function post(path: string, body: unknown, key?: string): Promise<Answer> {
  const response = await fetch(new URL(path, stack.gateway.url), {
    method: 'POST',
    headers: {
      authorization: `Bearer ${await test.token({ roles: ['admin'] })}`,
      'content-type': 'application/json',
      ...(key === undefined ? {} : { 'idempotency-key': key }),
    },
    body: JSON.stringify(body),
  });
  return { status: response.status, headers: response.headers, text: await response.text() };
}

async function count(sql: string, params: unknown[] = []): Promise<number> {
  const { rows } = await db.query<{ n: number }>(`select count(*)::int as n from ${sql}`, params);
  return rows[0]?.n ?? -1;
}

/** An event the receiver holds, to put notes on: a charge's payment.succeeded, relayed. */
async function anEvent(): Promise<string> {
  const charge = await post('/charges', { amount: 42, currency: 'EUR' });
  expect(charge.status).toBe(201);
  await stack.api.relayOnce();
  return `evt_${(JSON.parse(charge.text) as { id: string }).id}`;
}

/** Rule 3.1: one execution among `answers`, every other one its replay or a 409 with Retry-After. */
function expectOneExecution(answers: Answer[]): void {
  expect(answers.every((answer) => answer.status === 201 || answer.status === 409)).toBe(true);
  const created = answers.filter((answer) => answer.status === 201);
  expect(created.filter((answer) => answer.headers.get('idempotent-replayed') !== 'true')).toHaveLength(1);
  expect(new Set(created.map((answer) => answer.text)).size).toBe(1);
  for (const conflict of answers.filter((answer) => answer.status === 409)) {
    expect(conflict.headers.get('retry-after')).toBeTruthy();
    expect(JSON.parse(conflict.text)).toMatchObject({ code: 'in_progress' });
  }
}

describe('rule 3.1: requests with one key at the same instant make exactly one side effect', () => {
  it('POST /photos (Redis with REDIS_URL, the plain SQL store otherwise): 20 at once, one photo', async () => {
    const key = `"${randomUUID()}"`;
    const title = `Concurrent ${randomUUID()}`;
    const answers = await Promise.all(Array.from({ length: 20 }, () => post('/photos', { title }, key)));
    expectOneExecution(answers);
    expect(await count('api_photos where title = $1', [title])).toBe(1);
  }, 60_000);

  it('POST /webhook-events/<id>/notes (the receiver, Koa): 20 at once, one note', async () => {
    const eventId = await anEvent();
    const key = `"${randomUUID()}"`;
    const answers = await Promise.all(
      Array.from({ length: 20 }, () => post(`/webhook-events/${eventId}/notes`, { text: 'Called back' }, key)),
    );
    expectOneExecution(answers);
    expect(await count('receiver_event_notes where event_id = $1', [eventId])).toBe(1);
  }, 60_000);
});

describe('keys are scoped to the operation type (2.1, part 8)', () => {
  it('one key on a charge, a photo and a note is three operations: each runs, none replays or is refused', async () => {
    const eventId = await anEvent();
    const key = `"${randomUUID()}"`;
    const charge = await post('/charges', { amount: 77, currency: 'EUR' }, key);
    const photo = await post('/photos', { title: 'Same key, other operation' }, key);
    const note = await post(`/webhook-events/${eventId}/notes`, { text: 'Same key, other operation' }, key);
    for (const answer of [charge, photo, note]) {
      expect(answer.status).toBe(201);
      expect(answer.headers.get('idempotent-replayed')).toBeNull();
    }
    expect(JSON.parse(photo.text)).toMatchObject({ title: 'Same key, other operation' });
    expect(JSON.parse(note.text)).toMatchObject({ eventId, text: 'Same key, other operation' });
    // And each operation's retry still replays its own answer.
    expect((await post('/charges', { amount: 77, currency: 'EUR' }, key)).text).toBe(charge.text);
    expect((await post('/photos', { title: 'Same key, other operation' }, key)).text).toBe(photo.text);
  });
});

describe('the stored response is replayed unchanged (2.1, part 3)', () => {
  it.each([
    ['POST /charges', '/charges', { amount: 1234, currency: 'EUR' }],
    ['POST /photos', '/photos', { title: 'Replayed unchanged' }],
  ])('%s: the same status, the same bytes, the same media type and Location', async (_name, path, body) => {
    const key = `"${randomUUID()}"`;
    const first = await post(path, body, key);
    expect(first.status).toBe(201);
    const replays = [await post(path, body, key), await post(path, body, key)];
    for (const replay of replays) {
      expect(replay.status).toBe(first.status);
      expect(replay.text).toBe(first.text);
      expect(replay.headers.get('content-type')).toBe(first.headers.get('content-type'));
      expect(replay.headers.get('location')).toBe(first.headers.get('location'));
      expect(replay.headers.get('idempotent-replayed')).toBe('true');
    }
  });
});

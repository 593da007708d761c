import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestStack, type TestStack } from './test-stack.js';

// Edges of the API's validation a mutation pass found unchecked: each test fails with one broken
// line (a bound moved by one, a list built from the wrong set) and passes with the code as it is.
let test: TestStack;

beforeAll(async () => {
  test = await startTestStack('api_edges');
}, 60_000);

afterAll(async () => {
  await test?.close();
});

async function call(method: string, path: string, body: unknown, roles: string[] = [], key?: string) {
  const token = await test.token({ roles });
  const response = await fetch(new URL(path, test.stack.gateway.url), {
    method,
    headers: {
      authorization: `Bearer ${token}`,
      'content-type': 'application/json',
      ...(key ? { 'idempotency-key': key } : {}),
    },
    body: JSON.stringify(body),
  });
  return { status: response.status, body: await response.json() };
}

describe('API validation edges', () => {
  // The title is checked as stored, trimmed: 100 characters is the largest title, not one too long.
  it('POST /photos takes a title of exactly 100 characters, and refuses 101', async () => {
    const longest = 'x'.repeat(100);
    const created = await call('POST', '/photos', { title: ` ${longest} ` }, [], `"${randomUUID()}"`);
    expect(created).toMatchObject({ status: 201, body: { title: longest } });
    const refused = await call('POST', '/photos', { title: `${longest}x` }, [], `"${randomUUID()}"`);
    expect(refused).toMatchObject({ status: 422, body: { invalid: ['title'] } });
  });

  // `invalid` names what is wrong: a valid level beside an unknown member is not itself invalid.
  it('PUT /stock with a valid level and an unknown member names only the member', async () => {
    const refused = await call('PUT', '/stock/item-7', { level: 5, colour: 'red' }, ['admin']);
    expect(refused).toMatchObject({ status: 422, body: { code: 'validation_failed', invalid: ['colour'] } });
  });

  // Each id asked for gets its level, in the order asked: an id asked twice is answered twice.
  it('POST /stock/batch answers an id asked twice twice, in the order asked', async () => {
    const answered = await call('POST', '/stock/batch', { items: ['item-2', 'item-1', 'item-2'] });
    expect(answered.status).toBe(200);
    expect(answered.body.levels.map((level: { item: string }) => level.item)).toEqual(['item-2', 'item-1', 'item-2']);
  });
});

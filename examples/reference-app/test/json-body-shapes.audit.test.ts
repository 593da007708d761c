// Audit (branch audit-refapp): the shapes of JSON body the API takes. The README gives
// `POST /stock/batch` the body `{ "items": [...] }`; a bare array and any other JSON that is not an
// object are well-formed JSON of the wrong shape, which DESIGN.md's table and the README answer with
// 422 `validation_failed`, not 400 `body_malformed` ("bad JSON, or a body that does not inflate").
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestStack, type TestStack } from './test-stack.js';

let test: TestStack;

beforeAll(async () => {
  test = await startTestStack('json_body_shapes');
}, 60_000);

afterAll(async () => {
  await test?.close();
});

async function send(method: string, path: string, raw: string, scope?: string) {
  const token = await test.token(scope ? { scope } : {});
  const response = await fetch(new URL(path, test.stack.gateway.url), {
    method,
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: raw,
  });
  return { status: response.status, type: response.headers.get('content-type'), body: await response.json() };
}

describe('JSON bodies of the wrong shape', () => {
  // Was wrong: the parser ran in strict mode, which throws on a top-level value other than an object
  // or an array, and that error was answered 400 body_malformed "The body is not valid JSON." for
  // JSON that is valid. Only a bare array reached the shape check and got the 422.
  it.each(['["item-1"]', 'null', '"item-1"', '42', 'true'])(
    'POST /stock/batch answers the well-formed body %s with 422 validation_failed',
    async (raw) => {
      const refused = await send('POST', '/stock/batch', raw);
      expect(refused).toMatchObject({
        status: 422,
        type: expect.stringContaining('application/problem+json'),
        body: { status: 422, code: 'validation_failed' },
      });
    },
  );

  it('PUT /settings answers the well-formed body null with 422 validation_failed too (every JSON route)', async () => {
    const refused = await send('PUT', '/settings', 'null', 'settings:write');
    expect(refused).toMatchObject({ status: 422, body: { code: 'validation_failed' } });
  });

  it('still answers JSON that does not parse with 400 body_malformed', async () => {
    const refused = await send('POST', '/stock/batch', '{"items": [');
    expect(refused).toMatchObject({ status: 400, body: { code: 'body_malformed' } });
  });

  // Was wrong: a valid `items` beside an unknown member was itself named invalid (PUT /stock names
  // only the member).
  it('POST /stock/batch with valid items and an unknown member names only the member', async () => {
    const refused = await send('POST', '/stock/batch', '{"items":["item-1"],"extra":true}');
    expect(refused).toMatchObject({ status: 422, body: { code: 'validation_failed', invalid: ['extra'] } });
  });

  it('POST /stock/batch with items that are not ids names items', async () => {
    for (const raw of ['{"items":"item-1"}', '{"items":[1]}', '{"items":[]}', '{}']) {
      const refused = await send('POST', '/stock/batch', raw);
      expect({ raw, ...refused }).toMatchObject({ raw, status: 422, body: { invalid: ['items'] } });
    }
  });

  it('takes the documented shape', async () => {
    const answered = await send('POST', '/stock/batch', '{"items":["item-1"]}');
    expect(answered).toMatchObject({ status: 200, body: { levels: [{ item: 'item-1' }] } });
  });
});

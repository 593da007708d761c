// Message framing and connection headers through the gateway, sent over raw sockets (node:http and
// fetch would drop, add or refuse them): `Expect: 100-continue` and a `Connection` header naming
// end-to-end fields. DESIGN's rule: bad input gets a clear error, never a 500 (or a 5xx that says
// "retry later" for a request no retry can get through), a lost record or two executions for one key.
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sendBytes } from './hostile-send.js';
import { startTestStack, type TestStack } from './test-stack.js';

const limitMs = 5000;
let test: TestStack;
let token: string;

beforeAll(async () => {
  test = await startTestStack('hostile_framing');
  token = await test.token({ scope: 'charges:write' });
}, 60_000);
afterAll(async () => {
  await test?.close();
});

/** Writes `bytes` to the gateway as they are and reads until the server closes (or the limit). */
const sendRaw = (bytes: Buffer) => sendBytes(test.stack.gateway.url, bytes, limitMs);

const charge = '{"amount":100,"currency":"USD"}';

/** A POST /charges with a valid token and key, and `extra` header lines. */
function chargeRequest(key: string, extra: string[], bearer = token): Buffer {
  return Buffer.from(
    [
      'POST /charges HTTP/1.1',
      'Host: localhost',
      `Authorization: Bearer ${bearer}`,
      'Content-Type: application/json',
      `Idempotency-Key: ${key}`,
      `Content-Length: ${charge.length}`,
      'Connection: close',
      ...extra,
      '',
      charge,
    ].join('\r\n'),
    'latin1',
  );
}

const chargesUnder = async (key: string) =>
  (await test.db.query<{ n: number }>('select count(*)::int as n from api_charges where idempotency_key = $1', [key]))
    .rows[0]?.n;

describe('the gateway under framing headers', () => {
  // `Expect: 100-continue` is what curl (bodies over its threshold), .NET and many HTTP libraries
  // send before a POST body. Node answers the 100 itself; handed on, undici (under
  // @fastify/reply-from) throws NotSupportedError('expect header not supported'), which the gateway
  // answered 502 "retry later" on every retry: a valid charge could never get through. forwardHeaders
  // drops `expect`. DESIGN: a valid request is answered by the handler (201), never a 5xx.
  it('forwards a POST sent with Expect: 100-continue and answers it 201, not 502', async () => {
    const key = randomUUID();
    const answer = await sendRaw(chargeRequest(`"${key}"`, ['Expect: 100-continue']));
    expect(answer.statuses.at(-1), answer.body).toBe(201);
    expect(await chargesUnder(key)).toBe(1);
  });

  // RFC 9110 7.6.1: a sender MUST NOT name a field meant for every recipient in `Connection`; a proxy
  // removes the fields `Connection` names. Had the gateway dropped the key, the API (POST /charges
  // mints keys) would have run each attempt as a new operation: two charges for one key. forwardHeaders
  // keeps `Idempotency-Key` whatever `Connection` says. DESIGN: never two executions for one key.
  it('never runs one Idempotency-Key twice when Connection names the key', async () => {
    const key = randomUUID();
    // A caller of its own, so its charges can be counted whatever key they ended up under.
    const owner = `user-${randomUUID()}`;
    const bearer = await test.token({ sub: owner, scope: 'charges:write' });
    const request = chargeRequest(`"${key}"`, ['Connection: Idempotency-Key'], bearer);
    const first = await sendRaw(request);
    const second = await sendRaw(request);
    const executed = [first, second].filter(
      (answer) => answer.statuses.at(-1) === 201 && !/^idempotent-replayed: true/im.test(answer.head),
    );
    // Refused (a 400 problem) or run once and replayed: either keeps the rule; two runs do not.
    expect(executed.length, `${first.head}\n---\n${second.head}`).toBeLessThanOrEqual(1);
    const { rows } = await test.db.query<{ n: number }>('select count(*)::int as n from api_charges where owner = $1', [
      owner,
    ]);
    expect(rows[0]?.n).toBeLessThanOrEqual(1);
  });
});

// Hostile Standard Webhooks headers against the receiver glue of Express, Fastify and Koa: missing,
// duplicated, oversized and malformed webhook-id / webhook-timestamp / webhook-signature, forged and
// truncated signatures, fuzzed with fast-check. Each gets the documented 4xx (400 with a stable
// code; 413/415 for bodies), identically on the three adapters, quickly; apply never runs. A
// correctly signed delivery is applied once, so a receiver that refused everything would fail.
import { randomUUID } from 'node:crypto';
import { createSigner } from '@idem/webhooks';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type RawAnswer, rawRequest, sendRaw } from './raw-http.js';
import { type HostileServer, startAll, WEBHOOK_SECRET } from './servers.js';

const limitMs = 5000;
let servers: HostileServer[];
let tried = 0;
const signer = createSigner({ secret: WEBHOOK_SECRET });
const body = Buffer.from('{"type":"payment.succeeded","data":{"amount":4200}}');
const codes = new Set([
  'headers_missing',
  'header_invalid',
  'timestamp_too_old',
  'timestamp_too_new',
  'signature_unsupported',
  'signature_mismatch',
  'event_id_reused',
]);

beforeAll(async () => {
  servers = await startAll();
});
afterAll(async () => {
  await Promise.all(servers.map((server) => server.close()));
  console.info(`[figures] hostile webhook headers ${JSON.stringify({ inputs: tried, adapters: servers.length })}`);
});

/** Valid headers for a fresh event id, as the sender would send them. */
function validHeaders(id = `msg_${randomUUID()}`): Record<string, string> {
  const headers = signer.sign({ id, body, timestamp: new Date() }) as unknown as Record<string, string>;
  return Object.fromEntries(Object.entries(headers).map(([name, value]) => [name.toLowerCase(), String(value)]));
}

async function deliver(headers: Array<[string, string]>, payload = body): Promise<RawAnswer[]> {
  tried++;
  const request = rawRequest({
    path: '/hooks',
    headers: [['Content-Type', 'application/json'], ...headers],
    body: payload,
  });
  return Promise.all(servers.map((server) => sendRaw(server.port, request, limitMs)));
}

function refused(answers: RawAnswer[], label: string, allowed: readonly number[] = [400]) {
  for (const [i, answer] of answers.entries()) {
    const where = `${servers[i]!.name}: ${label}`;
    expect(answer.timedOut, where).toBe(false);
    expect(answer.ms, where).toBeLessThan(limitMs);
    expect(allowed, `${where} got ${answer.status} ${answer.body.slice(0, 200)}`).toContain(answer.status);
    if (answer.status === 400 && answer.body.startsWith('{')) {
      expect(answer.headers['content-type'], where).toMatch(/^application\/problem\+json/);
      expect(codes, where).toContain(JSON.parse(answer.body).code);
    }
  }
  expect(new Set(answers.map((a) => a.status)).size, `${label}: same status on every adapter`).toBe(1);
}

const entries = (headers: Record<string, string>) => Object.entries(headers) as Array<[string, string]>;
const without = (headers: Record<string, string>, name: string) => entries(headers).filter(([n]) => n !== name);
const replace = (headers: Record<string, string>, name: string, value: string) =>
  entries(headers).map(([n, v]) => [n, n === name ? value : v] as [string, string]);

describe('hostile webhook headers', () => {
  it('a correctly signed delivery is applied once (the control), a replay of it is acknowledged', async () => {
    const before = servers.map((s) => s.runs.hooks);
    const headers = entries(validHeaders());
    expect((await deliver(headers)).map((a) => a.status)).toEqual([200, 200, 200]);
    expect((await deliver(headers)).map((a) => a.status)).toEqual([200, 200, 200]);
    expect(servers.map((s) => s.runs.hooks)).toEqual(before.map((n) => n + 1));
  });

  it('the fixed corpus: each refused with the documented status, apply never runs', async () => {
    const before = servers.map((s) => s.runs.hooks);
    const good = validHeaders();
    const signature = good['webhook-signature'] as string;
    const [version, mac] = signature.split(' ')[0]!.split(',') as [string, string];
    const t = Number(good['webhook-timestamp']);
    const rows: Array<[string, Array<[string, string]>, readonly number[]]> = [
      ['no headers', [], [400]],
      ['no id', without(good, 'webhook-id'), [400]],
      ['no timestamp', without(good, 'webhook-timestamp'), [400]],
      ['no signature', without(good, 'webhook-signature'), [400]],
      ['empty id', replace(good, 'webhook-id', ''), [400]],
      ['id of 10 KB', replace(good, 'webhook-id', 'x'.repeat(10_000)), [400]],
      ['id with a comma and spaces', replace(good, 'webhook-id', 'a, b c'), [400]],
      ['two ids', [...entries(good), ['webhook-id', 'msg_other']], [400]],
      ['two timestamps', [...entries(good), ['webhook-timestamp', String(t)]], [400]],
      ['timestamp not a number', replace(good, 'webhook-timestamp', 'soon'), [400]],
      ['timestamp in ms', replace(good, 'webhook-timestamp', String(t * 1000)), [400]],
      ['timestamp negative', replace(good, 'webhook-timestamp', '-1'), [400]],
      ['timestamp 1e309', replace(good, 'webhook-timestamp', '1e309'), [400]],
      ['timestamp a day old', replace(good, 'webhook-timestamp', String(t - 86_400)), [400]],
      ['timestamp with a fraction', replace(good, 'webhook-timestamp', `${t}.5`), [400]],
      ['timestamp with leading zeros', replace(good, 'webhook-timestamp', `000${t}`), [400]],
      [
        'signature of another body',
        replace(good, 'webhook-signature', `${version},${Buffer.alloc(32, 1).toString('base64')}`),
        [400],
      ],
      ['signature truncated', replace(good, 'webhook-signature', `${version},${mac.slice(0, 20)}`), [400]],
      ['signature version v9', replace(good, 'webhook-signature', `v9,${mac}`), [400]],
      ['signature without a comma', replace(good, 'webhook-signature', mac), [400]],
      ['signature not base64', replace(good, 'webhook-signature', `${version},!!!***`), [400]],
      [
        '1,000 signatures',
        replace(good, 'webhook-signature', Array.from({ length: 1000 }, () => `v1,${'A'.repeat(43)}=`).join(' ')),
        [400, 431],
      ],
      ['signature of 15 KB', replace(good, 'webhook-signature', `v1,${'A'.repeat(15_000)}`), [400]],
      ['asymmetric version with a symmetric secret', replace(good, 'webhook-signature', `v1a,${mac}`), [400]],
    ];
    for (const [label, headers, allowed] of rows) refused(await deliver(headers), label, allowed);
    // The body changed under a valid signature.
    refused(
      await deliver(entries(validHeaders()), Buffer.from('{"type":"payment.succeeded","data":{"amount":1}}')),
      'body changed',
    );
    // The same event id again with another (correctly signed) body.
    const id = `msg_${randomUUID()}`;
    expect((await deliver(entries(validHeaders(id)))).map((a) => a.status)).toEqual([200, 200, 200]);
    const otherBody = Buffer.from('{"type":"payment.failed"}');
    const reused = signer.sign({ id, body: otherBody, timestamp: new Date() }) as unknown as Record<string, string>;
    refused(await deliver(entries(reused), otherBody), 'id reused for another payload', [422]);
    expect(servers.map((s) => s.runs.hooks)).toEqual(before.map((n) => n + 1));
  });

  it('fast-check: fuzzed id, timestamp and signature values are refused', async () => {
    const printable = fc.string({
      unit: fc.integer({ min: 0x20, max: 0x7e }).map((c) => String.fromCharCode(c)),
      maxLength: 200,
    });
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom('webhook-id', 'webhook-timestamp', 'webhook-signature'),
        fc.oneof(
          printable,
          fc.base64String({ maxLength: 120 }).map((s) => `v1,${s}`),
          fc.integer().map(String),
        ),
        async (name, value) => {
          const good = validHeaders();
          // A value equal to the valid one would be accepted: that is not hostile. Any other id is
          // refused too, because the signature covers the id.
          fc.pre(value.trim() !== good[name]);
          refused(await deliver(replace(good, name, value)), `${name}: ${value.slice(0, 60)}`, [400]);
        },
      ),
      { numRuns: 120 },
    );
  });
});

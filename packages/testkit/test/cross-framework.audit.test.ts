// One store shared by servers of different frameworks (audit-support/cross-framework.ts): a client
// retrying the same request with the same Idempotency-Key may reach an Express, a Fastify or a Koa
// server (a rolling migration, a mixed fleet behind one gateway). The same request must replay the
// first outcome wherever it lands (DESIGN, HTTP table: replay = stored status, allowlisted headers,
// stored bytes), never run twice and never be refused 422 as "another request".
import { randomUUID } from 'node:crypto';
import { gzipSync } from 'node:zlib';
import { memoryStore } from '@idem/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  expectReplayedEverywhere,
  type Fleet,
  frameworkNames,
  outcome,
  type Send,
  startFleet,
  to,
} from './audit-support/cross-framework.js';

let fleet: Fleet;
beforeAll(async () => {
  fleet = await startFleet({ store: memoryStore() });
});
afterAll(async () => {
  await fleet?.close();
});

const json = 'application/json';

describe('the same request, retried on a server of another framework, replays the first outcome', () => {
  // Pins what holds today on one shared store: JSON canonicalised (key order, spacing, escapes,
  // 1.0, a BOM), the default scope from each framework's guard (one token, one caller), chunked and
  // gzip framings, forms, text and bytes, the query normalised, the route template as each router
  // reports it, and the replay built from the stored outcome (headers, 204, a gzip body).
  it('bodies, framings, queries and templates replay on every other framework, and run once', async () => {
    const charge: Send = {
      path: '/charges',
      contentType: json,
      body: '{"amount":1000,"currency":"eur","note":"café"}',
    };
    await expectReplayedEverywhere(fleet, charge, [
      { ...charge, body: '{ "note" : "caf\\u00e9", "currency":"eur",\n "amount": 1000.0 }' },
      { ...charge, body: Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(charge.body as string)]) },
      { ...charge, chunked: true },
      {
        ...charge,
        contentType: 'application/json; charset=utf-8',
        body: gzipSync(charge.body as string),
        headers: [['Content-Encoding', 'gzip']],
      },
    ]);
    const form: Send = {
      path: '/charges',
      contentType: 'application/x-www-form-urlencoded',
      body: 'amount=1&note=caf%C3%A9',
    };
    await expectReplayedEverywhere(fleet, form, [
      {
        ...form,
        chunked: true,
        body: gzipSync(form.body as string, { level: 1 }),
        headers: [['Content-Encoding', 'gzip']],
      },
    ]);
    await expectReplayedEverywhere(fleet, { path: '/charges', contentType: 'text/plain', body: 'hello' });
    await expectReplayedEverywhere(fleet, {
      path: '/charges',
      contentType: 'application/octet-stream',
      body: Buffer.from([0, 1, 255]),
    });
    await expectReplayedEverywhere(fleet, { path: '/charges' });
    const query: Send = { path: '/charges?b=2&a=1&a=0&x=%41%20+', contentType: json, body: '{}' };
    await expectReplayedEverywhere(fleet, query, [
      { ...query, path: '/charges?a=1&a=0&x=A++&b=2' },
      { ...query, path: 'http://localhost/charges?a=1&b=2&a=0&x=A%20%20' },
    ]);
    const patch: Send = { method: 'PATCH', path: '/charges/ch_1', contentType: json, body: '{}' };
    await expectReplayedEverywhere(fleet, patch, [
      { ...patch, path: '/charges/ch%5F1' },
      { ...patch, path: '/charges/ch%5f1' },
    ]);
    await expectReplayedEverywhere(fleet, { path: '/empty', contentType: json, body: '{}' });
    await expectReplayedEverywhere(fleet, {
      path: '/gz',
      contentType: json,
      body: '{}',
      headers: [['Accept-Encoding', 'gzip']],
    });
  });

  it('a replay on another framework carries the stored headers, never the cookie, and echoes the key as sent', async () => {
    const key = randomUUID();
    const send: Send = { path: '/charges', contentType: json, body: '{"amount":5}', key };
    const first = await to(fleet, 'express', send);
    expect(first.headers['set-cookie']).toBeDefined();
    for (const framework of ['fastify', 'koa'] as const) {
      const again = await to(fleet, framework, send);
      expect(outcome(again)).toEqual(outcome(first));
      expect(again.headers['set-cookie'], framework).toBeUndefined();
      expect(again.headers['idempotent-replayed'], framework).toBe('true');
      expect(again.headers['cache-control'], framework).toBe('no-store');
      expect(again.headers['idempotency-key'], framework).toBe(key);
    }
  });

  it('a request still running on one framework is 409 with Retry-After on the others, not a second run', async () => {
    for (const origin of frameworkNames) {
      const own = await startFleet({ store: memoryStore() });
      try {
        const send: Send = { path: '/slow', contentType: json, body: '{}', key: randomUUID() };
        const first = to(own, origin, send);
        await own.slowStarted();
        for (const framework of frameworkNames.filter((f) => f !== origin)) {
          const busy = await to(own, framework, send);
          expect(busy.status, `${origin} running, retry on ${framework}`).toBe(409);
          expect(busy.headers['retry-after'], framework).toMatch(/^\d+$/);
          expect(JSON.parse(busy.body).code, framework).toBe('in_progress');
        }
        own.open();
        expect((await first).status).toBe(201);
        expect(own.runs.slow).toBe(1);
      } finally {
        await own.close();
      }
    }
  });
});

describe('fragments: cut from the target before it is fingerprinted', () => {
  // Was a defect: Fastify fingerprinted `request.url` up to `?` (pathOf), keeping `#frag` in the path, while Express (`req.path`) and Koa (`ctx.path`) drop the fragment: 422 between them.
  it('a path with a fragment (/charges#frag), sent the same way to every framework, replays', async () => {
    await expectReplayedEverywhere(fleet, { path: '/charges#frag', contentType: json, body: '{}' });
  });

  // Was a defect: Express (originalUrl after `?`) and Fastify (url after `?`) keep `#frag` in the query (`a=1#frag`), Koa (`ctx.querystring`) drops it: 422 between them.
  it('a query with a fragment (/charges?a=1#frag), sent the same way to every framework, replays', async () => {
    await expectReplayedEverywhere(fleet, { path: '/charges?a=1#frag', contentType: json, body: '{}' });
  });
});

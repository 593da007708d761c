// Audit of the idempotency events of the three adapters, from an on-call engineer's seat: real
// servers on ephemeral ports, the memory store, the same app on Express, Fastify and Koa
// (./events-harness.ts). docs/operations.md, "Metrics, traces and logs", is the contract.
import { memoryStore } from '@idem/core';
import { describe, expect, it } from 'vitest';
import { frameworks, post, postAndLeave, startApp } from './events-harness.js';

describe.each(frameworks)('%s: idempotency events', (framework) => {
  it('100 identical concurrent requests: exactly one claim and one complete, 99 conflicts, one event per request', async () => {
    const app = await startApp(framework, { store: memoryStore() });
    try {
      const answers = Array.from({ length: 100 }, (_, i) =>
        post(app.url, 'same-key', { 'x-mode': 'gate', 'x-req': `r${i}` }),
      );
      // 99 answers come back 409 while the winner waits at the gate.
      await app.next('claim');
      const early = await Promise.all(answers.slice(0, 0));
      expect(early).toEqual([]);
      // Wait until every request was decided (one claim + 99 conflicts), then let the winner finish.
      for (;;) {
        const decided = app.events.filter((e) => e.type === 'claim' || e.type === 'conflict').length;
        if (decided >= 100) break;
        await new Promise((resolve) => setImmediate(resolve));
      }
      app.gate.open();
      const all = await Promise.all(answers);
      await app.next('complete');
      const statuses = all.map((a) => a.status).sort();
      expect(statuses.filter((s) => s === 201)).toHaveLength(1);
      expect(statuses.filter((s) => s === 409)).toHaveLength(99);
      const count = (type: string) => app.events.filter((e) => e.type === type).length;
      expect(count('claim')).toBe(1);
      expect(count('complete')).toBe(1);
      expect(count('conflict')).toBe(99);
      // One begin-event per request, all under one record id.
      expect(new Set(app.events.map((e) => e.id)).size).toBe(1);
      expect(new Set(app.events.filter((e) => e.type === 'conflict').map((e) => e.context)).size).toBe(99);
    } finally {
      await app.close();
    }
  });

  it('claim, complete and replay run in their own request context (operations.md: "Events run in the request\'s async context")', async () => {
    const app = await startApp(framework, { store: memoryStore() });
    try {
      expect((await post(app.url, 'ctx-key', { 'x-req': 'first' })).status).toBe(201);
      const replayed = await post(app.url, 'ctx-key', { 'x-req': 'second' });
      expect(replayed.headers['idempotent-replayed']).toBe('true');
      expect(app.events.map((e) => [e.type, e.context])).toEqual([
        ['claim', 'first'],
        ['complete', 'first'],
        ['replay', 'second'],
      ]);
    } finally {
      await app.close();
    }
  });

  it('a client that leaves mid-handler: the outcome event is still emitted, in its request context', async () => {
    const app = await startApp(framework, { store: memoryStore() });
    try {
      postAndLeave(app.url, 'gone-key', 'leaver', app.next('claim'));
      await app.clientGone;
      // Whatever the adapter decides (stored or not stored), one settling event comes.
      const settled = await Promise.race([app.next('complete'), app.next('response-not-stored'), app.next('release')]);
      expect(settled.context).toBe('leaver');
    } finally {
      await app.close();
    }
  });

  it('an onEvent that throws (or rejects) on every event changes no response and no stored record', async () => {
    for (const hook of [
      () => {
        throw new Error('telemetry down');
      },
      () => Promise.reject(new Error('telemetry down')),
    ]) {
      const app = await startApp(framework, { store: memoryStore(), hook });
      try {
        const first = await post(app.url, 'throwing-key', { 'x-req': 'a' });
        const again = await post(app.url, 'throwing-key', { 'x-req': 'b' });
        const other = await post(app.url, 'throwing-key', { 'x-req': 'c' }, '{"amount":2}');
        expect([first.status, again.status, other.status]).toEqual([201, 201, 422]);
        expect(first.body).toBe(again.body);
        expect(again.headers['idempotent-replayed']).toBe('true');
        expect(app.events.map((e) => e.type)).toEqual(['claim', 'complete', 'replay', 'mismatch']);
      } finally {
        await app.close();
      }
    }
  });

  it('no event holds the key, the bearer token, a cookie or the body', async () => {
    const app = await startApp(framework, { store: memoryStore() });
    try {
      const secrets = {
        'x-req': 's',
        authorization: 'Bearer tok-SECRET-BEARER',
        cookie: 'sid=SECRET-COOKIE',
      };
      await post(app.url, 'KEY-SECRET-1', secrets, '{"card":"SECRET-BODY"}');
      await post(app.url, 'KEY-SECRET-1', secrets, '{"card":"SECRET-BODY"}');
      await post(app.url, 'KEY-SECRET-1', secrets, '{"card":"SECRET-BODY-2"}');
      const text = JSON.stringify(app.events);
      expect(app.events.map((e) => e.type)).toEqual(['claim', 'complete', 'replay', 'mismatch']);
      for (const secret of ['KEY-SECRET-1', 'SECRET-BEARER', 'SECRET-COOKIE', 'SECRET-BODY', 'tenant-1'])
        expect(text).not.toContain(secret);
      for (const e of app.events) expect(e.operation).toBe('POST /orders');
    } finally {
      await app.close();
    }
  });
});

// Parity audit: what a Fastify handler that takes over the raw response (`reply.hijack()`, the
// documented way to stream server-sent events or write with `reply.raw`) sends compared with the same
// handler on Express (`res.writeHead` + `res.end`) and Koa (`ctx.respond = false`), which both echo
// `Idempotency-Key` on the first response (DESIGN.md's HTTP table: "first execution: Idempotency-Key
// echoed"). The plugin sets the echo with `reply.header()`, which only a reply Fastify sends carries.
import type { AddressInfo } from 'node:net';
import { memoryStore } from '@idem/core';
import Fastify, { type FastifyReply } from 'fastify';
import { describe, expect, it } from 'vitest';
import { idempotency } from '../src/index.js';

async function hijackingApp(options: Record<string, unknown>, write: (reply: FastifyReply) => void) {
  let runs = 0;
  const app = Fastify();
  await app.register(idempotency, { store: memoryStore(), scope: () => 'tenant-1', ...options });
  app.post('/orders', async (_request, reply) => {
    runs++;
    reply.hijack();
    write(reply);
    return reply;
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  const url = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}/orders`;
  return { url, runs: () => runs, close: () => app.close() };
}

const post = (url: string, headers: Record<string, string> = {}) =>
  fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: '{"amount":1}' });

function writeRaw(reply: FastifyReply) {
  reply.raw.writeHead(202, { 'content-type': 'text/plain' });
  reply.raw.end('accepted');
}

describe('a hijacked reply, as Express and Koa answer a raw write', () => {
  // Was a defect: the first response of a hijacked reply carries no Idempotency-Key (the echo is set with reply.header(), which hijacked replies never send), where Express and Koa echo it.
  it('echoes the client key on the first response', async () => {
    const app = await hijackingApp({}, writeRaw);
    try {
      const first = await post(app.url, { 'idempotency-key': 'hj-1' });
      expect(first.status).toBe(202);
      expect(await first.text()).toBe('accepted');
      expect(first.headers.get('idempotency-key')).toBe('hj-1');
    } finally {
      await app.close();
    }
  });

  // Was a defect: with mintKeys, a hijacked reply never tells the client the key minted for it, so the outcome stored under that key can never be replayed and the client's retry mints another key and runs the operation again.
  it('mintKeys: tells the client the minted key, so its retry replays instead of running twice', async () => {
    const app = await hijackingApp({ mintKeys: true }, writeRaw);
    try {
      const first = await post(app.url);
      await first.text();
      const minted = first.headers.get('idempotency-key');
      expect(minted ?? 'no key sent').toMatch(/^[0-9a-f-]{36}$/);
      const retry = await post(app.url, { 'idempotency-key': minted ?? '' });
      expect(retry.headers.get('idempotent-replayed')).toBe('true');
      expect(await retry.text()).toBe('accepted');
      expect(app.runs()).toBe(1);
    } finally {
      await app.close();
    }
  });

  // Was a defect: a server-sent event stream written on a hijacked reply (the Fastify way) carries no Idempotency-Key, where Express and Koa echo it.
  it('echoes the key on a server-sent event stream', async () => {
    const app = await hijackingApp({}, (reply) => {
      reply.raw.writeHead(200, { 'content-type': 'text/event-stream' });
      reply.raw.write('data: 1\n\n');
      reply.raw.end();
    });
    try {
      const first = await post(app.url, { 'idempotency-key': 'hj-sse' });
      expect(await first.text()).toBe('data: 1\n\n');
      expect(first.headers.get('idempotency-key')).toBe('hj-sse');
    } finally {
      await app.close();
    }
  });
});

// A handler that answers with Fastify's not-found handler (`reply.callNotFound()`, a charge that does
// not exist): Fastify runs the 404 context's preHandler hooks on the same request, the plugin's own
// among them, after the plugin has claimed the key and the handler has run.
import { expect, it } from 'vitest';
import { captureWarningsEachTest } from '../../core/test/support/warnings.js';
import { app } from './support.js';

const warnings = captureWarningsEachTest();

it("reply.callNotFound() from a handler: its 404 is the handler's answer, with no IDEM_STACKED warning", async () => {
  let runs = 0;
  const instance = await app({}, (a) => {
    a.post('/charges/:id/refunds', async (_request, reply) => {
      runs++;
      return reply.callNotFound();
    });
  });
  try {
    const post = () =>
      instance.inject({ method: 'POST', url: '/charges/ch_404/refunds', headers: { 'idempotency-key': 'cnf-1' } });
    const first = await post();
    expect(first.statusCode).toBe(404);
    expect(first.headers['idempotency-key']).toBe('cnf-1');
    const retry = await post();
    expect(retry.statusCode).toBe(404);
    expect(retry.headers['idempotent-replayed']).toBe('true');
    expect(runs).toBe(1);
    await new Promise((resolve) => setImmediate(resolve));
    // Was wrong: the plugin's own preHandler, run again for the 404, took itself for a second
    // registration and warned that two middlewares handle the request (there is one).
    expect(warnings.withCode('IDEM_STACKED')).toEqual([]);
  } finally {
    await instance.close();
  }
});

it("a not-found handler that itself writes runs once: its answer is the claimed request's, replayed on the retry", async () => {
  let writes = 0;
  const instance = await app({}, (a) => {
    a.setNotFoundHandler(async (_request, reply) => {
      writes++;
      return reply.code(404).send({ noted: writes });
    });
    a.post('/charges/:id/refunds', async (_request, reply) => reply.callNotFound());
  });
  try {
    const post = () =>
      instance.inject({ method: 'POST', url: '/charges/ch_404/refunds', headers: { 'idempotency-key': 'cnf-2' } });
    const first = await post();
    expect(first.statusCode).toBe(404);
    const retry = await post();
    expect(retry.statusCode).toBe(404);
    expect(retry.headers['idempotent-replayed']).toBe('true');
    expect(retry.json()).toEqual({ noted: 1 });
    expect(writes).toBe(1);
    await new Promise((resolve) => setImmediate(resolve));
    expect(warnings.withCode('IDEM_STACKED')).toEqual([]);
  } finally {
    await instance.close();
  }
});

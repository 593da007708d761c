// Adversarial review of the capture's framing (cutShort / asFramed) on a network store, whose
// completion answers on a later turn, so the end of the response waits for it.
import { randomBytes } from 'node:crypto';
import type { IdempotencyEvent } from '@idem/core';
import { idempotency } from '@idem/express';
import { redisStore } from '@idem/redis';
import express from 'express';
import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { deleteKeys, redisAvailable, redisUrl } from '../../redis/test/redis-env.js';
import { type Answer, send, serve } from './support.js';

const available = await redisAvailable();

/** What a client got within `ms`: the answer, the error that ended it, or still nothing. */
const within = (ms: number, answer: Promise<Answer>) =>
  Promise.race([
    answer.catch((error: Error) => `failed: ${error.message}`),
    new Promise<string>((resolve) => setTimeout(() => resolve('still waiting'), ms)),
  ]);

describe.runIf(available)('a response Node refuses at end() (strictContentLength), on Redis', () => {
  const prefix = `audit-review2:framing:${randomBytes(4).toString('hex')}:`;
  const client = new Redis(redisUrl);
  afterAll(async () => {
    await deleteKeys(client, prefix);
    await client.quit();
  });

  // Was wrong: with `res.strictContentLength = true` plain Node throws ERR_HTTP_CONTENT_LENGTH_MISMATCH
  // from an end() short of the declared length. The capture ended the response only once the store
  // answered, in a promise callback: the throw became an unhandled rejection (which ends a Node
  // process by default) and the response was never ended nor destroyed, so its client waited forever.
  it('neither leaves an unhandled rejection nor a client waiting; the key is kept as not replayable', async () => {
    const rejections: unknown[] = [];
    const onRejection = (reason: unknown) => rejections.push(reason);
    process.on('unhandledRejection', onRejection);
    const events: IdempotencyEvent[] = [];
    let runs = 0;
    const app = express();
    app.post(
      '/strict',
      idempotency({ store: redisStore({ client, prefix }), scope: () => 't', onEvent: (event) => events.push(event) }),
      (_req, res) => {
        runs++;
        res.strictContentLength = true;
        res.setHeader('content-length', '10');
        try {
          res.end('abc');
        } catch {
          // What a handler does when Node refuses its end at the call.
          res.destroy();
        }
      },
    );
    try {
      await serve(app, async (url) => {
        const key: Array<[string, string]> = [['idempotency-key', 'strict-1']];
        const first = await within(5_000, send(`${url}/strict`, 'POST', key));
        expect(first).toMatch(/^failed/);
        const retry = await within(5_000, send(`${url}/strict`, 'POST', key));
        expect(typeof retry === 'string' ? retry : retry.status).toBe(500);
        expect(typeof retry === 'string' ? retry : retry.body).toContain('response_not_replayable');
      });
      // No wait here: the retry's replayed 500 says the first request's capture has run to its end,
      // and a rejection it left unhandled is reported on the turn it happens, long before that reply.
      expect(runs).toBe(1);
      expect(rejections).toEqual([]);
      expect(events.map((event) => event.type)).toContain('response-not-stored');
    } finally {
      process.off('unhandledRejection', onRejection);
    }
  }, 20_000);
});

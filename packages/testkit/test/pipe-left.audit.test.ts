// A client that leaves before the first chunk of a body stream piped into its response (a slow
// upstream behind `stream.pipeline(source, res)`, `source.pipe(res)`, Fastify's `reply.send(stream)`,
// Koa's `ctx.body = stream` or a pipeline into `ctx.res`), on the three adapters, over HTTP/1.1 and, for Fastify and Koa, h2c.
// The pipe stops with the close and nothing ever ends the response: waited for, the key stayed in
// progress, renewed by the heartbeat, and every retry got 409 for as long as the process lived.
// The handler ran and handed its body over: the key is kept as a stream cut short, and the retry
// gets `500 response_not_replayable`, never a second run (onCapturedClose in
// packages/core/src/http-capture.ts). Transactional mode is pipe-left-transactional.audit.int.test.ts.
import { randomUUID } from 'node:crypto';
import { memoryStore } from '@idem/core';
import { describe, expect, it } from 'vitest';
import {
  closedAfterEach,
  pipeLeftCases,
  postSlow,
  startPipeLeftServer,
  within,
} from './audit-support/pipe-left-servers.js';

const servers = closedAfterEach();

describe('a client that leaves before the first chunk of a piped body stream', () => {
  it.each(pipeLeftCases)(
    '%s (HTTP/2: %s): the key is kept as a stream cut short, the retry gets 500 response_not_replayable',
    async (name, http2) => {
      const server = await startPipeLeftServer(name, memoryStore(), { http2 });
      servers.push(server);
      const key = randomUUID();
      expect(await postSlow(server, key, server.piped)).toBeUndefined();
      // Generous: the close is seen at once; without the fix the key is never settled.
      const events = await within(server.settled, 8000, 'the key settled');
      expect(events.filter((event) => event.type === 'response-not-stored')).toMatchObject([
        { reason: 'streaming', status: 201 },
      ]);
      const retry = await postSlow(server, key);
      expect(retry?.status).toBe(500);
      expect(retry?.headers['idempotent-replayed']).toBe('true');
      expect(JSON.parse(retry?.body ?? '')).toMatchObject({ code: 'response_not_replayable' });
      expect(server.runs()).toBe(1);
    },
    20_000,
  );
});

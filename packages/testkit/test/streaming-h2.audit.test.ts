// The streaming audit over HTTP/2 (h2c): Fastify with `http2: true` and Koa on `http2.createServer`
// write to an Http2ServerResponse, whose close and destroy the capture reads differently from a
// ServerResponse's (packages/core/src/response-state.ts, streamOf / erroredOf). The same promises as over
// HTTP/1.1 (streaming.audit.int.test.ts): whole bodies replay byte for byte; a body the client
// cancels mid-way, whose source fails, or that ends short of its Content-Length is never replayed.
import { randomUUID } from 'node:crypto';
import { memoryStore } from '@idem/core';
import { describe, expect, it } from 'vitest';
import {
  expectNotReplayable,
  type FrameworkName,
  type Plan,
  patternBytes,
  patternChunks,
  postH2,
  type StreamServer,
  settledRetry,
  startStreamServer,
} from './audit-support/streaming-servers.js';

const KIB = 1024;
const MIB = 1024 * KIB;

async function withH2Server<T>(
  framework: FrameworkName,
  plans: Record<string, Plan>,
  extra: Record<string, unknown>,
  body: (server: StreamServer) => Promise<T>,
): Promise<T> {
  const server = await startStreamServer(framework, plans, { store: memoryStore(), extra, http2: true });
  try {
    return await body(server);
  } finally {
    await server.close();
  }
}

describe.each(['fastify', 'koa'] as const)('%s over HTTP/2', (framework) => {
  const size = 2 * MIB + 5;

  it.each(['stream', 'web', 'buffer'] as const)(
    'a 2 MiB %s body reaches the client whole and replays byte for byte, once run',
    async (mode) => {
      const plan: Plan = {
        status: 201,
        headers: { 'content-type': 'application/octet-stream' },
        mode,
        chunks: patternChunks(size, 32 * KIB + 3),
      };
      await withH2Server(framework, { big: plan }, { maxResponseBytes: 3 * MIB }, async (server) => {
        const key = randomUUID();
        const first = await postH2(server.port, 'big', key);
        expect(first.status).toBe(201);
        expect(first.complete).toBe(true);
        expect(first.body.equals(patternBytes(size))).toBe(true);
        const retry = await settledRetry(server.port, 'big', key, { send: postH2 });
        expect(retry.status).toBe(201);
        expect(retry.headers['idempotent-replayed']).toBe('true');
        expect(retry.body.equals(patternBytes(size))).toBe(true);
        expect(server.runs.big).toBe(1);
      });
    },
  );

  it.each(['stream', 'web'] as const)(
    'a %s body the client cancels mid-way: the retry gets 500 response_not_replayable, never the half it read',
    async (mode) => {
      const plan: Plan = { status: 201, mode, chunks: patternChunks(16 * MIB, 64 * KIB) };
      await withH2Server(framework, { endless: plan }, {}, async (server) => {
        const key = randomUUID();
        const first = await postH2(server.port, 'endless', key, { leaveAfter: 128 * KIB });
        expect(first.complete).toBe(false);
        await server.finished('endless');
        expectNotReplayable(await settledRetry(server.port, 'endless', key, { send: postH2 }));
        expect(server.runs.endless).toBe(1);
      });
    },
  );

  it.each(['stream', 'web'] as const)(
    'a %s body whose source fails mid-body: the retry gets 500 response_not_replayable',
    async (mode) => {
      const plan: Plan = { status: 201, mode, chunks: patternChunks(size, 32 * KIB, 256 * KIB) };
      await withH2Server(framework, { failing: plan }, {}, async (server) => {
        const key = randomUUID();
        const first = await postH2(server.port, 'failing', key);
        // Cut short; Fastify ends such a stream with RST_STREAM NO_ERROR (reply.raw.destroy() without
        // an error), which an HTTP/2 client cannot tell from a whole body without a length: only the
        // byte count says it was cut.
        expect(first.length).toBeLessThan(size);
        await server.finished('failing');
        expectNotReplayable(await settledRetry(server.port, 'failing', key, { send: postH2 }));
        expect(server.runs.failing).toBe(1);
      });
    },
  );

  it('a body shorter than its declared Content-Length is never replayed as a whole response', async () => {
    const plan: Plan = {
      status: 201,
      headers: { 'content-type': 'application/octet-stream', 'content-length': String(MIB) },
      mode: 'stream',
      chunks: patternChunks(512 * KIB, 32 * KIB),
    };
    await withH2Server(framework, { short: plan }, {}, async (server) => {
      const key = randomUUID();
      await postH2(server.port, 'short', key, { timeoutMs: 2000 }).catch(() => undefined);
      await server.finished('short');
      expectNotReplayable(await settledRetry(server.port, 'short', key, { send: postH2 }));
      expect(server.runs.short).toBe(1);
    });
  });
});

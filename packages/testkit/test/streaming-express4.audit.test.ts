// The streaming audit on Express 4 (the `express4` alias of express@4), which the Express middleware
// supports as well: the same answers as Express 5 for streamed, failed, abandoned and mis-sized
// bodies (streaming.audit.int.test.ts has the three frameworks on memory and Redis).
import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { memoryStore } from '@idem/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  expectNotReplayable,
  type Plan,
  patternBytes,
  patternChunks,
  post,
  type StreamServer,
  settledRetry,
  startStreamServer,
} from './audit-support/streaming-servers.js';

const KIB = 1024;
const MIB = 1024 * KIB;
const { version } = createRequire(import.meta.url)('express4/package.json') as { version: string };

async function withServer<T>(
  plans: Record<string, Plan>,
  extra: Record<string, unknown>,
  body: (server: StreamServer) => Promise<T>,
): Promise<T> {
  const server = await startStreamServer('express4', plans, { store: memoryStore(), extra });
  try {
    return await body(server);
  } finally {
    await server.close();
  }
}

let tmp: string;
let filePath: string;
const size = 2 * MIB + 5;
beforeAll(() => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'idem-streaming4-'));
  filePath = path.join(tmp, 'export.bin');
  fs.writeFileSync(filePath, patternBytes(size));
});
afterAll(() => {
  fs.rmSync(tmp, { recursive: true, force: true });
});

describe(`express ${version}`, () => {
  it('runs on express 4', () => {
    expect(version.startsWith('4.')).toBe(true);
  });

  it.each(['stream', 'web', 'writes', 'file', 'buffer'] as const)(
    'a 2 MiB body sent as %s replays byte for byte, once run',
    async (mode) => {
      const plan: Plan = {
        status: 201,
        headers: { 'content-type': 'application/octet-stream' },
        mode,
        chunks: patternChunks(size, 32 * KIB + 3),
        file: filePath,
      };
      await withServer({ big: plan }, { maxResponseBytes: 3 * MIB }, async (server) => {
        const key = randomUUID();
        const first = await post(server.port, 'big', key);
        expect(first.status).toBe(201);
        expect(first.body.equals(patternBytes(size))).toBe(true);
        const retry = await settledRetry(server.port, 'big', key);
        expect(retry.status).toBe(201);
        expect(retry.headers['idempotent-replayed']).toBe('true');
        expect(retry.body.equals(patternBytes(size))).toBe(true);
        expect(server.runs.big).toBe(1);
      });
    },
  );

  it.each([
    ['its source fails mid-body', { failAfter: 256 * KIB }],
    ['its client leaves mid-body', { leaveAfter: 128 * KIB }],
  ] as const)('a streamed body where %s: the retry gets 500 response_not_replayable', async (_what, how) => {
    const failAfter = 'failAfter' in how ? how.failAfter : undefined;
    const plan: Plan = { status: 201, mode: 'stream', chunks: patternChunks(16 * MIB, 64 * KIB, failAfter) };
    await withServer({ cut: plan }, {}, async (server) => {
      const key = randomUUID();
      const first = await post(server.port, 'cut', key, 'leaveAfter' in how ? { leaveAfter: how.leaveAfter } : {});
      expect(first.complete).toBe(false);
      await server.finished('cut');
      expectNotReplayable(await settledRetry(server.port, 'cut', key));
      expect(server.runs.cut).toBe(1);
    });
  });

  it('a body short of its Content-Length is not replayed; one past it replays the declared length', async () => {
    const plans: Record<string, Plan> = {
      short: {
        status: 201,
        headers: { 'content-length': String(MIB) },
        mode: 'stream',
        chunks: patternChunks(512 * KIB, 32 * KIB),
      },
      long: {
        status: 201,
        headers: { 'content-length': String(100 * KIB) },
        mode: 'stream',
        chunks: patternChunks(200 * KIB, 48 * KIB),
      },
    };
    await withServer(plans, {}, async (server) => {
      const shortKey = randomUUID();
      await post(server.port, 'short', shortKey, { timeoutMs: 1500 }).catch(() => undefined);
      await server.finished('short');
      expectNotReplayable(await settledRetry(server.port, 'short', shortKey));
      const longKey = randomUUID();
      await post(server.port, 'long', longKey, { timeoutMs: 1500 }).catch(() => undefined);
      await server.finished('long');
      const long = await settledRetry(server.port, 'long', longKey);
      expect(long.status).toBe(201);
      expect(long.body.equals(patternBytes(100 * KIB))).toBe(true);
      expect(server.runs).toEqual({ short: 1, long: 1 });
    });
  });
});

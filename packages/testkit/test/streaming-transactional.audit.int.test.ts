// Streamed responses in transactional mode (PostgreSQL), through the three adapters: the capture
// holds the response back until the transaction commits ("held" mode in packages/core/src/http.ts),
// so what it keeps meanwhile is bounded only by what it chooses to keep.
import { randomUUID } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { postgresStoreTable } from './audit-support/postgres-store-table.js';
import {
  frameworkNames,
  type Plan,
  patternChunks,
  post,
  retainedBufferBytes,
  startStreamServer,
} from './audit-support/streaming-servers.js';

const MIB = 1024 * 1024;
const { available: withPostgres, store } = await postgresStoreTable(
  'audit_streaming_tx',
  'the transactional streaming audit',
);

describe.runIf(withPostgres).each(frameworkNames)('%s, transactional', (framework) => {
  it('a body shorter than its declared Content-Length is not committed: the transaction rolls back, 503', async () => {
    const plan: Plan = {
      status: 201,
      headers: { 'content-type': 'application/octet-stream', 'content-length': String(256 * 1024) },
      mode: 'stream',
      chunks: patternChunks(100 * 1024, 16 * 1024),
    };
    const server = await startStreamServer(
      framework,
      { short: plan },
      { store: store(), extra: { transactional: true } },
    );
    try {
      const key = randomUUID();
      const first = await post(server.port, 'short', key);
      expect(first.status).toBe(503);
      expect(first.complete).toBe(true);
      expect(JSON.parse(first.body.toString())).toMatchObject({ code: 'store_unavailable' });
      expect(server.runs.short).toBe(1);
    } finally {
      await server.close();
    }
  });

  // Was wrong: in held mode the capture keeps every byte past maxResponseBytes (copy() in
  // packages/core/src/http.ts: "In held mode every byte is still kept") and its write() always
  // answers true, so a handler streaming 32 MiB is read at full speed into memory (about 32 MiB
  // retained at the peak; a 2 GiB export would take the process down), only for the answer to be
  // replaced by 503 once the transaction rolls back. The bytes are kept for one case only: a handler
  // that calls release() after the body went over the limit, whose answer is then flushed whole.
  // Decision needed: drop the bytes at the overflow (and answer 503 to that release() case too), or
  // refuse the stream early (destroy the source once over the limit), or document the cost.
  it.fails('a body over maxResponseBytes is not kept in memory whole while the transaction is open', async () => {
    let base = 0;
    let atEnd = Number.NaN;
    const source = patternChunks(32 * MIB, 256 * 1024);
    const plan: Plan = {
      status: 201,
      mode: 'stream',
      // Measured once the last chunk was taken: every byte of the body has been written by then.
      chunks: async function* () {
        yield* source();
        atEnd = retainedBufferBytes() - base;
      },
    };
    const server = await startStreamServer(
      framework,
      { huge: plan },
      { store: store(), extra: { transactional: true } },
    );
    try {
      base = retainedBufferBytes();
      const first = await post(server.port, 'huge', randomUUID(), { discard: true, timeoutMs: 40_000 });
      await server.finished('huge');
      // What the documentation promises (docs/concepts.md): rolled back, 503, nothing ran.
      expect(first.status).toBe(503);
      expect(server.runs.huge).toBe(1);
      expect(atEnd).toBeLessThan(8 * MIB);
    } finally {
      await server.close();
    }
  });
});

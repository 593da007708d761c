import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import * as zlib from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { decoderOf, negotiatedBody } from '../src/content-coding.js';
import { readBodyForFingerprint } from '../src/http-body.js';

// zstd where the runtime has it (Node 22.15 and later): a body of 4 MiB of zeros is about 150
// bytes compressed. Decoded without a cap, a few such requests would fill the memory of the server.
const zstdCompressSync = (zlib as Partial<typeof zlib>).zstdCompressSync;
const bomb = zstdCompressSync?.(Buffer.alloc(4 << 20));

describe.runIf(zstdCompressSync !== undefined)('zstd: decoded up to the cap, as the other codings are', () => {
  it('the decoder of zstd stops at maxOutputLength', () => {
    const decode = decoderOf('zstd');
    expect(decode).toBeDefined();
    expect(() => decode?.(bomb as Buffer, { maxOutputLength: 1_024 })).toThrow(
      expect.objectContaining({ code: 'ERR_BUFFER_TOO_LARGE' }),
    );
  });

  it('a stored zstd body past the cap is served as stored, not inflated for the retry', () => {
    const headers = { 'content-type': 'application/octet-stream', 'content-encoding': 'zstd' };
    expect(negotiatedBody(headers, bomb as Buffer, 'identity', 1_024)).toBeUndefined();
  });

  it('a zstd request body past the limit is refused 413 before the key is claimed', async () => {
    const seen: unknown[] = [];
    const server = createServer(async (req, res) => {
      seen.push(await readBodyForFingerprint(req, 1_024, {}));
      res.end();
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      await fetch(`http://127.0.0.1:${(server.address() as AddressInfo).port}/`, {
        method: 'POST',
        headers: { 'content-encoding': 'zstd' },
        body: new Uint8Array(bomb as Buffer),
      });
    } finally {
      server.close();
    }
    expect(seen).toMatchObject([{ ok: false, error: { code: 'body_too_large', status: 413 } }]);
  });
});

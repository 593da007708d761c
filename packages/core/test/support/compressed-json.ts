import { brotliCompressSync, deflateSync, gzipSync } from 'node:zlib';
import { expect } from 'vitest';

/**
 * The scenario every adapter's "compressed body" test plays against its route at `url` (one caller,
 * answering 201 with what it parsed, and pushing each parsed body into `seen`): a body is fingerprinted
 * by the JSON it decodes to, so the same JSON gzipped again later (another MTIME in gzip's header),
 * plain, deflated or br-compressed replays the first answer; other JSON under the key is refused
 * (422); the handler runs once.
 */
export async function replaysCompressedJson(url: string, seen: unknown[]): Promise<void> {
  const json = Buffer.from('{"amount":100}');
  // The same JSON compressed again later: gzip stamps the time (MTIME, bytes 4 to 7) into its header.
  const first = gzipSync(json);
  const later = gzipSync(json);
  later.writeUInt32LE(1_700_000_000, 4);
  expect(later.equals(first)).toBe(false);
  const send = (key: string, body: Buffer, encoding?: string) =>
    fetch(url, {
      method: 'POST',
      headers: {
        'idempotency-key': key,
        'content-type': 'application/json',
        ...(encoding ? { 'content-encoding': encoding } : {}),
      },
      body: new Uint8Array(body),
    });
  const answered = await send('gzip-1', first, 'gzip');
  expect(answered.status).toBe(201);
  expect(answered.headers.get('idempotent-replayed')).toBeNull();
  const text = await answered.text();
  for (const [body, encoding] of [
    [later, 'gzip'],
    [json, undefined],
    [deflateSync(json), 'deflate'],
    [brotliCompressSync(json), 'br'],
  ] as const) {
    const again = await send('gzip-1', body, encoding);
    expect(again.status, encoding ?? 'plain').toBe(201);
    expect(again.headers.get('idempotent-replayed'), encoding ?? 'plain').toBe('true');
    expect(await again.text(), encoding ?? 'plain').toBe(text);
  }
  // Other JSON under the same key is still another request, compressed or not.
  expect((await send('gzip-1', gzipSync('{"amount":101}'), 'gzip')).status).toBe(422);
  expect(seen).toEqual([{ amount: 100 }]);
}

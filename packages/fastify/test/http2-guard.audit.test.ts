// The guard glue served over HTTP/2 (Fastify's `http2: true`, h2c). A Node HTTP/2 client refuses to
// send a single-value field such as `authorization` twice, so the request is written as raw frames.
import net, { type AddressInfo } from 'node:net';
import { createGuard, requireScopes } from '@idem/guard';
import Fastify from 'fastify';
import { afterEach, expect, it } from 'vitest';
import { AUDIENCE, ISSUER, makeToken, manualClock, SECRET } from '../../guard/test/support/tokens.js';
import { authorize, authPlugin, guard } from '../src/auth.js';

const closers: Array<() => Promise<void>> = [];
afterEach(async () => {
  while (closers.length > 0) await closers.pop()?.();
});

// HPACK integer with a 7-bit prefix (RFC 7541 5.1), for the string lengths below.
function int7(n: number): Buffer {
  if (n < 127) return Buffer.from([n]);
  const out = [127];
  let rest = n - 127;
  while (rest >= 128) {
    out.push((rest & 127) | 128);
    rest >>= 7;
  }
  out.push(rest);
  return Buffer.from(out);
}

// A literal header field without indexing, new name, no Huffman (RFC 7541 6.2.2).
const literal = ([name, value]: [string, string]) =>
  Buffer.concat([
    Buffer.from([0]),
    int7(name.length),
    Buffer.from(name),
    int7(Buffer.byteLength(value)),
    Buffer.from(value),
  ]);

function frame(type: number, flags: number, stream: number, payload: Buffer): Buffer {
  const head = Buffer.alloc(9);
  head.writeUIntBE(payload.length, 0, 3);
  head[3] = type;
  head[4] = flags;
  head.writeUInt32BE(stream, 5);
  return Buffer.concat([head, payload]);
}

// Was a defect: over HTTP/2, a request with two `authorization` fields is authenticated with the first
// one and runs the handler (200). Node's HTTP/2 compatibility request keeps only the first value of
// a single-value field in `headers` and has no `headersDistinct`, which is what guardRequestFromNode
// reads to see the second (both are still in `rawHeaders`). On HTTP/1.1 the same request is refused.
// Expected: 400 `multiple_tokens`, the handler never runs (RFC 6750 §2: one credential per request;
// extractBearerToken's docs: "two Authorization headers: `multiple_tokens` (400)"; the glue's
// HTTP/1.1 case 5 in guard/test/support/http-scenarios.ts). The same function serves the Koa glue.
it('HTTP/2: two Authorization fields are refused 400 multiple_tokens, the handler never runs', async () => {
  const edge = createGuard({
    audience: AUDIENCE,
    now: manualClock().now,
    issuers: [{ issuer: ISSUER, secret: SECRET }],
  });
  const app = Fastify({ http2: true });
  await app.register(authPlugin);
  const runs: string[] = [];
  let answered!: (status: number) => void;
  const status = new Promise<number>((resolve) => {
    answered = resolve;
  });
  app.addHook('onResponse', async (_request, reply) => answered(reply.statusCode));
  app.get('/orders', { onRequest: [guard(edge), authorize(requireScopes('orders:read'))] }, async (request) => {
    runs.push(String(request.auth?.sub));
    return { sub: request.auth?.sub };
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  const port = (app.server.address() as AddressInfo).port;
  const socket = net.connect(port, '127.0.0.1');
  socket.on('error', () => undefined);
  closers.push(async () => {
    socket.destroy();
    await app.close();
  });
  await new Promise((resolve) => socket.once('connect', resolve));
  const fields: Array<[string, string]> = [
    [':method', 'GET'],
    [':path', '/orders'],
    [':scheme', 'http'],
    [':authority', `127.0.0.1:${port}`],
    ['authorization', `Bearer ${makeToken()}`],
    ['authorization', `Bearer ${makeToken({ claims: { sub: 'user-2' } })}`],
  ];
  socket.write(
    Buffer.concat([
      Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'),
      frame(0x4, 0, 0, Buffer.alloc(0)), // SETTINGS
      frame(0x1, 0x4 | 0x1, 1, Buffer.concat(fields.map(literal))), // HEADERS, END_HEADERS | END_STREAM
    ]),
  );
  expect(await status).toBe(400);
  expect(runs).toEqual([]);
});

// HTTP/1.1 over a raw socket, for tests that cut a request at a chosen byte or read an answer cut
// short: what fetch and node:http cannot send or will not hand back.
import net from 'node:net';
import type { CutHow } from './cut-proxy.js';

/** An answer read off a raw socket, however much of it came. */
export interface RawAnswer {
  /** 0 when no status line came. */
  status: number;
  head: string;
  /** Lower-case names; the last of a repeated header. */
  headers: Record<string, string>;
  /** The body bytes, de-chunked when the answer was chunked. */
  body: Buffer;
  /** Every byte that came. */
  raw: Buffer;
  /** No end within the time limit. */
  timedOut: boolean;
  /** Milliseconds until the connection closed. */
  ms: number;
}

/** Reads a status line, headers and body out of the bytes of an answer, whole or cut. */
export function parseAnswer(raw: Buffer): Pick<RawAnswer, 'status' | 'head' | 'headers' | 'body'> {
  const end = raw.indexOf('\r\n\r\n');
  const head = raw.subarray(0, end === -1 ? raw.length : end).toString('latin1');
  const match = /^HTTP\/1\.[01] (\d{3})/.exec(head);
  const headers: Record<string, string> = {};
  for (const line of head.split('\r\n').slice(1)) {
    const colon = line.indexOf(':');
    if (colon > 0) headers[line.slice(0, colon).toLowerCase()] = line.slice(colon + 1).trim();
  }
  let body = end === -1 ? Buffer.alloc(0) : raw.subarray(end + 4);
  if (headers['transfer-encoding'] === 'chunked') body = dechunk(body);
  return { status: match ? Number(match[1]) : 0, head, headers, body };
}

// The chunks that came whole; a cut chunk and what follows it are left out.
function dechunk(bytes: Buffer): Buffer {
  const out: Buffer[] = [];
  let at = 0;
  for (;;) {
    const lineEnd = bytes.indexOf('\r\n', at);
    if (lineEnd === -1) break;
    const size = Number.parseInt(bytes.subarray(at, lineEnd).toString('latin1'), 16);
    if (!(size > 0)) break;
    out.push(bytes.subarray(lineEnd + 2, lineEnd + 2 + size));
    at = lineEnd + 2 + size + 2;
  }
  return Buffer.concat(out);
}

/**
 * Writes the first `cutAt` bytes of `bytes` on a fresh connection to `port` (all of them when
 * undefined), then FIN (`fin`), RST (`reset`) or nothing more (undefined); resolves with what came
 * back once the connection closed, or after `limitMs`.
 *
 * @example
 * const answer = await sendRaw(port, framed.bytes, framed.headEnd + 3, 'reset');
 */
export function sendRaw(port: number, bytes: Buffer, cutAt?: number, how?: CutHow, limitMs = 5000): Promise<RawAnswer> {
  return new Promise((resolve) => {
    const started = performance.now();
    const socket = net.connect(port, '127.0.0.1');
    const chunks: Buffer[] = [];
    let done = false;
    const finish = (timedOut: boolean) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      socket.destroy();
      const raw = Buffer.concat(chunks);
      resolve({ ...parseAnswer(raw), raw, timedOut, ms: performance.now() - started });
    };
    const timer = setTimeout(() => finish(true), limitMs);
    socket.on('data', (chunk) => chunks.push(chunk));
    socket.on('end', () => finish(false));
    socket.on('close', () => finish(false));
    socket.on('error', () => finish(false));
    socket.on('connect', () => {
      socket.write(cutAt === undefined ? bytes : bytes.subarray(0, cutAt), () => {
        if (how === 'fin') socket.end();
        else if (how === 'reset') socket.resetAndDestroy();
      });
    });
  });
}

/**
 * Frames a request: `head` is the request line and header lines (each ending in CRLF), without the
 * framing header; the body goes with a Content-Length, or chunked in two chunks. `headEnd` is where
 * the body starts.
 */
export function frameRequest(head: string, body: Buffer, chunked = false): { bytes: Buffer; headEnd: number } {
  if (!chunked) {
    const first = Buffer.from(`${head}Content-Length: ${body.length}\r\n\r\n`);
    return { bytes: Buffer.concat([first, body]), headEnd: first.length };
  }
  const first = Buffer.from(`${head}Transfer-Encoding: chunked\r\n\r\n`);
  const half = Math.ceil(body.length / 2);
  const chunks = [body.subarray(0, half), body.subarray(half)].flatMap((piece) => [
    Buffer.from(`${piece.length.toString(16)}\r\n`),
    piece,
    Buffer.from('\r\n'),
  ]);
  return { bytes: Buffer.concat([first, ...chunks, Buffer.from('0\r\n\r\n')]), headEnd: first.length };
}

// A raw HTTP/1.1 client for hostile input: writes the exact bytes given (any byte value in a header,
// a wrong Content-Length, a body that is not what its type says) where fetch and node:http would
// refuse to send them, and reads the answer with a time limit.
import net from 'node:net';

/** What the server answered. `status` 0: it closed the connection without an answer. */
export interface RawAnswer {
  status: number;
  headers: Record<string, string>;
  body: string;
  ms: number;
  timedOut: boolean;
}

/** Builds a request: the fixed head first (so `Connection: close` is always seen), the fuzzed header last. */
export function rawRequest(options: {
  method?: string;
  path: string;
  headers?: Array<[string, string | Buffer]>;
  body?: Buffer;
  contentLength?: number | false;
}): Buffer {
  const body = options.body ?? Buffer.alloc(0);
  const parts: Buffer[] = [
    Buffer.from(`${options.method ?? 'POST'} ${options.path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n`),
  ];
  if (options.contentLength !== false)
    parts.push(Buffer.from(`Content-Length: ${options.contentLength ?? body.length}\r\n`));
  for (const [name, value] of options.headers ?? []) {
    parts.push(
      Buffer.from(`${name}: `),
      Buffer.isBuffer(value) ? value : Buffer.from(value, 'latin1'),
      Buffer.from('\r\n'),
    );
  }
  parts.push(Buffer.from('\r\n'), body);
  return Buffer.concat(parts);
}

/** Sends `request` to `port` and resolves with the answer, or `timedOut` after `limitMs`. */
export function sendRaw(port: number, request: Buffer, limitMs = 5000): Promise<RawAnswer> {
  const started = performance.now();
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1');
    const chunks: Buffer[] = [];
    let settled = false;
    const finish = (timedOut: boolean) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.destroy();
      resolve({ ...parseAnswer(Buffer.concat(chunks)), ms: performance.now() - started, timedOut });
    };
    const timer = setTimeout(() => finish(true), limitMs);
    socket.on('data', (chunk) => chunks.push(chunk));
    socket.on('end', () => finish(false));
    socket.on('close', () => finish(false));
    socket.on('error', () => finish(false));
    // The server may answer (413, 400) and close before the whole body is written: that is fine.
    socket.write(request, () => undefined);
  });
}

function parseAnswer(bytes: Buffer): Omit<RawAnswer, 'ms' | 'timedOut'> {
  const text = bytes.toString('latin1');
  const match = /^HTTP\/1\.[01] (\d{3})/.exec(text);
  if (!match) return { status: 0, headers: {}, body: '' };
  const end = text.indexOf('\r\n\r\n');
  const headers: Record<string, string> = {};
  for (const line of text
    .slice(0, end === -1 ? text.length : end)
    .split('\r\n')
    .slice(1)) {
    const colon = line.indexOf(':');
    if (colon > 0) headers[line.slice(0, colon).toLowerCase()] = line.slice(colon + 1).trim();
  }
  const rest = end === -1 ? '' : text.slice(end + 4);
  return { status: Number(match[1]), headers, body: headers['transfer-encoding'] === 'chunked' ? dechunk(rest) : rest };
}

function dechunk(text: string): string {
  let out = '';
  let at = 0;
  for (;;) {
    const lineEnd = text.indexOf('\r\n', at);
    if (lineEnd === -1) return out;
    const size = Number.parseInt(text.slice(at, lineEnd), 16);
    if (!(size > 0)) return out;
    out += text.slice(lineEnd + 2, lineEnd + 2 + size);
    at = lineEnd + 2 + size + 2;
  }
}

// The raw sender of the hostile-input tests: exactly the method, path, headers and body generated,
// a time limit on the answer, and `undefined` for what node:http will not even send.
import { type Agent, request as httpRequest, type IncomingHttpHeaders } from 'node:http';
import { connect } from 'node:net';

/** A generated request: the path carries its query string as sent, encoded or not. */
export interface HostileRequest {
  method: string;
  path: string;
  headers: Record<string, string>;
  body?: Buffer;
}

/** What the server answered. */
export interface HostileAnswer {
  status: number;
  contentType: string;
  text: string;
  headers: IncomingHttpHeaders;
}

/** Options of {@link sendHostile}. */
export interface SendOptions {
  /** How long the whole answer may take (default 5000 ms); longer fails the test as a hang. */
  limitMs?: number;
  /** A keep-alive pool to send through; default a connection of its own per request. */
  agent?: Agent | false;
}

/**
 * Sends `input` to `base` with `Connection: close` and resolves with the answer, or `undefined` when
 * node:http itself refuses to send it (a header value it will not write): such an input never reaches
 * a server. Rejects when no whole answer came within the limit, or the connection failed.
 *
 * @example
 * ```ts
 * const answer = await sendHostile({ method: 'GET', path: '/%zz', headers: {} }, gatewayUrl);
 * ```
 */
export function sendHostile(
  input: HostileRequest,
  base: string,
  options: SendOptions = {},
): Promise<HostileAnswer | undefined> {
  const limitMs = options.limitMs ?? 5000;
  return new Promise((resolve, reject) => {
    let req: ReturnType<typeof httpRequest>;
    try {
      req = httpRequest(new URL(base), {
        agent: options.agent ?? false,
        method: input.method,
        path: input.path,
        // node:http frames no body of a GET or DELETE unless told its length: the bytes would reach
        // the server as the start of a second, garbled request.
        headers: {
          ...input.headers,
          connection: 'close',
          ...(input.body ? { 'content-length': String(input.body.length) } : {}),
        },
      });
    } catch {
      resolve(undefined);
      return;
    }
    const timer = setTimeout(() => {
      req.destroy();
      reject(new Error(`no answer within ${limitMs} ms: ${input.method} ${input.path.slice(0, 200)}`));
    }, limitMs);
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('end', () => {
        clearTimeout(timer);
        resolve({
          status: res.statusCode ?? 0,
          contentType: String(res.headers['content-type'] ?? ''),
          text: Buffer.concat(chunks).toString('utf8'),
          headers: res.headers,
        });
      });
      res.on('error', reject);
    });
    req.on('error', (error) => {
      clearTimeout(timer);
      reject(error);
    });
    req.end(input.body);
  });
}

/** What came back for bytes written as they are (see {@link sendBytes}). */
export interface RawAnswer {
  /** Every status line, in order (a `100 Continue` first, then the final one). */
  statuses: number[];
  /** The final status, 0 when none came. */
  status: number;
  /** The final answer's header block and body, as read (a chunked body keeps its framing). */
  head: string;
  body: string;
}

/**
 * Writes `bytes` to `base`'s port as they are, for what node:http and fetch would not send (an
 * absolute-form target, a Host that is no host, framing headers), and reads until the server closes.
 * Rejects when it has not closed within the limit (default 5000 ms): a hang.
 *
 * @example
 * ```ts
 * const answer = await sendBytes(url, 'GET http://[/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
 * ```
 */
export function sendBytes(base: string, bytes: string | Buffer, limitMs = 5000): Promise<RawAnswer> {
  const { port } = new URL(base);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), '127.0.0.1');
    const chunks: Buffer[] = [];
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error(`no answer within ${limitMs} ms`));
    }, limitMs);
    socket.on('data', (chunk: Buffer) => chunks.push(chunk));
    socket.on('error', () => undefined);
    socket.on('close', () => {
      clearTimeout(timer);
      const text = Buffer.concat(chunks).toString('latin1');
      const statuses = [...text.matchAll(/^HTTP\/1\.[01] (\d{3})/gm)].map((match) => Number(match[1]));
      const last = text.lastIndexOf('HTTP/1.');
      const final = last === -1 ? '' : text.slice(last);
      const end = final.indexOf('\r\n\r\n');
      resolve({
        statuses,
        status: statuses.at(-1) ?? 0,
        head: end === -1 ? final : final.slice(0, end),
        body: end === -1 ? '' : final.slice(end + 4),
      });
    });
    socket.write(bytes);
  });
}

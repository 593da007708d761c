// The third-party app's forms when the body parser refuses them: each is the request's fault, and gets
// its own 4xx and the "Form not read" page, never the database's 503 (with its Retry-After) or a 500.
// body-parser's errors carry an http status with `expose`; an aborted request's also carries the code
// ECONNABORTED, which a database's lost connection carries too: the status says whose fault it is.
// The app runs on its own port behind a listener that notes the status it answers with, since a
// request whose client went away cannot read its answer.
import { request as httpRequest, type IncomingMessage, type ServerResponse } from 'node:http';
import { connect } from 'node:net';
import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrateApp } from '../src/app/schema.js';
import { createThirdPartyApp } from '../src/app/server.js';
import { type Database, openDatabase } from '../src/db.js';
import { migrateIdp } from '../src/idp/schema.js';
import { type ListeningPort, listen } from '../src/listen.js';

/** What the app answered a request with, noted as it writes its head. */
interface Answered {
  status: number;
  retryAfter: unknown;
}

let db: Database;
let port: ListeningPort;
/** Called with each request as it arrives, and with what the app answered it. */
let onArrival: ((req: IncomingMessage) => void) | undefined;
let onAnswer: ((answered: Answered) => void) | undefined;

beforeAll(async () => {
  db = await openDatabase({ memory: true });
  await migrateIdp(db);
  await migrateApp(db);
  port = await listen(0);
  // No provider is called: every request here is refused before its route runs.
  const { app } = await createThirdPartyApp({
    db,
    issuer: 'http://127.0.0.1:9',
    clientId: 'app',
    clientSecret: 'secret',
    appUrl: port.url,
    baseUrl: 'http://127.0.0.1:9',
    onEvent: () => undefined,
  });
  port.use((req: IncomingMessage, res: ServerResponse) => {
    const writeHead = res.writeHead.bind(res) as (...args: unknown[]) => ServerResponse;
    res.writeHead = ((...args: unknown[]) => {
      onAnswer?.({ status: Number(args[0]), retryAfter: res.getHeader('retry-after') });
      return writeHead(...args);
    }) as typeof res.writeHead;
    onArrival?.(req);
    app(req, res);
  });
}, 60_000);

afterAll(async () => {
  await port?.close();
  await db?.close();
});

const post = (body: string | Uint8Array<ArrayBuffer>, headers: Record<string, string>) =>
  fetch(new URL('/signout', port.url).href, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers },
    body,
    redirect: 'manual',
  });

describe("the app's forms the body parser refuses", () => {
  it.each([
    ['too large', 413, () => post(`csrf=${'x'.repeat(20_000)}`, {})],
    [
      'of an unknown charset',
      415,
      () => post('csrf=x', { 'content-type': 'application/x-www-form-urlencoded; charset=klingon' }),
    ],
    ['in an unknown content encoding', 415, () => post('csrf=x', { 'content-encoding': 'x-unknown' })],
    [
      'malformed (a gzip body cut short)',
      400,
      () => post(new Uint8Array(gzipSync('csrf=x').subarray(0, 12)), { 'content-encoding': 'gzip' }),
    ],
  ])('answers a form %s %i with the page that says so', async (_name, status, send) => {
    const answer = await send();
    expect(answer.status).toBe(status);
    expect(answer.headers.get('retry-after')).toBeNull();
    expect(await answer.text()).toContain('Form not read');
  });

  // Was wrong: the last error handler asked `dbUnavailable` first, and body-parser's aborted request
  // (status 400, code ECONNABORTED) looked like a database that lost its connection: a 503 with
  // Retry-After, a database failure in every log and figure, for a browser that went away.
  it('answers a request aborted in the middle of its body 400, not as a database failure', async () => {
    const answered = new Promise<Answered>((resolve) => {
      onAnswer = resolve;
    });
    // The body parser is reading (a listener for the request's end) before the client goes.
    const reading = new Promise<void>((resolve) => {
      onArrival = (req) => {
        const on = req.on.bind(req);
        req.on = ((event: string, listener: (...args: unknown[]) => void) => {
          if (event === 'aborted' || event === 'end') resolve();
          return on(event, listener);
        }) as typeof req.on;
      };
    });
    const socket = connect(Number(new URL(port.url).port), '127.0.0.1');
    try {
      socket.on('error', () => undefined);
      socket.write(
        'POST /signout HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\ncsrf=abc',
      );
      await reading;
      socket.destroy();
      const { status, retryAfter } = await answered;
      expect(status).toBe(400);
      expect(retryAfter).toBeUndefined();
    } finally {
      onArrival = undefined;
      onAnswer = undefined;
      socket.destroy();
    }
  });

  it('still answers a form read whole (the contrast): no session, sent to the signed-out page', async () => {
    const answer = await new Promise<number>((resolve, reject) => {
      const req = httpRequest(
        new URL('/signout', port.url),
        { method: 'POST', headers: { 'content-type': 'application/x-www-form-urlencoded' } },
        (res) => {
          res.resume();
          resolve(res.statusCode ?? 0);
        },
      );
      req.on('error', reject);
      req.end('csrf=x');
    });
    expect(answer).toBe(303);
  });
});

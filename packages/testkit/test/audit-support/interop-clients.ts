// Clients that are not Node: curl and Python's http.client, spawned against an Express, a Fastify
// and a Koa server built as their guides say (guard first, idempotency before the body parsers),
// each answering the same routes with the same handler on one store. Which client binaries exist
// is checked once; a missing one skips its tests loudly.
import { execFile, execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { gzipSync } from 'node:zlib';
import type { Store } from '@idem/core';
import { guard as expressGuard, idempotency as expressIdempotency, idempotencyErrors } from '@idem/express';
import { guard as fastifyGuard, idempotency as fastifyIdempotency } from '@idem/fastify';
import { guard as koaGuard, idempotency as koaIdempotency } from '@idem/koa';
import express from 'express';
import Fastify from 'fastify';
import Koa from 'koa';
import { type FrameworkName, guardOptions } from './cross-framework.js';

export { type FrameworkName, frameworkNames, tokenFor } from './cross-framework.js';

function available(command: string, args: string[]): boolean {
  try {
    execFileSync(command, args, { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

export const hasCurl = available('curl', ['--version']);
export const hasPython = available('python3', ['--version']);
if (!hasCurl)
  console.warn('\n*** curl is not installed: the curl interop tests are SKIPPED (apt-get install -y curl) ***\n');
if (!hasPython) console.warn('\n*** python3 is not installed: the Python interop tests are SKIPPED ***\n');

export interface Servers {
  readonly ports: Record<FrameworkName, number>;
  /** Handler runs across the three servers. */
  runs(): number;
  /** Resolves once `/slow` has started; `open()` lets it finish. */
  slowStarted(): Promise<void>;
  open(): void;
  close(): Promise<void>;
}

interface Out {
  status: number;
  headers: Record<string, string>;
  chunks: Buffer[] | undefined;
  streamed: boolean;
}

/**
 * `/charges` 201 JSON with a Location (the body's length and sha256 in it), `/stream` a 200 written
 * in three chunks (chunked on the wire), `/gz` a 201 gzip body, `/empty` a 204, `/slow` waits for
 * `open()`.
 */
export async function startServers(store: Store, extra: Record<string, unknown> = {}): Promise<Servers> {
  let runs = 0;
  let open!: () => void;
  const gate = new Promise<void>((resolve) => {
    open = resolve;
  });
  let started!: () => void;
  const slow = new Promise<void>((resolve) => {
    started = resolve;
  });
  const handle = async (route: string, body: Buffer, framework: FrameworkName): Promise<Out> => {
    const n = ++runs;
    if (route === 'slow') {
      started();
      await gate;
    }
    if (route === 'empty') return { status: 204, headers: { etag: `"e${n}"` }, chunks: undefined, streamed: false };
    if (route === 'stream') {
      const chunks = [`run ${n} ${framework}\n`, 'part two\n', 'part three\n'].map((s) => Buffer.from(s));
      return { status: 200, headers: { 'content-type': 'text/plain' }, chunks, streamed: true };
    }
    if (route === 'gz') {
      const gz = gzipSync(JSON.stringify({ n, framework }));
      return {
        status: 201,
        headers: { 'content-type': 'application/json', 'content-encoding': 'gzip', vary: 'Accept-Encoding' },
        chunks: [gz],
        streamed: false,
      };
    }
    const sha = createHash('sha256').update(body).digest('hex');
    const json = Buffer.from(JSON.stringify({ n, framework, length: body.length, sha }));
    return {
      status: 201,
      headers: { 'content-type': 'application/json', location: `/charges/${n}` },
      chunks: [json],
      streamed: false,
    };
  };
  const idem = { store, ...extra };

  const ex = express();
  ex.use(expressGuard(guardOptions));
  ex.use(expressIdempotency(idem));
  ex.use(express.raw({ type: () => true, limit: '20mb' }));
  ex.post('/:route', (req, res, next) => {
    const body = Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0);
    handle(String(req.params.route), body, 'express').then((out) => {
      res.status(out.status).set(out.headers);
      if (out.chunks === undefined) res.end();
      else if (out.streamed) {
        for (const chunk of out.chunks) res.write(chunk);
        res.end();
      } else res.end(out.chunks[0]);
    }, next);
  });
  ex.use(idempotencyErrors());
  const exServer = ex.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => exServer.once('listening', () => resolve()));

  const fa = Fastify();
  fa.addHook('onRequest', fastifyGuard(guardOptions));
  fa.removeAllContentTypeParsers();
  fa.addContentTypeParser('*', { parseAs: 'buffer', bodyLimit: 20e6 }, (_request, body, done) => done(null, body));
  await fa.register(fastifyIdempotency, idem);
  fa.post('/:route', async (request, reply) => {
    const body = Buffer.isBuffer(request.body) ? request.body : Buffer.alloc(0);
    const out = await handle((request.params as { route: string }).route, body, 'fastify');
    reply.code(out.status).headers(out.headers);
    if (out.chunks === undefined) return reply.send();
    return reply.send(out.streamed ? Readable.from(out.chunks) : out.chunks[0]);
  });
  await fa.listen({ port: 0, host: '127.0.0.1' });

  const ko = new Koa();
  ko.silent = true;
  ko.use(koaGuard(guardOptions));
  ko.use(koaIdempotency(idem));
  ko.use(async (ctx) => {
    const match = /^\/([a-z]+)$/.exec(ctx.path);
    if (ctx.method !== 'POST' || match === null) return;
    const chunks: Buffer[] = [];
    for await (const chunk of ctx.req) chunks.push(chunk as Buffer);
    const out = await handle(match[1] as string, Buffer.concat(chunks), 'koa');
    ctx.status = out.status;
    ctx.set(out.headers);
    if (out.chunks !== undefined) ctx.body = out.streamed ? Readable.from(out.chunks) : out.chunks[0];
  });
  const koServer = ko.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => koServer.once('listening', () => resolve()));

  return {
    ports: {
      express: (exServer.address() as AddressInfo).port,
      fastify: (fa.server.address() as AddressInfo).port,
      koa: (koServer.address() as AddressInfo).port,
    },
    runs: () => runs,
    slowStarted: () => slow,
    open: () => open(),
    close: async () => {
      open();
      exServer.closeAllConnections();
      koServer.closeAllConnections();
      await Promise.all([
        new Promise<void>((resolve) => exServer.close(() => resolve())),
        new Promise<void>((resolve) => koServer.close(() => resolve())),
        fa.close(),
      ]);
    },
  };
}

/** What curl received: the last header block (after any `100 Continue`), the body, its exit code. */
export interface CurlAnswer {
  exit: number;
  status: number;
  /** The status line's protocol, e.g. `HTTP/1.1`. */
  protocol: string;
  /** Lower-case names; a repeated field joined with `, `. */
  headers: Record<string, string>;
  /** Every interim and final status line, in order. */
  statusLines: string[];
  body: Buffer;
  /** curl's `-v` trace (stderr): what it sent. */
  trace: string;
}

/**
 * Runs curl with `args` (a URL among them) and `--max-time 10`; the headers come from `-D`, the body
 * from `-o`. Never throws on curl's exit code: `exit` says it. `stdin` is piped to curl (`-T -`).
 */
export async function curl(args: string[], stdin?: Buffer): Promise<CurlAnswer> {
  const dir = await mkdtemp(join(tmpdir(), 'idem-curl-'));
  try {
    const headerFile = join(dir, 'h');
    const bodyFile = join(dir, 'b');
    const { exit, stderr } = await new Promise<{ exit: number; stderr: string }>((resolve) => {
      const child = execFile(
        'curl',
        ['-sS', '-v', '--max-time', '10', '-D', headerFile, '-o', bodyFile, ...args],
        { encoding: 'utf8', maxBuffer: 64 * 1024 * 1024 },
        (error, _stdout, stderr) => {
          const code = error === null ? 0 : typeof error.code === 'number' ? error.code : -1;
          resolve({ exit: code, stderr });
        },
      );
      child.stdin?.end(stdin ?? Buffer.alloc(0));
    });
    const rawHeaders = await readFile(headerFile, 'latin1').catch(() => '');
    const body = await readFile(bodyFile).catch(() => Buffer.alloc(0));
    const blocks = rawHeaders.split(/\r\n\r\n/).filter((block) => block.trim() !== '');
    const statusLines = blocks.map((block) => block.split('\r\n')[0] ?? '');
    const last = blocks.at(-1) ?? '';
    const [statusLine = '', ...lines] = last.split('\r\n');
    const headers: Record<string, string> = {};
    for (const line of lines) {
      const colon = line.indexOf(':');
      if (colon <= 0) continue;
      const name = line.slice(0, colon).trim().toLowerCase();
      const value = line.slice(colon + 1).trim();
      headers[name] = headers[name] === undefined ? value : `${headers[name]}, ${value}`;
    }
    const [protocol = '', status = '0'] = statusLine.split(' ');
    return { exit, status: Number(status), protocol, headers, statusLines, body, trace: stderr };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** Writes `bytes` to a temporary file for `--data-binary @file`; returns its path and a remover. */
export async function tempFile(bytes: Buffer): Promise<{ path: string; remove: () => Promise<void> }> {
  const dir = await mkdtemp(join(tmpdir(), 'idem-upload-'));
  const path = join(dir, 'body.bin');
  await writeFile(path, bytes);
  return { path, remove: () => rm(dir, { recursive: true, force: true }) };
}

/** What the Python client received. */
export interface PythonAnswer {
  status: number;
  version: number;
  headers: Record<string, string>;
  body: Buffer;
}

// One request per call with http.client: HTTP/1.0 or 1.1, a body sent whole (Content-Length) or
// chunked in the given pieces with a pause between them, then optionally a second request on the
// same connection (to see it was kept alive). Prints one JSON line per answer.
const pythonClient = String.raw`
import base64, http.client, json, sys, time
spec = json.loads(sys.stdin.read())
conn = http.client.HTTPConnection('127.0.0.1', spec['port'], timeout=10)
if spec.get('http10'):
    conn._http_vsn = 10
    conn._http_vsn_str = 'HTTP/1.0'
def send(req):
    conn.putrequest('POST', req['path'], skip_accept_encoding=True)
    for name, value in req['headers']:
        conn.putheader(name, value)
    pieces = [base64.b64decode(p) for p in req.get('chunks', [])]
    if req.get('chunked'):
        conn.putheader('Transfer-Encoding', 'chunked')
        conn.endheaders()
        for piece in pieces:
            conn.send(b'%x\r\n' % len(piece) + piece + b'\r\n')
            time.sleep(req.get('pause', 0))
        conn.send(b'0\r\n\r\n')
    else:
        body = b''.join(pieces)
        conn.putheader('Content-Length', str(len(body)))
        conn.endheaders()
        conn.send(body)
    r = conn.getresponse()
    body = r.read()
    print(json.dumps({'status': r.status, 'version': r.version, 'headers': [[k.lower(), v] for k, v in r.getheaders()], 'body': base64.b64encode(body).decode()}), flush=True)
for req in spec['requests']:
    send(req)
`;

export interface PythonRequest {
  path: string;
  headers: Array<[string, string]>;
  /** The body, in the pieces it is written in. */
  chunks?: Buffer[];
  /** Sent with Transfer-Encoding: chunked, one chunk per piece. */
  chunked?: boolean;
  /** Seconds between pieces. */
  pause?: number;
}

/** Sends `requests` one after the other on ONE http.client connection; throws if Python fails. */
export function python(port: number, requests: PythonRequest[], http10 = false): Promise<PythonAnswer[]> {
  const spec = {
    port,
    http10,
    requests: requests.map((r) => ({ ...r, chunks: (r.chunks ?? []).map((c) => c.toString('base64')) })),
  };
  return new Promise((resolve, reject) => {
    const child = execFile('python3', ['-c', pythonClient], { encoding: 'utf8' }, (error, stdout, stderr) => {
      if (error !== null) {
        reject(new Error(`python3 failed: ${stderr}`));
        return;
      }
      resolve(
        stdout
          .trim()
          .split('\n')
          .map((line) => {
            const parsed = JSON.parse(line) as {
              status: number;
              version: number;
              headers: Array<[string, string]>;
              body: string;
            };
            const headers: Record<string, string> = {};
            for (const [name, value] of parsed.headers) {
              headers[name] = headers[name] === undefined ? value : `${headers[name]}, ${value}`;
            }
            return {
              status: parsed.status,
              version: parsed.version,
              headers,
              body: Buffer.from(parsed.body, 'base64'),
            };
          }),
      );
    });
    child.stdin?.end(JSON.stringify(spec));
  });
}

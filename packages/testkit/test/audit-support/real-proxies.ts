// Real reverse proxies for the proxies audit (proxies.audit.int.test.ts): Debian's nginx and HAProxy,
// each started in the foreground from a config file of its own in a temporary directory, on an
// ephemeral port, and stopped by its pid. And origins on Express, Fastify and Koa that count their
// handler runs, for those proxies to stand in front of.
import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import fs from 'node:fs';
import http from 'node:http';
import net, { type AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import type { IdempotencyEvent, Store } from '@idem/core';
import { idempotency as expressIdempotency, idempotencyErrors } from '@idem/express';
import { idempotency as fastifyIdempotency } from '@idem/fastify';
import { idempotency as koaIdempotency } from '@idem/koa';
import express from 'express';
import Fastify from 'fastify';
import Koa from 'koa';

export const nginxBinary = '/usr/sbin/nginx';
export const haproxyBinary = '/usr/sbin/haproxy';

/**
 * Throws, with what to install, when a proxy binary is missing: the audit must fail on a machine
 * without them, never pass by skipping.
 */
export function requireBinaries(): void {
  const missing = [nginxBinary, haproxyBinary].filter((file) => !fs.existsSync(file));
  if (missing.length > 0) {
    throw new Error(
      `the proxies audit needs ${missing.join(' and ')}: install Debian's nginx and haproxy (apt-get install -y nginx haproxy)`,
    );
  }
}

/** A TCP port nobody listens on right now. */
export const freePort = () =>
  new Promise<number>((resolve, reject) => {
    const server = net.createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as AddressInfo;
      server.close(() => resolve(port));
    });
  });

// True once the proxy on `port` answers GET /__ready with `token`. A bare connect is not enough:
// between freePort() and the proxy's bind another process may take the port (nginx keeps retrying a
// failed bind for seconds), and the test would then talk to that server.
const ready = (port: number, token: string) =>
  new Promise<boolean>((resolve) => {
    const req = http.get({ host: '127.0.0.1', port, path: '/__ready', agent: false, timeout: 2_000 }, (res) => {
      let body = '';
      res.setEncoding('latin1');
      res.on('data', (chunk: string) => {
        body += chunk;
      });
      res.on('end', () => resolve(body === token));
      res.on('error', () => resolve(false));
    });
    req.on('timeout', () => req.destroy());
    req.on('error', () => resolve(false));
  });

/** A running proxy: its URL and port, what it logged, and a stop that kills it by its pid. */
export interface RealProxy {
  url: string;
  port: number;
  /** The proxy's access log (nginx) or its stderr log (HAProxy), as written so far. */
  log: () => string;
  stop: () => Promise<void>;
}

class ProxyStartError extends Error {
  readonly portTaken: boolean;
  constructor(command: string, output: string) {
    super(`${command} did not start: ${output}`);
    // HAProxy exits at once on a port taken; nginx retries its bind for seconds, then exits.
    this.portTaken = /Address already in use|cannot bind socket/.test(output);
  }
}

// Between freePort() and the proxy's bind another process may take the port (CI runs the suite's
// files in parallel, each listening on ephemeral ports): start again on another port, a few times.
async function withFreePort(start: (port: number) => Promise<RealProxy>): Promise<RealProxy> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await start(await freePort());
    } catch (error) {
      if (!(error instanceof ProxyStartError && error.portTaken) || attempt === 5) throw error;
    }
  }
}

async function run(
  command: string,
  args: string[],
  dir: string,
  port: number,
  token: string,
  logFile: string,
): Promise<RealProxy> {
  const output: Buffer[] = [];
  const child: ChildProcess = spawn(command, args, { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
  child.stdout?.on('data', (chunk: Buffer) => output.push(chunk));
  child.stderr?.on('data', (chunk: Buffer) => output.push(chunk));
  const exited = once(child, 'exit');
  const started = Date.now();
  while (!(await ready(port, token))) {
    if (child.exitCode !== null || Date.now() - started > 15_000) {
      child.kill('SIGKILL');
      fs.rmSync(dir, { recursive: true, force: true });
      throw new ProxyStartError(command, Buffer.concat(output).toString());
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    log: () => {
      const file = fs.existsSync(logFile) ? fs.readFileSync(logFile, 'utf8') : '';
      return file + Buffer.concat(output).toString();
    },
    stop: async () => {
      // By its own pid, never by name: other nginx or haproxy processes on the machine are not ours.
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGTERM');
        await exited;
      }
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

/**
 * Starts nginx in the foreground with `http` (directives of the http block: upstreams, caches) and
 * `server` (directives of its one server, listening on an ephemeral port) from a config of its own.
 * The access log records each request's upstream addresses and statuses (`$upstream_addr`,
 * `$upstream_status`): a retried request shows two.
 */
export function startNginx(config: { http?: string; server: string }): Promise<RealProxy> {
  return withFreePort((port) => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'audit-proxies-nginx-'));
    const token = path.basename(dir);
    const access = path.join(dir, 'access.log');
    const conf = `
daemon off;
user root;
worker_processes 1;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log info;
events { worker_connections 256; }
http {
  log_format upstreams '$request_method $uri $status upstream=[$upstream_addr] statuses=[$upstream_status] key=$http_idempotency_key cache=$upstream_cache_status';
  access_log ${access} upstreams;
  client_body_temp_path ${dir}/body;
  proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi;
  uwsgi_temp_path ${dir}/uwsgi;
  scgi_temp_path ${dir}/scgi;
  ${config.http ?? ''}
  server {
    listen 127.0.0.1:${port};
    location = /__ready { access_log off; return 200 "${token}"; }
    ${config.server}
  }
}
`;
    fs.writeFileSync(path.join(dir, 'nginx.conf'), conf);
    return run(nginxBinary, ['-p', dir, '-c', path.join(dir, 'nginx.conf')], dir, port, token, access);
  });
}

/**
 * Starts HAProxy in the foreground (`-db`) with `defaults` and `backend` lines of its own; its one
 * frontend listens on an ephemeral port. It logs each request (httplog) on stderr.
 */
export function startHaproxy(config: { defaults?: string; backend: string }): Promise<RealProxy> {
  return withFreePort((port) => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'audit-proxies-haproxy-'));
    const token = path.basename(dir);
    const conf = `
global
  log stderr format raw local0 info
defaults
  mode http
  log global
  option httplog
  timeout connect 2s
  timeout client 30s
  timeout server 30s
  ${config.defaults ?? ''}
frontend fe
  bind 127.0.0.1:${port}
  http-request return status 200 content-type text/plain string ${token} if { path /__ready }
  default_backend be
backend be
  ${config.backend}
`;
    fs.writeFileSync(path.join(dir, 'haproxy.cfg'), conf);
    return run(haproxyBinary, ['-db', '-f', path.join(dir, 'haproxy.cfg')], dir, port, token, path.join(dir, 'none'));
  });
}

export type FrameworkName = 'express' | 'fastify' | 'koa';
export const frameworkNames: readonly FrameworkName[] = ['express', 'fastify', 'koa'];

/** A promise and the function that settles it: what a handler waits on until the test lets it go. */
export function gate(): { promise: Promise<void>; open: () => void } {
  let open!: () => void;
  const promise = new Promise<void>((resolve) => {
    open = resolve;
  });
  return { promise, open };
}

/** What the origins of one test share: handler runs by route, and the gate `/slow` waits on. */
export interface Shared {
  runs: Record<string, number>;
  finished: Record<string, number>;
  slow: ReturnType<typeof gate>;
  events: IdempotencyEvent[];
}

export const shared = (): Shared => ({ runs: {}, finished: {}, slow: gate(), events: [] });

/** The bytes `/stream` sends, in `streamChunks` writes; and `/big`, 512 KiB. */
export const streamChunks = Array.from({ length: 8 }, (_, i) => `chunk ${i} ${'x'.repeat(100)}\n`);
export const bigBody = Buffer.from(Array.from({ length: 512 * 1024 }, (_, i) => 97 + (i % 26)));

// Every route's handler, framework-free: it counts the run, then answers with a status, headers and
// either a body or the chunks to write one at a time (a chunked response on HTTP/1.1).
async function handle(
  route: string,
  user: string,
  bodyBytes: number,
  s: Shared,
  socket: net.Socket,
): Promise<{ status: number; headers: Record<string, string>; body?: Buffer; chunks?: string[] }> {
  const n = (s.runs[route] ?? 0) + 1;
  s.runs[route] = n;
  try {
    // The origin dies mid-request, after the effect: its connection is cut before any answer.
    if (route === 'crash') socket.destroy();
    if (route === 'slow' || route === 'crash') await s.slow.promise;
    const json = { 'content-type': 'application/json' };
    if (route === 'stream') return { status: 201, headers: { 'content-type': 'text/plain' }, chunks: streamChunks };
    if (route === 'big') return { status: 200, headers: { 'content-type': 'application/octet-stream' }, body: bigBody };
    return {
      status: 201,
      headers: { ...json, location: `/${route}/${n}` },
      body: Buffer.from(JSON.stringify({ id: `${route}_${n}`, user, bytes: bodyBytes })),
    };
  } finally {
    s.finished[route] = (s.finished[route] ?? 0) + 1;
  }
}

const userOf = (headers: http.IncomingHttpHeaders) => String(headers['x-user'] ?? 'anonymous');

/** Writes an answer's chunks one by one, letting the event loop turn between them. */
async function writeChunks(res: http.ServerResponse, chunks: string[]): Promise<void> {
  for (const chunk of chunks) {
    res.write(chunk);
    await new Promise((resolve) => setImmediate(resolve));
  }
  res.end();
}

export interface Origin {
  url: string;
  port: number;
  close: () => Promise<void>;
}

/**
 * An origin on `framework` with the idempotency middleware on `store`, scoped by the `x-user`
 * header (standing in for the guard's principal), and the routes POST /charges, /slow (waits for
 * `s.slow`), /crash (cuts its connection, then waits for `s.slow`), /stream (chunked), /big (512 KiB) and /upload, all counting their runs in `s`.
 */
export async function startOrigin(framework: FrameworkName, store: Store, s: Shared): Promise<Origin> {
  const options = {
    store,
    storeTimeout: '15s' as const,
    maxBodyBytes: 4 * 1024 * 1024,
    scope: (r: { headers: http.IncomingHttpHeaders }) => userOf(r.headers),
    onEvent: (event: IdempotencyEvent) => {
      s.events.push(event);
    },
  };
  let server: http.Server;
  let close: () => Promise<void>;
  if (framework === 'express') {
    const app = express();
    app.use(expressIdempotency(options));
    app.use(express.raw({ type: () => true, limit: '8mb' }));
    app.post('/:route', async (req, res, next) => {
      try {
        const body = Buffer.isBuffer(req.body) ? req.body.length : 0;
        const answer = await handle(String(req.params.route), userOf(req.headers), body, s, req.socket);
        res.status(answer.status).set(answer.headers);
        if (answer.chunks) await writeChunks(res, answer.chunks);
        else res.end(answer.body);
      } catch (error) {
        next(error);
      }
    });
    app.use(idempotencyErrors());
    server = http.createServer(app);
  } else if (framework === 'fastify') {
    const app = Fastify({ bodyLimit: 8 * 1024 * 1024 });
    app.addContentTypeParser('*', { parseAs: 'buffer' }, (_req, body, done) => done(null, body));
    await app.register(fastifyIdempotency, options);
    app.post('/:route', async (request, reply) => {
      const body = Buffer.isBuffer(request.body) ? request.body.length : 0;
      const route = (request.params as { route: string }).route;
      const answer = await handle(route, userOf(request.headers), body, s, request.raw.socket);
      reply.code(answer.status).headers(answer.headers);
      if (answer.chunks) {
        reply.hijack();
        reply.raw.writeHead(answer.status, answer.headers);
        await writeChunks(reply.raw, answer.chunks);
        return reply;
      }
      return reply.send(answer.body);
    });
    await app.ready();
    server = app.server;
    close = () => app.close();
  } else {
    const app = new Koa();
    // Koa logs every error of a request whose client went away; here proxies cut them on purpose.
    app.silent = true;
    app.use(koaIdempotency(options));
    app.use(async (ctx) => {
      const chunks: Buffer[] = [];
      for await (const chunk of ctx.req) chunks.push(chunk as Buffer);
      const route = ctx.path.slice(1);
      const answer = await handle(route, userOf(ctx.headers), Buffer.concat(chunks).length, s, ctx.req.socket);
      ctx.status = answer.status;
      ctx.set(answer.headers);
      if (answer.chunks) {
        ctx.respond = false;
        ctx.res.writeHead(answer.status, answer.headers);
        await writeChunks(ctx.res, answer.chunks);
      } else ctx.body = answer.body;
    });
    server = http.createServer(app.callback());
  }
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  close ??= () =>
    new Promise<void>((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    });
  return { url: `http://127.0.0.1:${port}`, port, close };
}

/** What came back: an answer, or the connection cut before one (`status` 0). */
export interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
  error?: string;
}

/** POSTs `body` with `key` (and `x-user`) on a fresh connection, or with `agent`. */
export function post(
  url: string,
  key: string | undefined,
  options: { user?: string; body?: Buffer | string; agent?: http.Agent | false; headers?: Record<string, string> } = {},
): Promise<Answer> {
  const bytes = Buffer.from(options.body ?? JSON.stringify({ amount: 100 }));
  return new Promise((resolve) => {
    const req = http.request(
      url,
      {
        method: 'POST',
        agent: options.agent ?? false,
        headers: {
          'content-type': 'application/json',
          'content-length': bytes.length,
          ...(key === undefined ? {} : { 'idempotency-key': key }),
          'x-user': options.user ?? 'alice',
          ...options.headers,
        },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (chunk: Buffer) => chunks.push(chunk));
        res.on('end', () =>
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }),
        );
        res.on('error', (error) => resolve({ status: 0, headers: {}, body: Buffer.alloc(0), error: error.message }));
      },
    );
    req.on('error', (error) => resolve({ status: 0, headers: {}, body: Buffer.alloc(0), error: error.message }));
    req.end(bytes);
  });
}

/** Resolves once `check` is true, polling every 10 ms; rejects after `limitMs`. */
export async function until(check: () => boolean, limitMs = 10_000): Promise<void> {
  const started = Date.now();
  while (!check()) {
    if (Date.now() - started > limitMs) throw new Error('condition not met in time');
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

// A tiny third-party adapter for plain node:http, written as an adapter author would from the
// Express adapter and core's documented HTTP helpers (createHttpIdempotency, readBodyForFingerprint,
// writeResponse, principalScope), and the server describeAdapter() asks for around it: the scenario
// routes, a JSON, form and multipart (raw bytes) parser, the principal from x-test-user.
//
// It is not a full framework: it lacks gzip decoding for the parser, transactional mode and a few
// more, so it fails some scenarios of the table whatever the bug. describe-adapter-bugs.audit.test.ts
// therefore compares the failures of each buggy variant with those of the correct one.
//
// `bug` switches on one realistic adapter mistake.
import { createReadStream } from 'node:fs';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import {
  type BodyRead,
  createHttpIdempotency,
  principalScope,
  readBodyForFingerprint,
  readRequestBody,
  writeResponse,
} from '@idem/core';
import type { AdapterServerOptions, ScenarioReply, ScenarioRoute } from '@idem/testkit';

export const adapterBugs = [
  // The replay written by hand: its status and body, but only the content type of its headers.
  'replay-without-headers',
  // A missing `return` after writing the replay: the handler runs as well.
  'handler-on-replay',
  // The body parser runs first and the fingerprint hashes what it parsed (JSON.parse), not the raw
  // bytes: an adapter on a framework whose parser drains the stream (`await c.req.json()`).
  'hash-parsed-body',
] as const;
export type AdapterBug = (typeof adapterBugs)[number];

type Auth = { sub: string; iss: string };

const match = (route: ScenarioRoute, method: string, path: string) => {
  const methods = route.method === 'GET' ? ['GET', 'HEAD'] : [route.method];
  if (!methods.includes(method)) return false;
  const pattern = new RegExp(`^${route.path.replace(/:[a-z]+/g, '[^/]+')}$`);
  return pattern.test(path);
};

type Parsed = { ok: true; body: unknown } | { ok: false };

async function parseBody(req: IncomingMessage): Promise<Parsed> {
  const read = await readRequestBody(req, 64 * 1024 * 1024);
  return parseBytes(req, read.ok ? read.body : undefined);
}

function parseBytes(req: IncomingMessage, bytes: Buffer | undefined): Parsed {
  if (bytes === undefined) return { ok: true, body: undefined };
  const type = req.headers['content-type'] ?? '';
  if (type.startsWith('application/json')) {
    try {
      return { ok: true, body: JSON.parse(bytes.toString('utf8')) };
    } catch {
      return { ok: false };
    }
  }
  if (type.startsWith('application/x-www-form-urlencoded'))
    return { ok: true, body: Object.fromEntries(new URLSearchParams(bytes.toString('utf8'))) };
  if (type.startsWith('multipart/form-data')) return { ok: true, body: bytes };
  return { ok: true, body: bytes.toString('utf8') };
}

function write(res: ServerResponse, reply: ScenarioReply): boolean {
  if (reply.kind === 'throw') return false;
  if (reply.kind === 'destroy') {
    res.destroy();
    return true;
  }
  for (const [name, value] of Object.entries(reply.headers)) res.setHeader(name, value);
  res.statusCode = reply.status;
  switch (reply.kind) {
    case 'json':
      if (!res.hasHeader('content-type')) res.setHeader('content-type', 'application/json; charset=utf-8');
      res.end(JSON.stringify(reply.json));
      break;
    case 'text':
      if (!res.hasHeader('content-type')) res.setHeader('content-type', 'text/html; charset=utf-8');
      res.end(reply.text);
      break;
    case 'bytes':
      res.write(reply.bytes.subarray(0, 10));
      res.end(reply.bytes.subarray(10));
      break;
    case 'stream':
      reply.stream().pipe(res);
      break;
    case 'broken': {
      const source = reply.stream();
      source.on('error', () => res.destroy());
      source.pipe(res);
      break;
    }
    case 'file':
      createReadStream(reply.file).pipe(res);
      break;
    case 'events':
      res.flushHeaders();
      for (const event of reply.events) res.write(event);
      res.end();
      break;
    case 'none':
      res.end();
      break;
  }
  return true;
}

export async function makeNodeHttpServer(
  { idempotency: options, routes, handle }: AdapterServerOptions,
  bug?: AdapterBug,
) {
  let runs = 0;
  const http = createHttpIdempotency<IncomingMessage>(options);

  const serve = async (req: IncomingMessage, res: ServerResponse) => {
    const user = req.headers['x-test-user'];
    const auth: Auth | undefined =
      typeof user === 'string' && user ? { sub: user, iss: 'https://issuer.test' } : undefined;
    const url = new URL(req.url ?? '/', 'http://localhost');
    const method = req.method ?? 'GET';
    const route = routes.find((r) => match(r, method, url.pathname));

    let thrown = false;
    const run = async (parsed?: Parsed, context?: unknown) => {
      if (route === undefined) {
        res.statusCode = 404;
        res.end('Not Found');
        return;
      }
      const body = parsed ?? (await parseBody(req));
      if (!body.ok) {
        res.statusCode = 400;
        res.setHeader('content-type', 'text/plain');
        res.end('invalid JSON');
        return;
      }
      runs++;
      const ctx = context as { tx?: unknown; signal?: AbortSignal } | undefined;
      try {
        const reply = await handle({
          method: route.method,
          route: route.path,
          body: body.body,
          tx: ctx?.tx,
          signal: ctx?.signal,
          context: context as never,
        });
        if (write(res, reply)) return;
        thrown = true;
      } catch {
        thrown = true;
      }
      if (!res.headersSent) {
        res.statusCode = 500;
        res.setHeader('content-type', 'text/plain');
      }
      res.end('Internal Server Error');
    };

    if (!http.handles(method, req.headers['idempotency-key'])) return run();

    // hash-parsed-body: the parser runs first (within maxBodyBytes), and begin gets what it made.
    let early: Parsed | undefined;
    const parseFirst = async (): Promise<BodyRead> => {
      const read = await readRequestBody(req, http.maxBodyBytes);
      if (!read.ok) return read;
      early = parseBytes(req, read.body);
      return { ok: true, body: undefined, json: early.ok ? early.body : undefined };
    };
    const started = await http.begin({
      method,
      route: route?.path ?? url.pathname,
      path: url.pathname,
      query: url.search.slice(1),
      contentType: req.headers['content-type'],
      keyHeader: http.keyHeader(req),
      acceptEncoding: req.headers['accept-encoding'],
      body: bug === 'hash-parsed-body' ? parseFirst : () => readBodyForFingerprint(req, http.maxBodyBytes, {}),
      scope: http.scope ? http.scope(req) : principalScope(auth),
      headers: req.headers,
    });
    if (started.kind === 'pass') return run(early);
    if (started.kind === 'respond') {
      if (bug === 'replay-without-headers') {
        const type = started.response.headers['content-type'];
        res.writeHead(started.response.status, type === undefined ? {} : { 'content-type': type });
        res.end(Buffer.from(started.response.body));
        return;
      }
      writeResponse(res, started.response);
      if (bug !== 'handler-on-replay') return;
      return run(early).catch(() => undefined);
    }
    res.setHeader('Idempotency-Key', started.echo);
    const context = http.context(started);
    http.capture(res, {
      settle: { lease: started.lease, thrown: () => thrown },
      unrouted: () => route === undefined,
      request: { headers: req.headers, body: started.body },
    });
    return run(early, context);
  };

  const server = createServer((req, res) => {
    serve(req, res).catch(() => {
      if (!res.headersSent) res.statusCode = 500;
      res.end();
    });
  });
  server.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    executions: () => runs,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

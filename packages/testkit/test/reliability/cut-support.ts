// Shared by the cut-connection audits: the describeAdapter servers of the three frameworks on a
// store, a raw-socket client that cuts a request after any byte, and a proxy that forwards a request
// and cuts its response after N bytes.
import { randomUUID } from 'node:crypto';
import net from 'node:net';
import { Readable } from 'node:stream';
import { gzipSync } from 'node:zlib';
import type { Store } from '@idem/core';
import type { AdapterServer, AdapterServerOptions, ScenarioReply, ScenarioRequest } from '@idem/testkit';
import { scenarioRoutes } from '@idem/testkit';
import { makeExpressServer } from '../../../express/test/server.js';
import { makeFastifyServer } from '../../../fastify/test/server.js';
import { makeKoaServer } from '../../../koa/test/server.js';

export const frameworks = [
  { name: 'express', make: makeExpressServer },
  { name: 'fastify', make: makeFastifyServer },
  { name: 'koa', make: makeKoaServer },
] as const;
export type FrameworkName = (typeof frameworks)[number]['name'];

export interface CutServer {
  server: AdapterServer;
  port: number;
  /** Handler runs per key (from the body's `key` field), and the bodies each run saw. */
  runs: Map<string, unknown[]>;
  /** Lets a gated handler (`"gate": true` in the body) finish. */
  gate: { open(): void; started: Promise<void>; reset(): void };
  close(): Promise<void>;
}

export const gzipBody = (key: unknown) => gzipSync(Buffer.from(JSON.stringify({ zipped: true, key })));

export async function startCutServer(
  name: FrameworkName,
  store: Store,
  extra: Record<string, unknown> = {},
): Promise<CutServer> {
  const runs = new Map<string, unknown[]>();
  let release!: () => void;
  let started!: () => void;
  const gate = {
    started: Promise.resolve(),
    open: () => release(),
    reset() {
      gate.started = new Promise<void>((resolve) => {
        started = resolve;
      });
      const opened = new Promise<void>((resolve) => {
        release = resolve;
      });
      gateOpened = opened;
    },
  };
  let gateOpened: Promise<void> = Promise.resolve();
  gate.reset();
  const handle = async (request: ScenarioRequest): Promise<ScenarioReply> => {
    const body = request.body as { key?: string; gate?: boolean } | undefined;
    const key = String(body?.key ?? 'none');
    const list = runs.get(key) ?? [];
    list.push(request.body);
    runs.set(key, list);
    if (body?.gate) {
      started();
      await gateOpened;
    }
    const n = list.length;
    switch (request.route) {
      case '/gzip':
        return {
          kind: 'bytes',
          status: 201,
          headers: { 'content-type': 'application/json', 'content-encoding': 'gzip', location: `/charges/${key}` },
          bytes: gzipBody(key),
        };
      case '/stream':
        return {
          kind: 'stream',
          status: 201,
          headers: { 'content-type': 'text/plain', location: `/charges/${key}` },
          stream: () =>
            Readable.from([Buffer.from(`part-1 of ${key};`), Buffer.from(`part-2 run ${n};`), Buffer.from('end')]),
        };
      default:
        return {
          kind: 'json',
          status: 201,
          headers: { location: `/charges/${key}` },
          json: { id: `ch_${key}`, run: n, amount: (request.body as { amount?: unknown }).amount },
        };
    }
  };
  const make = frameworks.find((f) => f.name === name)!.make;
  const options: AdapterServerOptions = {
    idempotency: { store, ...extra } as AdapterServerOptions['idempotency'],
    routes: scenarioRoutes,
    handle,
  };
  const server = await make(options);
  const port = Number(new URL(server.url).port);
  return { server, port, runs, gate, close: () => server.close() };
}

export const newKey = () => randomUUID();

/** The bytes of a keyed JSON POST, with Content-Length or chunked. */
export function requestBytes(
  key: string,
  options: { path?: string; body?: string; chunked?: boolean; extraHead?: string; connection?: string } = {},
): { bytes: Buffer; headEnd: number } {
  const body = Buffer.from(options.body ?? JSON.stringify({ key, amount: 100 }));
  const head =
    `POST ${options.path ?? '/charges'} HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: "${key}"\r\n` +
    `X-Test-User: alice\r\nAccept-Encoding: gzip\r\nContent-Type: application/json\r\n${options.extraHead ?? ''}` +
    `Connection: ${options.connection ?? 'close'}\r\n`;
  if (!options.chunked) {
    const first = Buffer.from(`${head}Content-Length: ${body.length}\r\n\r\n`);
    return { bytes: Buffer.concat([first, body]), headEnd: first.length };
  }
  const first = Buffer.from(`${head}Transfer-Encoding: chunked\r\n\r\n`);
  const half = Math.ceil(body.length / 2);
  const pieces = [body.subarray(0, half), body.subarray(half)];
  const chunks = pieces.flatMap((piece) => [
    Buffer.from(`${piece.length.toString(16)}\r\n`),
    piece,
    Buffer.from('\r\n'),
  ]);
  return { bytes: Buffer.concat([first, ...chunks, Buffer.from('0\r\n\r\n')]), headEnd: first.length };
}

export interface RawAnswer {
  status: number;
  head: string;
  headers: Record<string, string>;
  /** The body bytes, de-chunked. */
  body: Buffer;
  raw: Buffer;
  timedOut: boolean;
}

export function parseAnswer(raw: Buffer): Omit<RawAnswer, 'timedOut' | 'raw'> {
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

/** Sends `bytes` whole on a fresh connection (Connection: close) and reads the answer to its end. */
export function sendWhole(port: number, bytes: Buffer, limitMs = 5000): Promise<RawAnswer> {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1');
    const chunks: Buffer[] = [];
    let done = false;
    const finish = (timedOut: boolean) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      socket.destroy();
      const raw = Buffer.concat(chunks);
      resolve({ ...parseAnswer(raw), raw, timedOut });
    };
    const timer = setTimeout(() => finish(true), limitMs);
    socket.on('data', (chunk) => chunks.push(chunk));
    socket.on('end', () => finish(false));
    socket.on('close', () => finish(false));
    socket.on('error', () => finish(false));
    socket.write(bytes);
  });
}

/**
 * Writes the first `cutAt` bytes of `bytes`, then closes: `fin` half-closes (end()), `reset` destroys
 * with RST. Resolves with whatever came back once the connection closed (or after `limitMs`).
 */
export function sendCut(
  port: number,
  bytes: Buffer,
  cutAt: number,
  how: 'fin' | 'reset',
  limitMs = 2000,
): Promise<Buffer> {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1');
    const chunks: Buffer[] = [];
    let done = false;
    const finish = () => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      socket.destroy();
      resolve(Buffer.concat(chunks));
    };
    const timer = setTimeout(finish, limitMs);
    socket.on('data', (chunk) => chunks.push(chunk));
    socket.on('close', finish);
    socket.on('error', finish);
    socket.on('connect', () => {
      socket.write(bytes.subarray(0, cutAt), () => {
        if (how === 'fin') socket.end();
        else socket.resetAndDestroy();
      });
    });
  });
}

export const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Retries `bytes` until it is not 409 (or `limitMs`); returns the last answer and the 409 count. */
export async function retryUntilSettled(port: number, bytes: Buffer, limitMs = 3000) {
  const started = Date.now();
  let conflicts = 0;
  for (;;) {
    const answer = await sendWhole(port, bytes);
    if (answer.status !== 409 || Date.now() - started > limitMs) return { answer, conflicts };
    conflicts++;
    await pause(20);
  }
}

/**
 * A proxy that forwards each connection's request whole and passes on only the first `limit()`
 * bytes of the answer, then destroys both sides (RST towards the server's end of the link).
 */
export async function createCuttingProxy(targetPort: number) {
  let limit = Number.POSITIVE_INFINITY;
  let how: 'destroy' | 'reset' = 'destroy';
  let once = false;
  const open = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const upstream = net.connect(targetPort, '127.0.0.1');
    open.add(client);
    open.add(upstream);
    let passed = 0;
    const cutAt = limit;
    if (once) limit = Number.POSITIVE_INFINITY;
    const teardown = () => {
      if (!upstream.destroyed) upstream.destroy();
      if (!client.writableEnded) client.destroy();
      open.delete(client);
      open.delete(upstream);
    };
    client.on('data', (chunk) => upstream.write(chunk));
    client.on('end', () => upstream.end());
    upstream.on('data', (chunk: Buffer) => {
      const room = cutAt - passed;
      if (chunk.length < room) {
        passed += chunk.length;
        client.write(chunk);
        return;
      }
      passed = cutAt;
      upstream.removeAllListeners('data');
      // The server's end of the link goes at once; the client gets the bytes it was let have, then FIN.
      if (how === 'reset') upstream.resetAndDestroy();
      else upstream.destroy();
      if (room > 0) client.end(chunk.subarray(0, room));
      else client.end();
    });
    upstream.on('end', () => client.end());
    upstream.on('error', teardown);
    upstream.on('close', () => {
      if (passed < cutAt) teardown();
    });
    client.on('error', teardown);
    client.on('close', teardown);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  return {
    port: (server.address() as net.AddressInfo).port,
    /** Cuts every later connection's answer after `n` bytes (`onlyNext`: the next connection's only). */
    cutAfter(n: number, mode: 'destroy' | 'reset' = 'destroy', onlyNext = false) {
      limit = n;
      how = mode;
      once = onlyNext;
    },
    close() {
      for (const s of open) s.destroy();
      return new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

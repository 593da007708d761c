// Shared by the cut-connection audits: the describeAdapter servers of the three frameworks on a
// store, and keyed requests framed for the testkit's raw-socket client (`sendRaw`).
import { randomUUID } from 'node:crypto';
import { Readable } from 'node:stream';
import { gzipSync } from 'node:zlib';
import type { Store } from '@idem/core';
import type { AdapterServer, AdapterServerOptions, ScenarioReply, ScenarioRequest } from '@idem/testkit';
import { frameRequest, scenarioRoutes, sendRaw } from '@idem/testkit';
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

const gzipBody = (key: unknown) => gzipSync(Buffer.from(JSON.stringify({ zipped: true, key })));

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
  return frameRequest(head, body, options.chunked);
}

export const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Retries `bytes` until it is not 409 (or `limitMs`); returns the last answer and the 409 count. */
export async function retryUntilSettled(port: number, bytes: Buffer, limitMs = 3000) {
  const started = Date.now();
  let conflicts = 0;
  for (;;) {
    const answer = await sendRaw(port, bytes);
    if (answer.status !== 409 || Date.now() - started > limitMs) return { answer, conflicts };
    conflicts++;
    await pause(20);
  }
}

import { once } from 'node:events';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import {
  createIdempotency,
  fingerprintRequest,
  type IdempotencyOptions,
  memoryStore,
  mintKey,
  parseIdempotencyKey,
  type Store,
  type StoredResponse,
} from '@idem/core';

/** What the server saw of one request. */
export interface ServerRequestLog {
  key: string | undefined;
  authorization: string | undefined;
  status: number | 'dropped';
}

/** Knobs of {@link startChargesServer}, each one a fault or a behaviour a test needs. */
export interface ChargesServerOptions {
  /** Executions whose response is dropped after the outcome is stored (socket destroyed). */
  dropResponses?: number;
  /** Resolves when the handler may finish; the first execution waits for it. */
  holdFirstExecution?: Promise<void>;
  /** Requests without a key get a key minted by the server (spec 3.1 rule 3). */
  mintKeys?: boolean;
  /** With mintKeys: answer 504 with the minted key while the execution goes on (a gateway timeout). */
  answerMintedWith504?: boolean;
  store?: Store;
  engine?: Partial<IdempotencyOptions>;
}

/**
 * A real `node:http` server with one idempotent route, `POST /charges`, built on @idem/core's engine
 * and memory store: the server half of the protocol, with faults a client must survive.
 */
export async function startChargesServer(options: ChargesServerOptions = {}) {
  const engine = createIdempotency({ store: options.store ?? memoryStore(), ...options.engine });
  const log: ServerRequestLog[] = [];
  const charges: Array<{ id: string; amount: unknown }> = [];
  let dropsLeft = options.dropResponses ?? 0;
  let executions = 0;
  let started: () => void = () => undefined;
  const firstStarted = new Promise<void>((resolve) => {
    started = resolve;
  });
  const background = new Set<Promise<unknown>>();

  const send = (res: ServerResponse, response: StoredResponse, extra: Record<string, string> = {}) => {
    res.writeHead(response.status, { ...response.headers, ...extra });
    res.end(Buffer.from(response.body));
  };

  const problem = (status: number, body: object, headers: Record<string, string> = {}): StoredResponse => ({
    status,
    headers: { 'content-type': 'application/problem+json', ...headers },
    body: new TextEncoder().encode(JSON.stringify(body)),
  });

  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const body = Buffer.concat(chunks);
    const authorization = req.headers.authorization;
    const entry: ServerRequestLog = { key: undefined, authorization, status: 0 };
    log.push(entry);
    if (req.method !== 'POST' || req.url !== '/charges') {
      entry.status = 404;
      send(res, problem(404, { title: 'not found' }));
      return;
    }
    let minted: string | undefined;
    let key: string;
    const parsed = parseIdempotencyKey(req.headersDistinct['idempotency-key']);
    if (parsed.ok) {
      key = parsed.key;
    } else if (options.mintKeys && req.headers['idempotency-key'] === undefined) {
      minted = mintKey();
      key = minted;
    } else {
      entry.status = parsed.error.status;
      send(res, problem(parsed.error.status, parsed.error.toProblem()));
      return;
    }
    entry.key = key;
    // The caller is the user the token names, not the token itself: a refreshed token is the same caller.
    const scope = (authorization ?? 'anonymous').replace(/^Bearer /, '').split('.')[0] ?? 'anonymous';
    const fingerprint = fingerprintRequest({
      method: 'POST',
      route: '/charges',
      path: '/charges',
      contentType: req.headers['content-type'],
      body,
    });
    const begun = await engine.begin({ key, scope, operation: 'POST /charges', fingerprint });
    const keyHeader = { 'idempotency-key': minted ?? key };
    if (begun.kind === 'replay') {
      entry.status = begun.response.status;
      send(res, begun.response, { 'idempotent-replayed': 'true', 'cache-control': 'no-store', ...keyHeader });
      return;
    }
    if (begun.kind === 'reject') {
      const error = begun.error;
      const retryAfter: Record<string, string> =
        error.retryAfter === undefined ? {} : { 'retry-after': String(error.retryAfter) };
      entry.status = error.status;
      send(res, problem(error.status, error.toProblem(), retryAfter));
      return;
    }
    const execute = async (): Promise<StoredResponse> => {
      executions++;
      const first = executions === 1;
      if (first) started();
      if (first && options.holdFirstExecution) await options.holdFirstExecution;
      // The side effect: one charge per execution.
      const charge = { id: `ch_${charges.length + 1}`, amount: JSON.parse(body.toString('utf8')).amount };
      charges.push(charge);
      const response: StoredResponse = {
        status: 201,
        headers: { 'content-type': 'application/json', location: `/charges/${charge.id}` },
        body: new TextEncoder().encode(JSON.stringify(charge)),
      };
      await engine.complete(begun.lease, response);
      return response;
    };
    if (minted !== undefined && options.answerMintedWith504) {
      const running = execute();
      background.add(running);
      running.finally(() => background.delete(running));
      entry.status = 504;
      send(res, problem(504, { title: 'upstream timed out; retry with the minted key' }, keyHeader));
      return;
    }
    const response = await execute();
    if (dropsLeft > 0) {
      dropsLeft--;
      entry.status = 'dropped';
      // The outcome is committed, but the client never hears of it.
      res.socket?.destroy();
      return;
    }
    entry.status = response.status;
    send(res, response, keyHeader);
  };

  const server = createServer((req, res) => {
    handle(req, res).catch((error: unknown) => {
      res.statusCode = 500;
      res.end(String(error));
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    log,
    charges,
    firstStarted,
    settled: () => Promise.all([...background]),
    close: async () => {
      server.closeAllConnections();
      server.close();
      await once(server, 'close');
    },
  };
}

/** A store that fails its first `failures` claims, like a Redis that is briefly unreachable. */
export function flakyStore(failures: number, inner: Store = memoryStore()): Store {
  let left = failures;
  return {
    claim: (input) => {
      if (left === Number.POSITIVE_INFINITY || left-- > 0) return Promise.reject(new Error('connection refused'));
      return inner.claim(input);
    },
    renew: (input) => inner.renew(input),
    complete: (input) => inner.complete(input),
    release: (input) => inner.release(input),
    get: (id) => inner.get(id),
  };
}

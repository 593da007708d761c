// Was a defect: on a server that is not Express (plain node:http, Connect, a NestJS middleware on the Fastify platform via middie) the middleware builds the operation from req.baseUrl + req.path, which only Express sets, and fails every covered request with "TypeError: path.indexOf is not a function".
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { memoryStore } from '@idem/core';
import type { NextFunction, Request, Response } from 'express';
import { describe, expect, it } from 'vitest';
import { idempotency } from '../src/index.js';

// Audit (branch audit-nest): @idem/webhooks documents its Express glue on a plain node:http server
// (`createServer(expressWebhook(receiver))`); the idempotency middleware is the one a NestJS app on
// @nestjs/platform-fastify gets when it applies it with a MiddlewareConsumer (middie hands it the raw
// IncomingMessage, with `originalUrl` but neither `path` nor `baseUrl`), and what a node:http or
// Connect user reaches for. Such a request has `url` (and, from middie or Connect, `originalUrl`).
async function withPlainServer(run: (url: string, runs: Record<string, number>) => Promise<void>) {
  const runs: Record<string, number> = {};
  const middleware = idempotency({ store: memoryStore(), scope: () => 'tenant_1' });
  const handler = (req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    req.on('end', () => {
      const path = (req.url ?? '/').split('?')[0] as string;
      runs[path] = (runs[path] ?? 0) + 1;
      res.statusCode = 201;
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ path, run: runs[path] }));
    });
  };
  const server = createServer((req, res) => {
    // What middie and Connect add: the URL as it came.
    (req as IncomingMessage & { originalUrl?: string }).originalUrl = req.url;
    const next: NextFunction = (error?: unknown) => {
      if (error !== undefined) {
        res.statusCode = 500;
        res.end(String(error));
        return;
      }
      handler(req, res);
    };
    middleware(req as unknown as Request, res as unknown as Response, next);
  });
  server.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  try {
    await run(`http://127.0.0.1:${(server.address() as AddressInfo).port}`, runs);
  } finally {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}

const post = async (url: string, key: string) => {
  const response = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key },
    body: '{"amount":100}',
  });
  return {
    status: response.status,
    replayed: response.headers.get('idempotent-replayed'),
    body: await response.text(),
  };
};

describe('the Express middleware outside Express (node:http, Connect, NestJS middleware on Fastify)', () => {
  it('a retry with the same key replays the first answer, and another path with that key is another operation', async () => {
    await withPlainServer(async (url, runs) => {
      const first = await post(`${url}/charges`, 'k-plain-1');
      expect(first.status).toBe(201);
      const retry = await post(`${url}/charges`, 'k-plain-1');
      expect(retry).toEqual({ status: 201, replayed: 'true', body: first.body });
      // The same key on another path is another operation: it runs, and is not handed /charges' answer.
      const other = await post(`${url}/refunds`, 'k-plain-1');
      expect(other.status).toBe(201);
      expect(JSON.parse(other.body)).toEqual({ path: '/refunds', run: 1 });
      expect(runs).toEqual({ '/charges': 1, '/refunds': 1 });
    });
  });
});

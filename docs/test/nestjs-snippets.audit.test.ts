// docs/guides/nestjs.md's NestJS snippets are type-checked by code-blocks.test.ts and run, as the page
// mounts them, by nestjs-guide.int.test.ts. What is checked here, quickly and without NestJS: every
// @idem export a snippet uses is imported by it, and a snippet that mounts idempotency says where
// its scope comes from (a guard before it, or a `scope` option), since without either every keyed
// request is 500 scope_missing. Its node:http section is run.
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { memoryStore } from '@idem/core';
import * as express from '@idem/express';
import * as fastify from '@idem/fastify';
import type { NextFunction, Request, Response } from 'express';
import { describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));
const page = readFileSync(join(root, 'docs', 'guides', 'nestjs.md'), 'utf8');
const blocks = [...page.matchAll(/^```ts\n([\s\S]*?)^```/gm)]
  .map((match) => match[1] as string)
  .filter((block) => block.includes("from '@nestjs/"));
const packages = { '@idem/express': Object.keys(express), '@idem/fastify': Object.keys(fastify) };

describe('docs/guides/nestjs.md, its NestJS snippets', () => {
  it('has the two NestJS mounting snippets', () => {
    expect(blocks.filter((block) => /from '@idem\/(express|fastify)'/.test(block))).toHaveLength(2);
  });

  // Was wrong: the "NestJS on Express" snippet called `guard(edge)` without importing `guard`, and
  // the "NestJS on Fastify" one registered idempotency with neither a guard nor a `scope`.
  it.each(
    blocks
      .filter((block) => /from '@idem\/(express|fastify)'/.test(block))
      .map((block) => [/from '(@idem\/[a-z]+)'/.exec(block)?.[1], block] as const),
  )('the %s snippet imports every @idem export it uses, and scopes its keys', (_name, block) => {
    const from = /from '(@idem\/(?:express|fastify))'/.exec(block)?.[1] as keyof typeof packages;
    const imported = new Set(
      (/import \{([^}]*)\} from '@idem\/(?:express|fastify)'/.exec(block)?.[1] ?? '')
        .split(',')
        .map((name) => name.replace(/^\s*type\s+/, '').trim()),
    );
    const code = block.replace(/^import[^\n]*\n/gm, '').replace(/\/\/[^\n]*/g, '');
    // A name used, not an object key spelt the same (`guard: edge`).
    const used = packages[from].filter((name) => new RegExp(`\\b${name}\\b(?!\\s*:)`).test(code));
    expect(used.filter((name) => !imported.has(name))).toEqual([]);
    if (used.includes('idempotency')) {
      expect(/\bguard\b|scope/.test(code), 'no guard before idempotency and no scope').toBe(true);
    }
  });
});

describe('docs/guides/nestjs.md, Connect and plain node:http', () => {
  // "every 404 counts as 'no route': it is not stored and its key is released", on a server that is
  // not Express (there is no route to tell a handler's 404 from a missing route's).
  it("on plain node:http a 404 is not stored: the retry runs; the page's 201 is replayed", async () => {
    const middleware = express.idempotency({ store: memoryStore(), scope: () => 'tenant-1' });
    let runs = 0;
    const server = createServer((req, res) => {
      const next: NextFunction = () => {
        runs++;
        res.statusCode = req.url === '/missing' ? 404 : 201;
        res.setHeader('content-type', 'application/json');
        res.end('{"id":"ch_1"}');
      };
      void middleware(req as Request, res as Response, next);
    }).listen(0, '127.0.0.1');
    await once(server, 'listening');
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const post = (path: string) => fetch(`${url}${path}`, { method: 'POST', headers: { 'idempotency-key': '"k"' } });
    try {
      expect((await post('/missing')).status).toBe(404);
      const again = await post('/missing');
      expect(again.headers.get('idempotent-replayed')).toBeNull();
      expect(runs).toBe(2);
      expect((await post('/charges')).status).toBe(201);
      expect((await post('/charges')).headers.get('idempotent-replayed')).toBe('true');
      expect(runs).toBe(3);
    } finally {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    }
  });
});

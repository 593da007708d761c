// What the relay audits share: real HTTP endpoints that count what reached them, a db that lets a
// test watch (and hold) the relay's queries, and a poll for a condition.
import { randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type pg from 'pg';
import { afterAll, afterEach, beforeAll } from 'vitest';
import { createOutbox, type Queryable, type Relay } from '../../src/index.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `condition` every 10 ms; throws naming `what` after `timeoutMs`. */
export async function until(condition: () => boolean | Promise<boolean>, what: string, timeoutMs = 20_000) {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

export type Handler = (request: IncomingMessage, response: ServerResponse) => void;

/** Answers after `ms`. */
export const slowly =
  (ms: number): Handler =>
  (_request, response) =>
    setTimeout(() => response.end('ok'), ms);

/** Never answers: a dead endpoint, as the relay meets it (its timeout runs out). */
export const hanging: Handler = () => undefined;

/**
 * A real endpoint on its own port: counts each webhook-id it got, and how many requests it had open
 * at once (the most, over its life), per path (each path a URL of its own).
 */
export async function endpoint(handler: Handler = (_request, response) => response.end('ok')) {
  const arrivals = new Map<string, number>();
  const open = new Map<string, number>();
  const mostOpen = new Map<string, number>();
  const server = createServer((request, response) => {
    const path = request.url ?? '/';
    open.set(path, (open.get(path) ?? 0) + 1);
    mostOpen.set(path, Math.max(mostOpen.get(path) ?? 0, open.get(path) ?? 0));
    response.on('close', () => open.set(path, (open.get(path) ?? 1) - 1));
    request.resume();
    request.on('end', () => {
      const id = String(request.headers['webhook-id']);
      arrivals.set(id, (arrivals.get(id) ?? 0) + 1);
      handler(request, response);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    base: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    arrivals,
    mostOpen,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** A db that passes every query to `pool` and lets the test watch (and hold) them. */
export function watched(pool: Queryable) {
  const queries: { text: string; values: unknown[] }[] = [];
  let hold: ((text: string) => boolean) | undefined;
  const db: Queryable = {
    query: ((text: string, values?: unknown[]) => {
      queries.push({ text, values: values ?? [] });
      if (hold?.(text)) return new Promise(() => undefined);
      return pool.query(text, values);
    }) as Queryable['query'],
  };
  return {
    db,
    queries,
    /** The relay's claims (the head of `_due`; the walk that may follow is not one). */
    claims: () => queries.filter((query) => query.text.includes('candidate AS')),
    holdWhen: (when: ((text: string) => boolean) | undefined) => {
      hold = when;
    },
  };
}

/**
 * An outbox table of the calling suite's own on `pool` (`<prefix>_<random>`): migrated before its
 * tests, dropped after them with the pool ended. The relays `started` starts are stopped after each
 * test (a relay left running would claim the next test's rows); `closers` (endpoints, say) run after
 * all of them, last added first.
 */
export function relayTable(pool: pg.Pool, prefix: string) {
  const table = `${prefix}_${randomBytes(4).toString('hex')}`;
  const outbox = createOutbox({ table });
  const closers: (() => Promise<unknown>)[] = [];
  const running: Relay[] = [];
  beforeAll(async () => {
    await outbox.migrate(pool);
  });
  afterEach(async () => {
    await Promise.all(running.splice(0).map((relay) => relay.stop()));
  });
  afterAll(async () => {
    for (const close of closers.reverse()) await close().catch(() => undefined);
    await pool.query(`DROP TABLE IF EXISTS "${table}"`);
    await pool.end();
  });
  return {
    table,
    outbox,
    closers,
    clear: () => pool.query(`DELETE FROM "${table}"`),
    started: (relay: Relay) => {
      relay.start();
      running.push(relay);
      return relay;
    },
  };
}

// The API and the webhook receiver while their database fails, through the gateway. DESIGN.md's HTTP
// table: a store that failed is a 503 with Retry-After, as problem+json, never a 500; the receiver's
// events page, a browser's, answers an HTML page. A bug (a TypeError) is still a 500. The
// idempotency layer's own answer to its store failing (503 `store_unavailable`) is the core's and is
// not what this file is about: the stores here keep working, only the routes' own statements fail.
//
// The fault is the database's own: while `fault` is 'down', every statement the API and the receiver
// send through their handle is replaced by one the database refuses with the error of a connection
// terminated by the server (57P01), on PGlite and PostgreSQL.
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { receiverAdminPrefix } from '../src/receiver/server.js';
import { databases, dbFaults } from './db-faults.js';
import { startTestStack, type TestStack } from './test-stack.js';

describe.each(databases)('the API and the receiver while their database fails, on %s', (_name, embedded) => {
  let test: TestStack;
  const faults = dbFaults();

  beforeAll(async () => {
    test = await startTestStack('resource_store', {
      embedded,
      wrapDb: faults.wrap,
    });
  }, 60_000);

  afterAll(async () => {
    await test?.close();
  });

  const during = faults.during;

  const call = async (method: string, path: string, options: { roles?: string[]; body?: unknown } = {}) =>
    fetch(new URL(path, test.stack.gateway.url), {
      method,
      headers: {
        authorization: `Bearer ${await test.token({ roles: options.roles ?? [] })}`,
        ...(options.body === undefined
          ? {}
          : { 'content-type': 'application/json', 'idempotency-key': `"${randomUUID()}"` }),
      },
      ...(options.body === undefined ? {} : { body: JSON.stringify(options.body) }),
    });

  const expectUnavailableProblem = async (answer: Response) => {
    expect(answer.status).toBe(503);
    expect(answer.headers.get('retry-after')).toMatch(/^[1-9][0-9]*$/);
    expect(answer.headers.get('content-type')).toMatch(/^application\/problem\+json/);
    expect(answer.headers.get('cache-control')).toBe('no-store');
    expect(await answer.json()).toMatchObject({ status: 503, code: 'database_unavailable', retryable: true });
  };

  it.each([
    ['GET', '/stock?item=item-1', undefined],
    ['GET', '/settings', undefined],
    ['PUT', '/settings', { theme: 'dark' }],
    ['GET', '/photos', undefined],
  ] as const)('answers the API %s %s 503 problem+json with Retry-After', async (method, path, body) => {
    await expectUnavailableProblem(await during('down', () => call(method, path, { body })));
    expect((await call(method, path, { body })).status).toBe(200);
  });

  it('answers a keyed create 503 with Retry-After and keeps nothing under its key: the retry with it creates', async () => {
    const key = `"${randomUUID()}"`;
    const create = async () =>
      fetch(new URL('/photos', test.stack.gateway.url), {
        method: 'POST',
        headers: {
          authorization: `Bearer ${await test.token()}`,
          'content-type': 'application/json',
          'idempotency-key': key,
        },
        body: JSON.stringify({ title: 'Gryphon' }),
      });
    await expectUnavailableProblem(await during('down', create));
    const retried = await create();
    expect(retried.status).toBe(201);
    expect(retried.headers.get('idempotent-replayed')).toBeNull();
    const { id } = (await retried.json()) as { id: string };
    await expectUnavailableProblem(await during('down', () => call('DELETE', `/photos/${id}`)));
  });

  it("answers the receiver's admin reads and notes 503 problem+json with Retry-After", async () => {
    const admin = { roles: ['admin'] };
    await expectUnavailableProblem(await during('down', () => call('GET', receiverAdminPrefix, admin)));
    await expectUnavailableProblem(
      await during('down', () =>
        call('POST', `${receiverAdminPrefix}/evt_1/notes`, { ...admin, body: { text: 'looked at it' } }),
      ),
    );
    expect((await call('GET', receiverAdminPrefix, admin)).status).toBe(200);
  });

  it("answers the receiver's events page 503 with an HTML page and Retry-After", async () => {
    const answer = await during('down', () => fetch(test.stack.receiver.pageUrl));
    expect(answer.status).toBe(503);
    expect(answer.headers.get('retry-after')).toMatch(/^[1-9][0-9]*$/);
    expect(answer.headers.get('content-type')).toMatch(/^text\/html/);
    expect(await answer.text()).toContain('could not reach its database');
    expect((await fetch(test.stack.receiver.pageUrl)).status).toBe(200);
  });

  it('still answers 500 for a bug, in the API and in the receiver', async () => {
    const api = await during('bug', () => call('GET', '/settings'));
    expect(api.status).toBe(500);
    expect(api.headers.get('retry-after')).toBeNull();
    const receiver = await during('bug', () => call('GET', receiverAdminPrefix, { roles: ['admin'] }));
    expect(receiver.status).toBe(500);
    expect(receiver.headers.get('retry-after')).toBeNull();
  });
});

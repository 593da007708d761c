// pipe-left.audit.test.ts in transactional mode (PostgreSQL): a client that leaves before the first
// chunk of a body stream piped into its held response. Nothing went out and nothing can be stored
// with the transaction, so the transaction rolls back and the key is released: the retry runs the
// operation, whose first run left no effect. Waited for instead, the transaction stayed open and the
// key in progress (409) for as long as the process lived.
import { randomUUID } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import {
  closedAfterEach,
  pipeLeftCases,
  postSlow,
  startPipeLeftServer,
  within,
} from './audit-support/pipe-left-servers.js';
import { postgresStoreTable } from './audit-support/postgres-store-table.js';

const { available: withPostgres, store } = await postgresStoreTable(
  'audit_pipe_left',
  'the transactional pipe-left audit',
);

const servers = closedAfterEach();

describe.runIf(withPostgres)(
  'transactional: a client that leaves before the first chunk of a piped body stream',
  () => {
    it.each(pipeLeftCases)(
      '%s (HTTP/2: %s): the transaction rolls back and the key is released, the retry runs',
      async (name, http2) => {
        const server = await startPipeLeftServer(name, store(), {
          http2,
          extra: { transactional: true },
        });
        servers.push(server);
        const key = randomUUID();
        expect(await postSlow(server, key, server.piped)).toBeUndefined();
        const events = await within(server.settled, 8000, 'the key settled');
        expect(events.map((event) => event.type)).toContain('release');
        const retry = await postSlow(server, key);
        expect(retry?.status).toBe(201);
        expect(retry?.headers['idempotent-replayed']).toBeUndefined();
        expect(retry?.body).toBe('second run');
        expect(server.runs()).toBe(2);
      },
      20_000,
    );
  },
);

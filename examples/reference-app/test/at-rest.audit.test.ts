// Audit (branch audit-atrest): what the reference app keeps in its database, and for how long.
// docs/operations.md ("Purge jobs"): on PostgreSQL an expired idempotency record is invisible at once
// but "the row stays until purged", so `purgeExpired()` must run on a timer. The reference app runs
// one for the identity provider's rows (start.ts) but had none for its three idempotency tables.
import { exportJWK, generateKeyPair } from 'jose';
import { expect, it, vi } from 'vitest';
import { startResourceStack } from '../src/api/resource-stack.js';
import { openDatabase } from '../src/db.js';
import { apiTables } from '../src/schema/api-schema.js';

const recordTables = [apiTables.idempotency, apiTables.plainIdempotency, apiTables.receiverInbox];

// Was wrong: the API's charge records, its other routes' records and the receiver's inbox (every
// response body kept for a charge, every webhook id) stayed in the database forever once expired: the
// tables only grew, and the stored responses outlived the retention the docs promise. Expected: the
// resource stack purges them on a timer, as start.ts does for the provider's rows.
it('deletes expired idempotency records of the API and the receiver on a timer, and only those, until closed', async () => {
  const db = await openDatabase({ memory: true });
  const pair = await generateKeyPair('ES256');
  const jwk = { ...(await exportJWK(pair.publicKey)), kid: 'at-rest', alg: 'ES256' };
  // Only the purge's interval is faked: the database and the servers run as they do.
  vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
  try {
    const stack = await startResourceStack({
      db,
      gatewayPort: 0,
      apiPort: 0,
      receiverPort: 0,
      baseUrl: 'http://gateway.at-rest-test',
      issuers: [{ issuer: 'https://issuer.at-rest-test.example', jwks: { keys: [jwk] }, algorithms: ['ES256'] }],
      relay: false,
    });
    const row = (table: string, id: string, state: string, expires: string) =>
      db.query(
        `insert into ${table} (id, state, token, fingerprint, status, headers, body, expires_at)
         values ($1, $2, 't', 'f', 201, '{}'::jsonb, '\\x7b7d'::bytea, ${expires})`,
        [id, state],
      );
    const ids = async (table: string) =>
      (await db.query<{ id: string }>(`select id from ${table} order by id`)).rows.map((found) => found.id);
    for (const table of recordTables) {
      await row(table, 'completed-expired', 'completed', "now() - interval '1 minute'");
      await row(table, 'completed-live', 'completed', "now() + interval '1 hour'");
      // A claim abandoned in progress goes only a grace (one hour) after its keep ended.
      await row(table, 'in-progress-long-gone', 'in_progress', "now() - interval '2 hours'");
      await row(table, 'in-progress-in-grace', 'in_progress', "now() - interval '1 minute'");
    }
    await vi.advanceTimersByTimeAsync(600_000);
    // The pass runs on the real database: wait for it, not for a time.
    for (let turn = 0; turn < 500 && (await ids(apiTables.receiverInbox)).includes('completed-expired'); turn++) {
      await new Promise((resolve) => setImmediate(resolve));
    }
    for (let turn = 0; turn < 500 && (await ids(apiTables.idempotency)).includes('completed-expired'); turn++) {
      await new Promise((resolve) => setImmediate(resolve));
    }
    for (const table of recordTables) {
      expect({ table, ids: await ids(table) }).toEqual({
        table,
        ids: ['completed-live', 'in-progress-in-grace'],
      });
    }
    await stack.close();
    await row(apiTables.idempotency, 'expired-after-close', 'completed', "now() - interval '1 minute'");
    await vi.advanceTimersByTimeAsync(600_000);
    expect(await ids(apiTables.idempotency)).toContain('expired-after-close');
  } finally {
    vi.useRealTimers();
    await db.close();
  }
}, 60_000);

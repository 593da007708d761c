// Start-up cost: each schema script runs once per start. The API's and the receiver's tables were
// created three times (by startResourceStack, then again by startReceiver and startApi on the same
// database) and the provider's twice (by startReferenceApp, then again by seed): each run takes the
// schema's advisory lock and asks the catalog about every table, a tenth of a second or more per run.
import { generateKeyPair } from 'jose';
import { describe, expect, it } from 'vitest';
import { startResourceStack } from '../src/api/resource-stack.js';
import { type Database, openDatabase } from '../src/db.js';
import { startReferenceApp } from '../src/start.js';

// The database, counting the schema scripts that create the given table.
function countingScripts(db: Database, table: string): { db: Database; runs: () => number } {
  let runs = 0;
  const marker = `create table if not exists ${table} (`;
  const counted: Database = {
    kind: db.kind,
    client: db.client,
    query: (text, params) => db.query(text, params),
    exec(sql) {
      if (sql.includes(marker)) runs++;
      return db.exec(sql);
    },
    close: () => db.close(),
  };
  return { db: counted, runs: () => runs };
}

describe('start-up schema scripts', () => {
  it("startResourceStack runs the API's and the receiver's schema script once", async () => {
    const db = await openDatabase({ memory: true });
    const { db: counted, runs } = countingScripts(db, 'api_charges');
    const { publicKey } = await generateKeyPair('ES256');
    const { exportJWK } = await import('jose');
    const jwk = { ...(await exportJWK(publicKey)), kid: 'k', alg: 'ES256', use: 'sig' };
    try {
      const stack = await startResourceStack({
        db: counted,
        gatewayPort: 0,
        apiPort: 0,
        receiverPort: 0,
        baseUrl: 'http://localhost:1',
        issuers: [{ issuer: 'http://issuer.test', jwks: { keys: [jwk] }, algorithms: ['ES256'] }],
        relay: false,
      });
      await stack.close();
      expect(runs()).toBe(1);
    } finally {
      await db.close();
    }
  });

  it("startReferenceApp runs the provider's schema script once", async () => {
    const db = await openDatabase({ memory: true });
    const { db: counted, runs } = countingScripts(db, 'idp_users');
    try {
      const running = await startReferenceApp({ db: counted, authPort: 0, appPort: 0, baseUrl: 'http://localhost:1' });
      await running.close();
      expect(runs()).toBe(1);
    } finally {
      await db.close();
    }
  });
});

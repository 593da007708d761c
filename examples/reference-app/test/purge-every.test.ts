import { describe, expect, it } from 'vitest';
import { startResourceStack } from '../src/api/resource-stack.js';
import type { Database } from '../src/db.js';
import { purgeExpiredModels } from '../src/idp/adapter.js';
import { listen } from '../src/listen.js';
import { defaultPurgeEveryMs, purgeEvery } from '../src/purge-every.js';
import { startReferenceApp } from '../src/start.js';

// A database that refuses every statement and says which were tried: nothing in these tests gets as
// far as a statement unless a check is missing.
function refusingDatabase(): Database & { tried: string[] } {
  const tried: string[] = [];
  const refuse = async (text: string) => {
    tried.push(text);
    throw new Error('the database is down');
  };
  return {
    kind: 'postgres',
    client: {} as Database['client'],
    tried,
    query: refuse as Database['query'],
    exec: refuse,
    close: async () => undefined,
  };
}

describe('purgeEveryMs', () => {
  // 0, a negative, a fraction, NaN and anything past a Node timer's longest delay each made
  // setInterval fire every millisecond (a warning aside): the whole purge a thousand times a second.
  const wrong = [0, -1, 1.5, Number.NaN, Number.POSITIVE_INFINITY, 2 ** 31, 3_000_000_000];

  it.each(wrong)('refuses %s at once', (value) => {
    expect(() => purgeEvery(value, 'purgeEveryMs')).toThrow(
      new TypeError(`purgeEveryMs must be a whole number of milliseconds from 1 to 2147483647, not ${String(value)}`),
    );
  });

  it('takes 1 to 2147483647 as given, and undefined as ten minutes', () => {
    expect(purgeEvery(1, 'purgeEveryMs')).toBe(1);
    expect(purgeEvery(2_147_483_647, 'purgeEveryMs')).toBe(2_147_483_647);
    expect(purgeEvery(undefined, 'purgeEveryMs')).toBe(defaultPurgeEveryMs);
    expect(defaultPurgeEveryMs).toBe(600_000);
  });

  it('startReferenceApp refuses a wrong one before it binds a port or touches the database', async () => {
    const db = refusingDatabase();
    const port = await listen(0);
    const taken = port.port;
    await port.close();
    await expect(
      startReferenceApp({ db, authPort: taken, appPort: 0, baseUrl: 'http://localhost:8080', purgeEveryMs: 0 }),
    ).rejects.toThrow(/^purgeEveryMs must be a whole number of milliseconds/);
    expect(db.tried).toEqual([]);
    // Nothing was left listening on the port it was given.
    const again = await listen(taken);
    await again.close();
  });

  it('startResourceStack refuses a wrong one before the schema, and closes the gateway port it was handed', async () => {
    const db = refusingDatabase();
    const gatewayPort = await listen(0);
    await expect(
      startResourceStack({ db, gatewayPort, apiPort: 0, receiverPort: 0, purgeEveryMs: -5, relay: false }),
    ).rejects.toThrow(/^purgeEveryMs must be a whole number of milliseconds/);
    expect(db.tried).toEqual([]);
    expect(gatewayPort.server.listening).toBe(false);
  });

  it('startResourceStack closes the gateway port it was handed when the schema cannot be written', async () => {
    const db = refusingDatabase();
    const gatewayPort = await listen(0);
    await expect(startResourceStack({ db, gatewayPort, apiPort: 0, receiverPort: 0, relay: false })).rejects.toThrow(
      'the database is down',
    );
    expect(db.tried.length).toBeGreaterThan(0);
    expect(gatewayPort.server.listening).toBe(false);
  });

  it.each([
    ['refreshTokenReuseSeconds', { refreshTokenReuseSeconds: -1 }, /^refreshTokenReuseSeconds must be a whole number/],
    ['loginThrottle', { loginThrottle: { maxFailures: 0 } }, /^maxFailures must be a positive integer/],
    [
      'loginThrottle per address',
      { loginThrottle: { maxFailures: 10, maxFailuresPerAddress: 5 } },
      /^maxFailuresPerAddress must be an integer no lower than maxFailures/,
    ],
  ])(
    'startReferenceApp refuses a wrong %s before it binds a port or touches the database',
    async (_name, bad, message) => {
      const db = refusingDatabase();
      const port = await listen(0);
      const taken = port.port;
      await port.close();
      await expect(
        startReferenceApp({ db, authPort: taken, appPort: 0, baseUrl: 'http://localhost:8080', ...bad }),
      ).rejects.toThrow(message);
      expect(db.tried).toEqual([]);
      const again = await listen(taken);
      await again.close();
    },
  );
});

describe('purgeExpiredModels', () => {
  // The refusal said "a positive integer" for 1e21, which is one: it now names the real bound.
  it('refuses a batchSize that is not a positive safe integer before any statement, naming the bound', async () => {
    for (const batchSize of [0, -1, 1.5, Number.NaN, 1e21, 2 ** 53]) {
      const db = refusingDatabase();
      await expect(purgeExpiredModels(db, batchSize), String(batchSize)).rejects.toThrow(
        new TypeError('batchSize must be a positive safe integer (at most 9007199254740991)'),
      );
      expect(db.tried).toEqual([]);
    }
  });
});

import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { migrate } from '@idem/postgres';
import { redisAnswers } from '@idem/testkit';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createSigner } from '../src/index.js';
import { databaseUrl, postgresAvailable, testPool, uniqueTable } from './support/postgres.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const signer = createSigner({ secret: SECRET });
const root = fileURLToPath(new URL('../../..', import.meta.url));
const redisUrl = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const prefix = `audit-receiver:pair:${process.pid}:${Date.now()}:`;
const pgUp = await postgresAvailable('two-process receiver');
const redisUp = await redisAnswers(redisUrl);
const records = uniqueTable('records');
const effects = uniqueTable('effects');
const pool = testPool();
const children: ChildProcess[] = [];

function start(env: Record<string, string>): Promise<string> {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', fileURLToPath(new URL('./fixtures/receiver-pair-process.ts', import.meta.url))],
    {
      cwd: root,
      env: { ...process.env, WEBHOOK_SECRET: SECRET, ...env },
      stdio: ['ignore', 'pipe', 'inherit'],
    },
  );
  children.push(child);
  return new Promise((resolve, reject) => {
    let seen = '';
    child.stdout?.on('data', (chunk: Buffer) => {
      seen += chunk.toString();
      const match = /listening (\d+)/.exec(seen);
      if (match) resolve(`http://127.0.0.1:${match[1]}/hooks`);
    });
    child.once('exit', (code) => reject(new Error(`receiver process exited early (${code})`)));
  });
}

// Twenty senders deliver one event at once, alternately to two receiver processes on one store;
// each sender signs its own attempt, as retries do.
async function storm(urls: string[], id: string): Promise<number[]> {
  const body = Buffer.from(JSON.stringify({ type: 'payment.succeeded', id }));
  const answers = await Promise.all(
    Array.from({ length: 20 }, (_, i) =>
      fetch(urls[i % urls.length]!, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...signer.sign({ id, body, timestamp: new Date() }) },
        body,
      }),
    ),
  );
  await Promise.all(answers.map((answer) => answer.arrayBuffer()));
  return answers.map((answer) => answer.status);
}

afterAll(async () => {
  for (const child of children) child.kill('SIGKILL');
  if (pgUp) {
    await pool.query(`DROP TABLE IF EXISTS "${records}"`);
    await pool.query(`DROP TABLE IF EXISTS "${effects}"`);
  }
  await pool.end();
});

describe.skipIf(!redisUp)('two receiver processes on Redis', () => {
  const admin = new Redis(redisUrl);
  admin.on('error', () => undefined);
  afterAll(async () => {
    const keys = await admin.keys(`${prefix}*`);
    if (keys.length) await admin.del(...keys);
    admin.disconnect();
  });

  it('twenty attempts of one delivery at once, split over both processes: applied once, every answer 200 or 409; twenty later attempts are all 200 and apply nothing', async () => {
    const env = { STORE: 'redis', REDIS_URL: redisUrl, REDIS_PREFIX: prefix };
    const urls = await Promise.all([start(env), start(env)]);
    for (const id of ['evt_pair_1', 'evt_pair_2', 'evt_pair_3']) {
      const statuses = await storm(urls, id);
      expect(statuses.every((status) => status === 200 || status === 409)).toBe(true);
      expect(await admin.llen(`${prefix}effects:${id}`)).toBe(1);
      expect((await storm(urls, id)).every((status) => status === 200)).toBe(true);
      expect(await admin.llen(`${prefix}effects:${id}`)).toBe(1);
    }
  });
});

describe.skipIf(!pgUp)('two receiver processes on PostgreSQL (transactional)', () => {
  beforeAll(async () => {
    await migrate(pool, { table: records });
    await pool.query(`CREATE TABLE "${effects}" (n serial PRIMARY KEY, event_id text NOT NULL, pid integer NOT NULL)`);
  });

  it('twenty attempts of one delivery at once, split over both processes: applied once, every answer 200 or 409; twenty later attempts are all 200 and apply nothing', async () => {
    const env = { STORE: 'postgres', DATABASE_URL: databaseUrl, RECORDS_TABLE: records, EFFECTS_TABLE: effects };
    const urls = await Promise.all([start(env), start(env)]);
    const applied = async (id: string) =>
      (await pool.query(`SELECT count(*)::int AS n FROM "${effects}" WHERE event_id = $1`, [id])).rows[0].n;
    for (const id of ['evt_pair_1', 'evt_pair_2', 'evt_pair_3']) {
      const statuses = await storm(urls, id);
      expect(statuses.every((status) => status === 200 || status === 409)).toBe(true);
      expect(await applied(id)).toBe(1);
      expect((await storm(urls, id)).every((status) => status === 200)).toBe(true);
      expect(await applied(id)).toBe(1);
    }
  });
});

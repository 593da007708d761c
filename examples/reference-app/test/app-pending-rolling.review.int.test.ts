// During a rolling deploy a process of the earlier version may add a sign-in with its state as it is
// after this version's start rewrote the table (schema.ts, hashPendingStates): its callback waits for
// the next start's rewrite, or an earlier-version process. Another sign-in's callback on this version
// must not throw it away meanwhile.
import { createHash, randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrateApp } from '../src/app/schema.js';
import { createSessionStore, type PendingSignIn } from '../src/app/sessions.js';
import type { Database } from '../src/db.js';
import { openTestDatabase } from './services.js';

let db: Database;

beforeAll(async () => {
  db = await openTestDatabase('app_pending_rolling');
  await migrateApp(db);
}, 60_000);

afterAll(async () => {
  await db?.close();
});

const hashOf = (id: string) => createHash('sha256').update(id).digest('base64url');
const random = () => randomBytes(32).toString('base64url');
const signIn = (): PendingSignIn => ({ state: random(), nonce: random(), codeVerifier: random(), returnTo: '/' });

describe('sign-ins in progress across a rolling deploy', () => {
  // Was wrong: takePending kept only the entries whose stateHash differed from the one taken, and an
  // entry of the earlier version has none (NULL <> x is not true): taking any sign-in of the session
  // dropped it, so its callback failed even after the next start's rewrite.
  it("taking this version's sign-in keeps one the earlier version added, which the next start makes usable", async () => {
    const store = createSessionStore(db, { ttlSeconds: 600 });
    const current = signIn();
    const legacy = signIn();
    const id = await store.create({ pending: [current] }, 60);
    // An earlier-version process appends its sign-in as it stores them: the state as it is.
    await db.query(
      `update app_sessions set data = jsonb_set(data, '{pending}', (data -> 'pending') || jsonb_build_array($2::jsonb))
        where id_hash = $1`,
      [hashOf(id), JSON.stringify(legacy)],
    );
    expect(await store.takePending(id, current.state)).toEqual(current);
    await migrateApp(db);
    expect(await store.takePending(id, legacy.state)).toEqual(legacy);
  });
});

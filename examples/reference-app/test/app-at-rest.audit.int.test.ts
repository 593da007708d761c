// Audit (branch audit-refapp): what the third-party app keeps in its session table that a reader of
// the database (a backup, a replica, an SQL injection elsewhere) could present. The identity
// provider keys what its clients and browsers present by a SHA-256 (src/idp/stored-id.ts); the app's
// session id has been stored as `id_hash` since the first version.
import { createHash, randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrateApp } from '../src/app/schema.js';
import { createSessionStore, type PendingSignIn } from '../src/app/sessions.js';
import type { Database } from '../src/db.js';
import { openTestDatabase } from './services.js';

let db: Database;

beforeAll(async () => {
  db = await openTestDatabase('app_at_rest');
  await migrateApp(db);
}, 60_000);

afterAll(async () => {
  await db?.close();
});

const hashOf = (id: string) => createHash('sha256').update(id).digest('base64url');
const random = () => randomBytes(32).toString('base64url');
const signIn = (): PendingSignIn => ({ state: random(), nonce: random(), codeVerifier: random(), returnTo: '/' });

/** Every row of the session table as text: whatever a reader of the database sees. */
async function tableText(): Promise<string> {
  const { rows } = await db.query<{ row: string }>('select row_to_json(s)::text as row from app_sessions s');
  return rows.map((row) => row.row).join('\n');
}

describe('the app session table at rest', () => {
  it('keeps no session id, only its hash (as since the first version)', async () => {
    const store = createSessionStore(db, { ttlSeconds: 600 });
    const id = await store.create({ user: { sub: 'user-alice' } });
    expect(await tableText()).not.toContain(id);
    expect(await store.get(id)).toEqual({ user: { sub: 'user-alice' } });
  });

  // Was wrong: a sign-in's `state` was kept as it is, next to its nonce and PKCE verifier. A reader of
  // the table held all three, which is what a forged callback needs to sign a victim's browser in to
  // the reader's account (login CSRF) while the victim's sign-in is in progress. Only the callback's
  // lookup needs the state, and a hash serves it.
  it("keeps no sign-in's state, and the callback still finds its transaction, once", async () => {
    const store = createSessionStore(db, { ttlSeconds: 600 });
    const first = signIn();
    const second = signIn();
    const id = await store.create({ pending: [first] }, 60);
    expect(await store.addPending(id, second)).toBe(true);
    const text = await tableText();
    expect(text).not.toContain(first.state);
    expect(text).not.toContain(second.state);
    expect(await store.takePending(id, second.state)).toEqual(second);
    expect(await store.takePending(id, second.state)).toBeUndefined();
    expect(await store.takePending(id, first.state)).toEqual(first);
  });

  it('rewrites sign-ins an earlier version stored with their state, once, and their callbacks still work', async () => {
    const store = createSessionStore(db, { ttlSeconds: 600 });
    const old = [signIn(), signIn()];
    const id = await store.create({}, 60);
    // The row as the earlier version wrote it: the pending sign-ins with their state as it is.
    await db.query('update app_sessions set data = $2::jsonb where id_hash = $1', [
      hashOf(id),
      JSON.stringify({ pending: old }),
    ]);
    expect(await tableText()).toContain(old[0]!.state);

    await migrateApp(db);
    const text = await tableText();
    for (const entry of old) expect(text).not.toContain(entry.state);
    const rewritten = (await db.query<{ data: unknown }>('select data from app_sessions order by id_hash')).rows;
    // A later start rewrites nothing again.
    await migrateApp(db);
    expect((await db.query<{ data: unknown }>('select data from app_sessions order by id_hash')).rows).toEqual(
      rewritten,
    );
    // Their order is kept: of the newest five after four more, the older one is gone.
    for (let n = 0; n < 4; n++) expect(await store.addPending(id, signIn())).toBe(true);
    expect(await store.takePending(id, old[0]!.state)).toBeUndefined();
    expect(await store.takePending(id, old[1]!.state)).toEqual(old[1]);
  });
});

// During a rolling deploy a process of the earlier version may add a sign-in with its state as it is
// after this version's start rewrote the table (schema.ts, hashPendingStates): its callback waits for
// the next start's rewrite, or an earlier-version process. Another sign-in's callback on this version
// must not throw it away meanwhile.
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

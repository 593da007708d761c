// Audit (upgrade path): accounts stored by an earlier version sign in on this one. Since the
// provider compares usernames and passwords in NFC (CHANGELOG: "stored, looked up and verified in
// NFC"), an account that an earlier version created with the decomposed spelling (NFD) of its name
// or password, as typed on some keyboards or pasted from a macOS file name, is stored as it was
// typed: its row and its argon2id hash are in fixtures/upgrade, exactly as commit 90ee851 wrote them.
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { Database } from '../src/db.js';
import { createPasswordChecker } from '../src/idp/passwords.js';
import type { RunningReferenceApp } from '../src/start.js';
import { openLoginForm } from './flow.js';
import { startTestIdp, type TestIdp } from './test-idp.js';

const fixture = JSON.parse(
  readFileSync(new URL('./fixtures/upgrade/idp-users-90ee851.json', import.meta.url), 'utf8'),
) as { rows: { id: string; username: string; password_hash: string; name: string; email: string; roles: string[] }[] };
const composed = { username: 'zoë.åström', password: 'Grüße aus Köln, café ☕' };
const decomposed = { username: composed.username.normalize('NFD'), password: composed.password.normalize('NFD') };

let started: TestIdp;
let db: Database;
let running: RunningReferenceApp;

beforeAll(async () => {
  started = await startTestIdp('idp_upgrade', { embedded: true });
  ({ db, running } = started);
}, 60_000);

// The rows exactly as the earlier version wrote them, before each test: a sign-in rewrites them.
beforeEach(async () => {
  for (const row of fixture.rows) {
    await db.query('delete from idp_users where id = $1', [row.id]);
    await db.query(
      'insert into idp_users (id, username, password_hash, name, email, roles) values ($1, $2, $3, $4, $5, $6)',
      [row.id, row.username, row.password_hash, row.name, row.email, row.roles],
    );
  }
});

afterAll(() => started?.close());

async function signIn(credentials: { username: string; password: string }) {
  const { agent, action, csrf } = await openLoginForm(running.authUrl, running.clients.app);
  return agent.postForm(action, {
    csrf,
    username: credentials.username,
    password: credentials.password,
  });
}

describe('an account an earlier version stored with the decomposed spelling', () => {
  it('is the row the fixture says: username and password hash as typed, in NFD', () => {
    const [row] = fixture.rows;
    expect(row?.username).toBe(decomposed.username);
    expect(row?.username).not.toBe(composed.username);
  });

  // Was wrong: since 758f6d4 the login form normalises the username and password to NFC before it
  // looks the account up and verifies the hash, but rows stored before keep the spelling they were
  // typed in: the lookup of the NFC name missed the NFD row, and the NFC password missed an argon2id
  // hash of the NFD one, so the owner was locked out by the upgrade, whichever spelling they typed.
  // Now the lookup finds the NFD row too (after an NFC one, if an earlier version kept both apart),
  // the password is verified in NFD as well when NFC fails (an unknown user costs as many verifies),
  // and a sign-in that matched so rewrites the row in NFC.
  it('signs in with the spelling its owner has always typed', async () => {
    const login = await signIn(decomposed);
    expect(login.body).not.toContain('id="login-error"');
    expect(login.response.status).toBe(303);
  });

  it('signs in with the composed spelling of the same name and password too', async () => {
    const login = await signIn(composed);
    expect(login.body).not.toContain('id="login-error"');
    expect(login.response.status).toBe(303);
  });

  it('is rewritten in NFC by its first sign-in, and found and verified by that spelling from then on', async () => {
    expect((await signIn(decomposed)).response.status).toBe(303);
    const [row] = fixture.rows;
    const { rows } = await db.query<{ username: string; password_hash: string }>(
      'select username, password_hash from idp_users where id = $1',
      [row?.id],
    );
    expect(rows[0]?.username).toBe(composed.username);
    expect(rows[0]?.password_hash).not.toBe(row?.password_hash);
    expect(await createPasswordChecker().match(rows[0]?.password_hash, composed.password)).toBe('nfc');
    expect((await signIn(composed)).response.status).toBe(303);
  });

  it('still refuses a wrong password', async () => {
    const login = await signIn({ ...decomposed, password: decomposed.password.replace('K', 'C') });
    expect(login.response.status).toBe(200);
    expect(login.body).toContain('id="login-error"');
  });
});

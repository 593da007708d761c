// Row 40: a login for a user who does not exist still runs one full argon2id verify, against a hash made
// with the same parameters as the real ones, so the response time does not tell who exists. Timing is
// not asserted (a timer is no test); the verify calls are counted instead.
import * as argon2 from '@node-rs/argon2';
import { afterAll, beforeAll, beforeEach, describe, expect, it, vi } from 'vitest';
import type { Database } from '../src/db.js';
import { createPasswordChecker, hashPassword } from '../src/idp/passwords.js';
import { demoUsers } from '../src/seed.js';
import { type RunningReferenceApp, startReferenceApp } from '../src/start.js';
import { openLoginForm } from './flow.js';
import { openTestDatabase } from './services.js';

vi.mock('@node-rs/argon2', async (importOriginal) => {
  const original = await importOriginal<typeof import('@node-rs/argon2')>();
  return { ...original, hash: vi.fn(original.hash), verify: vi.fn(original.verify) };
});

const verify = vi.mocked(argon2.verify);
const hash = vi.mocked(argon2.hash);
const owaspHash = /^\$argon2id\$v=19\$m=19456,t=2,p=1\$/;

beforeEach(() => {
  verify.mockClear();
  hash.mockClear();
});

describe('createPasswordChecker (row 40)', () => {
  it('makes its throwaway hash when it is built, not on the first unknown user (who would wait longer)', async () => {
    const checker = createPasswordChecker();
    expect(hash).toHaveBeenCalledTimes(1);
    await checker.check(undefined, 'any password');
    await checker.check(undefined, 'another');
    expect(hash).toHaveBeenCalledTimes(1);
  });

  it('runs one full argon2id verify with the real parameters when there is no stored hash', async () => {
    const checker = createPasswordChecker();
    expect(await checker.check(undefined, 'any password')).toBe(false);
    expect(verify).toHaveBeenCalledTimes(1);
    expect(verify.mock.calls[0]?.[0]).toMatch(owaspHash);
    // The dummy hash is made once; the second unknown user costs one verify, not a hash and a verify.
    expect(await checker.check(undefined, 'another password')).toBe(false);
    expect(verify).toHaveBeenCalledTimes(2);
    expect(verify.mock.calls[1]?.[0]).toBe(verify.mock.calls[0]?.[0]);
  });
});

// Spec 5.10: "The encoded hash string carries its own random salt." The format checks elsewhere would
// pass a fixed salt in passwordHashOptions; this one would not.
describe('hashPassword (spec 5.10)', () => {
  it('draws a new random salt for every hash: one password hashed twice gives two strings, both verify', async () => {
    const [first, second] = await Promise.all([hashPassword('same password'), hashPassword('same password')]);
    expect(first).toMatch(owaspHash);
    const saltOf = (hash: string) => hash.split('$')[4] ?? '';
    // 16 bytes of salt, base64 without padding.
    expect(saltOf(first)).toMatch(/^[A-Za-z0-9+/]{22}$/);
    expect(saltOf(first)).not.toBe(saltOf(second));
    expect(first).not.toBe(second);
    const checker = createPasswordChecker();
    expect(await checker.check(first, 'same password')).toBe(true);
    expect(await checker.check(second, 'same password')).toBe(true);
  });
});

// Mutation pass: the checker reads a password in its one spelling (NFC) itself, as hashPassword
// stores it, whatever its caller did: a password typed on a keyboard that decomposes accents verifies.
describe('createPasswordChecker: one spelling of a password', () => {
  it('verifies the decomposed spelling of a password hashed composed, and the composed of one hashed decomposed', async () => {
    const checker = createPasswordChecker();
    const composed = 'caf\u00e9 cr\u00e8me';
    const decomposed = 'cafe\u0301 cre\u0300me';
    expect(await checker.check(await hashPassword(composed), decomposed)).toBe(true);
    expect(await checker.check(await hashPassword(decomposed), composed)).toBe(true);
    expect(await checker.check(await hashPassword(composed), 'cafe creme')).toBe(false);
  });
});

describe('the login page (row 40)', () => {
  let db: Database;
  let running: RunningReferenceApp;

  beforeAll(async () => {
    db = await openTestDatabase('passwords');
    running = await startReferenceApp({ db, authPort: 0, appPort: 0, baseUrl: 'http://localhost:8080' });
  }, 60_000);

  afterAll(async () => {
    await running?.close();
    await db?.close();
  });

  const verifiesFor = async (username: string) => {
    const { agent, action, csrf } = await openLoginForm(running.authUrl, running.clients.app);
    verify.mockClear();
    const step = await agent.postForm(action, {
      csrf,
      username,
      password: 'not-the-password',
    });
    expect(step.response.status).toBe(200);
    return verify.mock.calls.map(([hash]) => hash);
  };

  it.each([
    ['an unknown user', 'mallory'],
    ['a username no account can have', 'ali\u0007ce'],
    ['an empty username', ''],
  ])('verifies a password for %s exactly as for a known user with a wrong password', async (_name, username) => {
    const known = await verifiesFor(demoUsers[0].username);
    expect(known).toHaveLength(1);
    const unknown = await verifiesFor(username);
    expect(unknown).toHaveLength(1);
    expect(unknown[0]).toMatch(owaspHash);
    expect(unknown[0]).not.toBe(known[0]);
  });
});

// Accounts an earlier version stored hash the password as it was typed, decomposed on some keyboards:
// a password with a decomposable character is verified in NFC and then in NFD. An unknown user then
// costs the same two verifies as a wrong password of a known one: the count says nothing of who exists.
describe('createPasswordChecker and the decomposed spelling', () => {
  const composed = 'Grüße aus Köln';

  it('matches a hash of the decomposed spelling, and says so (the caller rehashes it)', async () => {
    const checker = createPasswordChecker();
    expect(await checker.match(await hashPassword(composed), composed)).toBe('nfc');
    // As an earlier version hashed it: the password as typed, decomposed.
    const decomposedHash = await argon2.hash(composed.normalize('NFD'));
    expect(await checker.match(decomposedHash, composed)).toBe('nfd');
    expect(await checker.check(decomposedHash, composed)).toBe(true);
  });

  it('costs an unknown user as many verifies as a known user’s wrong password', async () => {
    const checker = createPasswordChecker();
    const stored = await hashPassword('something else');
    verify.mockClear();
    expect(await checker.match(stored, composed)).toBe(false);
    const known = verify.mock.calls.length;
    verify.mockClear();
    expect(await checker.match(undefined, composed)).toBe(false);
    expect(verify.mock.calls.length).toBe(known);
    expect(known).toBe(2);
    verify.mockClear();
    // Nothing to decompose: one spelling, one verify, either way.
    expect(await checker.match(undefined, 'plain ascii')).toBe(false);
    expect(verify).toHaveBeenCalledTimes(1);
  });
});

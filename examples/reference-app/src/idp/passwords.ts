import { hash, type Options, verify } from '@node-rs/argon2';
import { credentialText } from '../text.js';

/**
 * OWASP's argon2id minimum (Password Storage Cheat Sheet): m=19456 KiB, t=2, p=1. Spelled out rather
 * than left to the library's defaults so a dependency update cannot weaken them silently.
 */
export const passwordHashOptions: Options = {
  // 2 is Argon2id; the package exports it as a `const enum`, which isolated modules cannot read.
  algorithm: 2 as Options['algorithm'],
  memoryCost: 19456,
  timeCost: 2,
  parallelism: 1,
  outputLen: 32,
};

/**
 * Hashes a password as an argon2id PHC string (`$argon2id$v=19$m=19456,t=2,p=1$...`).
 *
 * @example
 * ```ts
 * const stored = await hashPassword('correct horse battery staple');
 * ```
 */
export function hashPassword(password: string): Promise<string> {
  // Hashed in its one spelling (NFC), as it is verified: see credentialText.
  return hash(credentialText(password), passwordHashOptions);
}

/**
 * Checks a password against a stored hash, or against a throwaway hash when there is no stored one,
 * so "no such user" costs the same time as "wrong password" and timing tells nobody who exists.
 *
 * @example
 * ```ts
 * const checker = createPasswordChecker();
 * const ok = await checker.check(user?.passwordHash, submittedPassword);
 * ```
 */
export interface PasswordChecker {
  check(storedHash: string | undefined, password: string): Promise<boolean>;
  /**
   * As `check`, saying which spelling matched: `'nfc'`, the one hashes are made of now, or `'nfd'`,
   * the decomposed one a version before NFC hashed as it was typed (the caller rehashes it in NFC).
   */
  match(storedHash: string | undefined, password: string): Promise<'nfc' | 'nfd' | false>;
}

/**
 * The spellings a password is verified in: NFC, and its decomposed spelling (NFD) when that differs.
 * Versions before the credentials were normalised hashed the password as typed, and a keyboard or a
 * paste from a macOS file name types it decomposed: that hash matches only the NFD spelling.
 */
function spellingsOf(password: string): string[] {
  const composed = credentialText(password);
  const decomposed = password.normalize('NFD');
  return decomposed === composed ? [composed] : [composed, decomposed];
}

/**
 * Builds a {@link PasswordChecker}. The dummy hash is made once, when it is built, with the same
 * parameters as real ones, so the work done for an unknown user matches the work done for a known one.
 *
 * @example
 * ```ts
 * const checker = createPasswordChecker();
 * await checker.check(undefined, 'anything'); // false, after a full argon2id verify
 * ```
 */
export function createPasswordChecker(): PasswordChecker {
  // Made now: made on the first unknown user, that one login would take a hash longer than any other,
  // and tell once per process that the name does not exist.
  const dummy = hashPassword(`dummy-${crypto.randomUUID()}`);
  // Awaited by every check of an unknown user; until then a failure must not be an unhandled rejection.
  dummy.catch(() => undefined);
  const verifies = (storedHash: string, password: string) =>
    // A malformed stored hash is a failed login, not a crash of the login page.
    verify(storedHash, password).catch(() => false);
  const match: PasswordChecker['match'] = async (storedHash, password) => {
    const spellings = spellingsOf(password);
    // As many verifies for an unknown user as a wrong password of a known one costs (one per
    // spelling): the count depends on what was typed, never on who exists.
    if (storedHash === undefined) {
      const hash = await dummy;
      for (const spelling of spellings) await verifies(hash, spelling);
      return false;
    }
    if (await verifies(storedHash, spellings[0] as string)) return 'nfc';
    if (spellings.length > 1 && (await verifies(storedHash, spellings[1] as string))) return 'nfd';
    return false;
  };
  return {
    match,
    async check(storedHash, password) {
      return (await match(storedHash, password)) !== false;
    },
  };
}

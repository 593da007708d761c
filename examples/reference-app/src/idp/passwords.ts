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
  return {
    async check(storedHash, password) {
      if (storedHash === undefined) {
        await verify(await dummy, password).catch(() => false);
        return false;
      }
      try {
        return await verify(storedHash, credentialText(password));
      } catch {
        // A malformed stored hash is a failed login, not a crash of the login page.
        return false;
      }
    },
  };
}

import { randomUUID } from 'node:crypto';

/**
 * Makes a fresh idempotency key for a server-minted key (spec part 3, rule 3): a random UUIDv4,
 * 122 bits from the operating system's CSPRNG, so it cannot be guessed or collide in practice.
 *
 * @example
 * const key = mintKey(); // '3b241101-e2bb-4255-8caf-4136c566a962'
 */
export function mintKey(): string {
  return randomUUID();
}

import { randomUUID } from 'node:crypto';
import type { SessionData, SessionStore } from '../src/app/sessions.js';

/**
 * Writes `changes` into a session the way the app itself does: a refresh claimed, then its result
 * stored under the claim (`claimRefresh`, `finishRefresh`), the store's one path that changes tokens.
 * Nothing is written to a session that is not signed in, or not live, as for the app.
 *
 * @example
 * ```ts
 * await writeSession(sessions, id, { tokens: { ...tokens, accessToken: broken } });
 * ```
 */
export async function writeSession(
  store: SessionStore,
  id: string,
  changes: { [K in keyof SessionData]?: SessionData[K] | undefined },
): Promise<void> {
  const claim = randomUUID();
  await store.claimRefresh(id, claim);
  await store.finishRefresh(id, claim, changes);
}

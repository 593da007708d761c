import type { GuardErrorCode } from './errors.js';
import type { KeyDropReason, KeySetRejection } from './key-import.js';

/**
 * What the guard reports through `onEvent`, for metrics and logs. Events carry no token, claim value,
 * header or URL query: only codes, issuers, key ids that matched configuration and JWKS URLs without query.
 * - `authenticated`: a token was accepted (`cached` when the verified-token cache answered); `issuer`
 *   is the configured issuer whose keys verified it (behind the gateway, the gateway).
 * - `rejected`: a request was refused; `code` is the {@link GuardErrorCode}. `issuer` is the
 *   configured issuer the token named, or for an `authorize()` refusal the principal's `iss`
 *   (behind the gateway, the edge issuer from `orig_iss`: the 403 is about what that issuer granted).
 * - `jwks-fetch`: a JWKS request finished (`ok` false with a `reason` on failure). The `uri` of every
 *   `jwks-*` event is the JWKS URL without its query or fragment: a signed URL's query is a credential.
 * - `jwks-rejected`: a fetched key set was refused as a whole; the previous set stays.
 * - `jwks-key-dropped`: one key of a set was unusable and left out.
 * - `jwks-stale`: the cache had expired and a refresh failed, so the last good keys were used.
 *
 * @example
 * createGuard({ ...options, onEvent: (event) => { if (event.type === 'rejected') metrics.increment(event.code); } });
 */
export type GuardEvent =
  | { type: 'authenticated'; issuer: string; cached: boolean; at: number }
  | { type: 'rejected'; code: GuardErrorCode; issuer?: string; at: number }
  | {
      type: 'jwks-fetch';
      uri: string;
      ok: boolean;
      status?: number;
      reason?: 'timeout' | 'network' | 'status' | 'too-large' | 'invalid-json' | KeySetRejection;
      keys?: number;
      durationMs: number;
      at: number;
    }
  | { type: 'jwks-rejected'; uri: string; reason: KeySetRejection; at: number }
  | { type: 'jwks-key-dropped'; uri: string; kid: string | undefined; reason: KeyDropReason; at: number }
  | { type: 'jwks-stale'; uri: string; ageMs: number; at: number };

/**
 * The names of all guard events.
 *
 * @example
 * const watched: GuardEventType[] = ['rejected', 'jwks-stale'];
 */
export type GuardEventType = GuardEvent['type'];

/**
 * Per-reason counters kept by every guard, Envoy-style; read them with `guard.stats()`.
 *
 * @example
 * const stats: GuardStats = guard.stats();
 * stats.rejected.token_expired ?? 0;
 */
export interface GuardStats {
  authenticated: number;
  cacheHits: number;
  /** Refusals by error code (`token_expired`, `signature_invalid`, `key_unknown`, `audience_invalid`, ...). */
  rejected: Partial<Record<GuardErrorCode, number>>;
  jwksFetches: number;
  jwksFetchFailures: number;
  jwksStaleUses: number;
  jwksKeysDropped: number;
}

/**
 * A counter set plus the user's `onEvent` hook, as one `emit` function. A hook that throws or rejects is
 * ignored: metrics must never decide whether a request is authenticated.
 *
 * @example
 * const events = createEventSink((event) => console.log(event.type));
 * events.emit({ type: 'authenticated', issuer: 'https://id.example', cached: false, at: Date.now() });
 */
export function createEventSink(onEvent: ((event: GuardEvent) => void) | undefined): {
  emit(event: GuardEvent): void;
  stats(): GuardStats;
} {
  const counters: GuardStats = {
    authenticated: 0,
    cacheHits: 0,
    rejected: {},
    jwksFetches: 0,
    jwksFetchFailures: 0,
    jwksStaleUses: 0,
    jwksKeysDropped: 0,
  };
  return {
    emit(event) {
      switch (event.type) {
        case 'authenticated':
          counters.authenticated++;
          if (event.cached) counters.cacheHits++;
          break;
        case 'rejected':
          counters.rejected[event.code] = (counters.rejected[event.code] ?? 0) + 1;
          break;
        case 'jwks-fetch':
          counters.jwksFetches++;
          if (!event.ok) counters.jwksFetchFailures++;
          break;
        case 'jwks-stale':
          counters.jwksStaleUses++;
          break;
        case 'jwks-key-dropped':
          counters.jwksKeysDropped++;
          break;
        default:
          break;
      }
      if (onEvent !== undefined) {
        try {
          const result: unknown = onEvent(event);
          // An async hook that rejects, left unheard, would end a Node process (unhandled rejection).
          if (typeof (result as { then?: unknown } | null)?.then === 'function')
            Promise.resolve(result).catch(hookFailed);
        } catch {
          hookFailed();
        }
      }
    },
    stats() {
      return { ...counters, rejected: { ...counters.rejected } };
    },
  };
}

// A failing metrics hook must not turn into an authentication decision, nor crash the process.
function hookFailed() {
  // Dropped: see above.
}

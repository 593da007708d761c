import { createHash, randomUUID } from 'node:crypto';
import { calculateJwkThumbprint } from 'jose';
import { describe, expect, it } from 'vitest';
import { createGuard, type DpopOptions, type GuardResult } from '../src/index.js';
import { AUDIENCE, b64url, ISSUER, makeToken, SECRET, START_MS, signSegments, testKeys } from './support/tokens.js';

// DPoP server nonces (RFC 9449 §9), the lines the first tests left unpinned: the exact window
// edges at times that are not window boundaries, the default lifetime, the option bounds, the
// secret actually used, nonces of windows that have not begun, and the order of the checks.
// START_MS is a multiple of 300 s, so every time below is said as START_MS plus an offset.

const keys = testKeys();
const ORIGIN = 'https://api.example';
const secret = 'a shared secret of thirty-two bytes!';

function code(result: GuardResult): string {
  return result.ok ? 'ok' : result.error.code;
}

function nonceOf(result: GuardResult): string {
  if (result.ok) throw new Error('expected a refusal carrying a nonce');
  if (result.error.dpopNonce === undefined) throw new Error(`no nonce with ${result.error.code}`);
  return result.error.dpopNonce;
}

interface ProofChanges {
  claims?: Record<string, unknown>;
  /** Signs with another key than the one in the header. */
  wrongSigner?: boolean;
}

/** A guard with server nonces and a clock the test sets to the millisecond. */
async function nonceGateway(nonce: DpopOptions['nonce'], startMs = START_MS) {
  let nowMs = startMs;
  const guard = createGuard({
    audience: AUDIENCE,
    now: () => nowMs,
    dpop: { origin: ORIGIN, nonce },
    issuers: [{ issuer: ISSUER, secret: SECRET }],
  });
  // Good for a day, issued before any time the tests set: only the nonce decides.
  const tokenClaims = {
    cnf: { jkt: await calculateJwkThumbprint(keys.ec.publicJwk as never, 'sha256') },
    exp: START_MS / 1000 + 86_400,
  };
  const accessToken = makeToken({ now: START_MS - 1000, claims: tokenClaims });
  const send = (nonceValue?: unknown, changes: ProofChanges = {}, audience?: string) => {
    const token =
      audience === undefined
        ? accessToken
        : makeToken({ now: START_MS - 1000, claims: { ...tokenClaims, aud: audience } });
    const claims = {
      jti: randomUUID(),
      htm: 'POST',
      htu: `${ORIGIN}/orders`,
      iat: Math.floor(nowMs / 1000),
      ath: createHash('sha256').update(token).digest('base64url'),
      ...(nonceValue === undefined ? {} : { nonce: nonceValue }),
      ...changes.claims,
    };
    const proof = signSegments(
      b64url({ typ: 'dpop+jwt', alg: 'ES256', jwk: keys.ec.publicJwk }),
      b64url(claims),
      'ES256',
      changes.wrongSigner === true ? testKeys().ec384.privateKey : keys.ec.privateKey,
    );
    return guard.authenticate({
      method: 'POST',
      url: '/orders',
      headers: { authorization: `DPoP ${token}`, dpop: proof },
    });
  };
  return {
    guard,
    send,
    at(offsetMs: number) {
      nowMs = START_MS + offsetMs;
    },
    /** The nonce this gateway hands out now. */
    nonce: async () => nonceOf(await send()),
  };
}

describe('DPoP server nonces: windows, options and secrets', () => {
  it('a nonce passes to the last millisecond of the window after its own and not one after, wherever in its window it was made (default lifetime 300 s)', async () => {
    // No lifetime given: the default, 300 s, is what these edges are computed from.
    const gateway = await nonceGateway({ secret });
    // Made in the first and in the last millisecond of the window [0, 300 s).
    for (const madeAt of [0, 299_999]) {
      gateway.at(madeAt);
      const nonce = await gateway.nonce();
      gateway.at(599_999);
      const late = await gateway.send(nonce);
      expect(code(late), `made at +${madeAt} ms, used at +599999 ms`).toBe('ok');
      // Of the last window: the answer brings the next.
      expect(late.ok && late.dpopNonce).toMatch(/\./);
      gateway.at(600_000);
      expect(code(await gateway.send(nonce)), `made at +${madeAt} ms, used at +600000 ms`).toBe('dpop_nonce_required');
    }
  });

  it("a nonce's window is judged by the server's clock, not by the proof's iat (a back-dated proof does not revive a stale nonce)", async () => {
    const gateway = await nonceGateway({ secret, lifetime: 60 });
    const nonce = await gateway.nonce();
    gateway.at(120_000);
    // Two windows on: stale. An iat 30 s back (well inside maxAge) names the window before.
    const backDated = await gateway.send(nonce, { claims: { iat: START_MS / 1000 + 90 } });
    expect(code(backDated)).toBe('dpop_nonce_required');
  });

  it('a nonce of the last window with a token that is refused: the refusal is the token’s, and no nonce rides on it', async () => {
    const gateway = await nonceGateway({ secret, lifetime: 60 });
    const nonce = await gateway.nonce();
    gateway.at(60_000);
    const refused = await gateway.send(nonce, { claims: {} }, 'https://other.example');
    expect(code(refused)).toBe('audience_invalid');
    expect('dpopNonce' in refused).toBe(false);
    expect(refused.ok ? 'ok' : refused.error.dpopNonce).toBeUndefined();
  });

  it('a nonce made at any time of its window is current until the window ends: no new one with the answer', async () => {
    const gateway = await nonceGateway({ secret, lifetime: 60 });
    gateway.at(30_000);
    const nonce = await gateway.nonce();
    for (const usedAt of [30_000, 59_999]) {
      gateway.at(usedAt);
      const answer = await gateway.send(nonce);
      expect(code(answer), `+${usedAt} ms`).toBe('ok');
      expect(answer.ok && answer.dpopNonce, `+${usedAt} ms`).toBeUndefined();
    }
  });

  it('lifetime takes 10 to 86,400 seconds, bounds included; just outside is a TypeError', async () => {
    for (const lifetime of [10, 86_400]) {
      const gateway = await nonceGateway({ secret, lifetime });
      const nonce = await gateway.nonce();
      expect(code(await gateway.send(nonce)), String(lifetime)).toBe('ok');
    }
    for (const lifetime of [9.999, 86_400.001]) {
      await expect(nonceGateway({ secret, lifetime }), String(lifetime)).rejects.toThrow(/dpop\.nonce\.lifetime/);
    }
  });

  it('a secret of 31 bytes is a TypeError, as text or as bytes; 32 bytes are enough', async () => {
    await expect(nonceGateway({ secret: 'x'.repeat(31) })).rejects.toThrow(/at least 32 bytes/);
    await expect(nonceGateway({ secret: new Uint8Array(31).fill(7) })).rejects.toThrow(/at least 32 bytes/);
    // Bytes, not characters: 16 two-byte characters are 32 bytes.
    await expect(nonceGateway({ secret: 'é'.repeat(16) })).resolves.toBeDefined();
    await expect(nonceGateway({ secret: 'x'.repeat(32) })).resolves.toBeDefined();
  });

  it('`true` draws a random secret per guard: two such guards refuse each other’s nonces, and so does one with an all-zero secret', async () => {
    const first = await nonceGateway(true);
    const second = await nonceGateway(true);
    const zero = await nonceGateway({ secret: new Uint8Array(32) });
    const nonce = await first.nonce();
    expect(code(await first.send(nonce))).toBe('ok');
    expect(code(await second.send(nonce))).toBe('dpop_nonce_required');
    expect(code(await zero.send(nonce))).toBe('dpop_nonce_required');
    expect(code(await first.send(await zero.nonce()))).toBe('dpop_nonce_required');
  });

  it('a secret given as bytes is the key: other bytes refuse the nonce, the same bytes (another array) take it', async () => {
    const bytes = new Uint8Array(32).map((_, index) => index + 1);
    const owner = await nonceGateway({ secret: bytes });
    const twin = await nonceGateway({ secret: Uint8Array.from(bytes) });
    const stranger = await nonceGateway({ secret: new Uint8Array(32).map((_, index) => 100 + index) });
    const nonce = await owner.nonce();
    expect(code(await twin.send(nonce))).toBe('ok');
    expect(code(await stranger.send(nonce))).toBe('dpop_nonce_required');
  });

  it('a nonce of a window that has not begun is refused: a gateway whose clock runs ahead mints nothing for later', async () => {
    // Two gateways share the secret; one clock is a window (or five) ahead of the other.
    const here = await nonceGateway({ secret, lifetime: 60 });
    for (const aheadMs of [60_000, 300_000]) {
      const ahead = await nonceGateway({ secret, lifetime: 60 }, START_MS + aheadMs);
      const nonce = await ahead.nonce();
      expect(code(await ahead.send(nonce))).toBe('ok');
      expect(code(await here.send(nonce)), `${aheadMs} ms ahead`).toBe('dpop_nonce_required');
      // Once that window comes, the same nonce is good here too.
      here.at(aheadMs);
      expect(code(await here.send(nonce)), `at +${aheadMs} ms`).toBe('ok');
      here.at(0);
    }
  });

  it('a nonce whose MAC has another length is refused as a value, never thrown (timingSafeEqual takes equal lengths only)', async () => {
    const gateway = await nonceGateway({ secret });
    const nonce = await gateway.nonce();
    const [window, mac] = nonce.split('.') as [string, string];
    for (const bad of [`${window}.abc`, `${window}.${mac.slice(0, 40)}`, `${window}.${mac}AAAA`, `${window}.`]) {
      const answer = await gateway.send(bad);
      expect(code(answer), bad).toBe('dpop_nonce_required');
    }
  });

  it('a proof that fails on its own is refused for that, with no nonce, whichever check it fails (the nonce is checked last)', async () => {
    const gateway = await nonceGateway({ secret });
    const failures: Array<[string, ProofChanges]> = [
      ['signature', { wrongSigner: true }],
      ['jti', { claims: { jti: '' } }],
      ['htu', { claims: { htu: `${ORIGIN}/other` } }],
      ['iat in the future', { claims: { iat: START_MS / 1000 + 3600 } }],
      ['iat too old', { claims: { iat: START_MS / 1000 - 3600 } }],
      ['iat not a number', { claims: { iat: 'now' } }],
      ['ath', { claims: { ath: createHash('sha256').update('another token').digest('base64url') } }],
    ];
    for (const [label, changes] of failures) {
      const answer = await gateway.send(undefined, changes);
      expect(code(answer), label).toBe('dpop_proof_invalid');
      expect(answer.ok ? 'ok' : answer.error.dpopNonce, label).toBeUndefined();
    }
  });

  // Kept by reference, the bytes would be read on every nonce: a caller that wipes its key buffer
  // after configuration (usual hygiene) would silently turn the key into 32 zero bytes, so nonces
  // handed out before stop passing, and anyone can compute the ones that do.
  it('the secret given as bytes is copied at construction: wiping the caller’s buffer afterwards changes nothing', async () => {
    const bytes = new Uint8Array(32).fill(9);
    const gateway = await nonceGateway({ secret: bytes });
    const nonce = await gateway.nonce();
    bytes.fill(0);
    expect(code(await gateway.send(nonce))).toBe('ok');
  });
});

import { calculateJwkThumbprint } from 'jose';
import { describe, expect, it } from 'vitest';
import { createGuard, type DpopOptions, type GuardResult, memoryReplayCache } from '../src/index.js';
import {
  AUDIENCE,
  b64url,
  ISSUER,
  makeToken,
  manualClock,
  proofClaims,
  SECRET,
  signSegments,
  testKeys,
} from './support/tokens.js';

// The in-process DPoP replay memory is one bound shared by every client. Was wrong: one holder of a
// valid DPoP-bound token could fill all of it with fresh proofs inside one `maxAge` window, and every
// other client's proofs were then refused (`dpop_replay_full`) until those entries expired. Each proof
// key (the token's `cnf.jkt`) now has a share of the memory; past it, only that key is refused.
// Time is injected: no test sleeps.

const keys = testKeys();
const ORIGIN = 'https://api.example';

function setup(dpop: DpopOptions = {}) {
  const clock = manualClock();
  const guard = createGuard({
    audience: AUDIENCE,
    now: clock.now,
    cache: false,
    dpop: { origin: ORIGIN, ...dpop },
    issuers: [{ issuer: ISSUER, secret: SECRET }],
  });
  return { clock, guard };
}

type Pair = typeof keys.ec;

/** A POST /orders by the holder of `pair`: a token bound to its key and a fresh proof made now. */
async function holder(pair: Pair, alg: string, clock: ReturnType<typeof manualClock>) {
  const thumbprint = await calculateJwkThumbprint(pair.publicJwk as never, 'sha256');
  const accessToken = makeToken({ claims: { cnf: { jkt: thumbprint }, exp: clock.seconds() + 3600 } });
  return () => {
    const header = { typ: 'dpop+jwt', alg, jwk: pair.publicJwk };
    const claims = {
      ...proofClaims(accessToken, `${ORIGIN}/orders`, clock.seconds()),
    };
    return {
      method: 'POST',
      url: '/orders',
      headers: {
        authorization: `DPoP ${accessToken}`,
        dpop: signSegments(b64url(header), b64url(claims), alg, pair.privateKey),
      },
    };
  };
}

const code = (result: GuardResult) => (result.ok ? 'ok' : result.error.code);

describe('DPoP replay memory: a share per proof key', () => {
  it('one token holder flooding fresh proofs cannot lock every other client out', async () => {
    const { clock, guard } = setup({ maxReplayEntries: 20 });
    const flooder = await holder(keys.ec, 'ES256', clock);
    const other = await holder(keys.ed, 'EdDSA', clock);
    const flood: string[] = [];
    for (let i = 0; i < 20; i++) flood.push(code(await guard.authenticate(flooder())));
    // Another client's valid proof still gets in, inside the same window...
    expect(code(await guard.authenticate(other()))).toBe('ok');
    // ...and the flooder was refused once it held its share of a memory half full, with a code of its own.
    expect(flood.filter((answer) => answer === 'ok')).toHaveLength(10);
    expect(flood).toContain('dpop_replay_share_full');
    expect(flood).not.toContain('dpop_replay_full');
  });

  it('the share boundary: below half of the memory no key is held back; from half on, a key holding maxReplayEntriesPerKey live proofs is refused alone', async () => {
    const { clock, guard } = setup({ maxReplayEntries: 10, maxReplayEntriesPerKey: 3 });
    const flooder = await holder(keys.ec, 'ES256', clock);
    const other = await holder(keys.ed, 'EdDSA', clock);
    const first = flooder();
    expect(code(await guard.authenticate(first))).toBe('ok');
    // Past its share of 3, but the memory is below half (5 of 10): a busy key is not held back.
    for (let i = 0; i < 4; i++) expect(code(await guard.authenticate(flooder()))).toBe('ok');
    const refused = await guard.authenticate(flooder());
    expect(code(refused)).toBe('dpop_replay_share_full');
    if (!refused.ok) {
      expect(refused.error.status).toBe(401);
      expect(refused.error.retryable).toBe(true);
      expect(refused.error.wwwAuthenticate).toBe(
        'DPoP realm="api", error="invalid_dpop_proof", error_description="The DPoP proof cannot be accepted now: this key has too many recent proofs", algs="ES256 EdDSA Ed25519 PS256 RS256"',
      );
    }
    // Fail closed: the key's remembered proofs were kept, a replay of the first is still caught.
    expect(code(await guard.authenticate(first))).toBe('dpop_proof_replayed');
    // Another key gets its share of what is left, then is held to it too.
    for (let i = 0; i < 3; i++) expect(code(await guard.authenticate(other()))).toBe('ok');
    expect(code(await guard.authenticate(other()))).toBe('dpop_replay_share_full');
    expect(guard.stats().rejected.dpop_replay_share_full).toBe(2);
  });

  it('the share frees up as proofs expire (injected clock)', async () => {
    const { clock, guard } = setup({ maxReplayEntries: 10, maxReplayEntriesPerKey: 2 });
    const flooder = await holder(keys.ec, 'ES256', clock);
    for (let i = 0; i < 4; i++) expect(code(await guard.authenticate(flooder()))).toBe('ok');
    clock.advance(30);
    expect(code(await guard.authenticate(flooder()))).toBe('ok');
    expect(code(await guard.authenticate(flooder()))).toBe('dpop_replay_share_full');
    // The first four are remembered for 60 s + twice the 5 s tolerance (+1 ms): still live at 70 s.
    clock.advance(40);
    expect(code(await guard.authenticate(flooder()))).toBe('dpop_replay_share_full');
    // At 71 s they are gone: one live proof of 10, below half, and the key gets in again.
    clock.advance(1);
    expect(code(await guard.authenticate(flooder()))).toBe('ok');
  });

  it('the default share is a hundredth of maxReplayEntries (at least 1)', async () => {
    const { clock, guard } = setup({ maxReplayEntries: 300 });
    const flooder = await holder(keys.ec, 'ES256', clock);
    const other = await holder(keys.ed, 'EdDSA', clock);
    // One key fills half of the memory (150), then is held to its share of 3.
    const codes: string[] = [];
    for (let i = 0; i < 151; i++) codes.push(code(await guard.authenticate(flooder())));
    expect(codes.filter((answer) => answer === 'ok')).toHaveLength(150);
    expect(codes.at(-1)).toBe('dpop_replay_share_full');
    const others: string[] = [];
    for (let i = 0; i < 4; i++) others.push(code(await guard.authenticate(other())));
    expect(others).toEqual(['ok', 'ok', 'ok', 'dpop_replay_share_full']);
    const tiny = setup({ maxReplayEntries: 2 });
    const alone = await holder(keys.ec, 'ES256', tiny.clock);
    expect(code(await tiny.guard.authenticate(alone()))).toBe('ok');
    expect(code(await tiny.guard.authenticate(alone()))).toBe('dpop_replay_share_full');
  });

  it('refuses bad maxReplayEntriesPerKey at construction, with messages that say why', () => {
    for (const maxReplayEntriesPerKey of [0, -1, 1.5, Number.NaN, Number.POSITIVE_INFINITY, '5' as never]) {
      expect(() => setup({ maxReplayEntriesPerKey }), String(maxReplayEntriesPerKey)).toThrow(
        /^dpop\.maxReplayEntriesPerKey must be a positive integer$/,
      );
    }
    expect(() => setup({ maxReplayEntries: 10, maxReplayEntriesPerKey: 11 })).toThrow(
      /^dpop\.maxReplayEntriesPerKey \(11\) must be at most dpop\.maxReplayEntries \(10\)$/,
    );
    // The default bound is 100,000.
    expect(() => setup({ maxReplayEntriesPerKey: 100_001 })).toThrow(/at most dpop\.maxReplayEntries \(100000\)/);
    expect(() => setup({ maxReplayEntriesPerKey: 100_000 })).not.toThrow();
    expect(() => setup({ maxReplayEntries: 10, maxReplayEntriesPerKey: 10 })).not.toThrow();
    // Like maxReplayEntries, it bounds only the in-process memory: with a store of one's own, an error.
    expect(() => setup({ replay: () => true, maxReplayEntriesPerKey: 5 })).toThrow(
      /^dpop\.maxReplayEntriesPerKey bounds the in-process replay memory and cannot be combined with dpop\.replay/,
    );
  });

  it('a replay store may answer share-full too, refused with dpop_replay_share_full', async () => {
    const { clock, guard } = setup({ replay: () => 'share-full' });
    const client = await holder(keys.ec, 'ES256', clock);
    expect(code(await guard.authenticate(client()))).toBe('dpop_replay_share_full');
  });
});

describe('memoryReplayCache with a share per key', () => {
  it('keys are owned by what precedes their first ":" (the guard’s keys are jkt:jti)', () => {
    let now = 0;
    const seen = memoryReplayCache(10, () => now, 2);
    // Below half of the memory (5), no owner is held to its share.
    expect([seen('Z:1', 1000), seen('Z:2', 1000), seen('Z:3', 1000)]).toEqual([true, true, true]);
    expect(seen('A:1', 100)).toBe(true);
    expect(seen('A:2', 200)).toBe(true);
    expect(seen('A:3', 300)).toBe('share-full');
    expect(seen('Z:4', 1000)).toBe('share-full');
    // A seen key is a replay, whatever its owner's share: `false`, never `'share-full'`.
    expect(seen('A:1', 100)).toBe(false);
    // A jti may hold a ":"; the owner is still A.
    expect(seen('A:x:y', 300)).toBe('share-full');
    expect(seen('B:1', 100)).toBe(true);
    // A:1 and B:1 expire: 4 live, below half.
    now = 100;
    expect(seen('A:3', 300)).toBe(true);
    expect(seen('A:4', 300)).toBe('share-full');
    expect(seen('A:2', 300)).toBe(false);
  });

  it('many keys at once: every key gets its share until the whole memory is full, and no key is forgotten early', () => {
    let now = 0;
    const capacity = 100;
    const share = 5;
    const seen = memoryReplayCache(capacity, () => now, share);
    const taken = new Map<string, number>();
    const answers: Record<string, number> = { true: 0, 'share-full': 0, full: 0 };
    const send = (owner: number, proof: string) => {
      const answer = seen(`o${owner}:${proof}`, 1000 + owner);
      answers[String(answer)] = (answers[String(answer)] ?? 0) + 1;
      if (answer === true) taken.set(`o${owner}:${proof}`, 1000 + owner);
    };
    // 16 owners, interleaved, 10 proofs each: each gets its 5, 80 slots in all, and 5 refusals.
    for (let round = 0; round < 10; round++) for (let owner = 0; owner < 16; owner++) send(owner, `${round}`);
    expect(answers).toEqual({ true: 80, 'share-full': 80, full: 0 });
    // 8 more, one after the other: 4 fill the last 20 slots, then the memory is full for the others
    // (the fourth's last 5 included: where both hold, full is the answer).
    for (let owner = 16; owner < 24; owner++) for (let proof = 0; proof < 10; proof++) send(owner, `${proof}`);
    expect(answers).toEqual({ true: 100, 'share-full': 95, full: 45 });
    expect(taken.size).toBe(capacity);
    for (let owner = 0; owner < 20; owner++) {
      const held = [...taken.keys()].filter((key) => key.startsWith(`o${owner}:`)).length;
      expect(held, `o${owner}`).toBe(share);
    }
    // Every taken key is still a replay until its own expiry.
    for (now = 999; now <= 1024; now++) {
      for (const [key, expiresAt] of taken) {
        if (expiresAt > now) expect(seen(key, 5000), `${key} at ${now}`).toBe(false);
      }
    }
    // All expired: below half again, so one owner may fill half of the memory, then is held to its
    // share while the others get theirs.
    now = 5000;
    for (let i = 0; i < capacity / 2; i++) expect(seen(`o0:again${i}`, 6000)).toBe(true);
    expect(seen('o0:again-past', 6000)).toBe('share-full');
    for (let i = 0; i < share; i++) expect(seen(`o1:again${i}`, 6000)).toBe(true);
    expect(seen('o1:again-past', 6000)).toBe('share-full');
  });

  it('with a share equal to the memory there is no share: one key fills it and is told full', () => {
    const seen = memoryReplayCache(3, () => 0, 3);
    expect([seen('A:1', 9), seen('A:2', 9), seen('A:3', 9), seen('A:4', 9), seen('B:1', 9)]).toEqual([
      true,
      true,
      true,
      'full',
      'full',
    ]);
  });

  it('refuses a share that is not a positive integer or larger than the memory', () => {
    expect(() => memoryReplayCache(10, Date.now, 0)).toThrow(/maxReplayEntriesPerKey must be a positive integer/);
    expect(() => memoryReplayCache(10, Date.now, 11)).toThrow(/must be at most/);
    // Without a share, a hundredth of the memory, at least 1.
    const seen = memoryReplayCache(2, () => 0);
    expect(seen('A:1', 10)).toBe(true);
    expect(seen('A:2', 10)).toBe('share-full');
  });
});

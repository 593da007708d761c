// Several logical clients acting on a few ids of one store at once (claims, takeovers of abandoned
// records, renewals, completions, releases, late finishers, stale tokens), with an operator ending
// leases now and then as a crash would. Every call is logged with when it started and ended, and the
// log is checked afterwards for what no interleaving may produce: two live leases on one id, a stale
// token that completes or releases, a completed record overwritten or lost. Only orders that real
// time settles are judged (a call that ended before another began came first).
import { performance } from 'node:perf_hooks';
import type { Store, StoreRecord } from '@idem/core';

interface Call {
  client: number;
  kind: 'claim' | 'renew' | 'complete' | 'release' | 'get' | 'endLease';
  id: string;
  /** The token the call named (the claim's new token; for endLease, the holder whose lease it ended). */
  token: string | undefined;
  replaces?: string;
  /** Claimed, or the renew, complete, release or endLease changed the record. */
  ok: boolean;
  /** What a refused claim or a get answered. */
  record?: StoreRecord | undefined;
  start: number;
  end: number;
}

/** What the test gives the run: the store, and a way to end the lease of a record in progress now. */
export interface ConcurrencyTarget {
  store: Store;
  /**
   * Ends the lease of `id` now if it is in progress, as its holder's crash would (kept abandoned
   * for its keep), in one atomic step; resolves to the token whose lease it ended, if any.
   */
  endLease(id: string): Promise<string | undefined>;
}

export interface ConcurrencyFigures {
  calls: number;
  claims: number;
  takeovers: number;
  completions: number;
  releases: number;
  endedLeases: number;
  fencedLate: number;
}

const leaseMs = 60_000;
const keepMs = 60_000;
const retentionMs = 120_000;

/** A small seeded generator (mulberry32): the same seed plays the same choices. */
export function seeded(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296;
  };
}

const bodyOf = (token: string) => new TextEncoder().encode(`outcome of ${token}`);

/** Plays `clients` clients of `rounds` rounds each over `ids`, with an operator ending leases; returns the log. */
export async function runConcurrently(
  target: ConcurrencyTarget,
  ids: readonly string[],
  options: { clients: number; rounds: number; seed: number },
): Promise<Call[]> {
  const calls: Call[] = [];
  const { store } = target;
  let tokens = 0;
  let running = options.clients;
  const logged = async <T>(
    call: Omit<Call, 'ok' | 'start' | 'end'>,
    act: () => Promise<T>,
    ok: (value: T) => boolean,
    read?: (value: T) => StoreRecord | undefined,
  ) => {
    const start = performance.now();
    const value = await act();
    const end = performance.now();
    calls.push({ ...call, ok: ok(value), ...(read ? { record: read(value) } : {}), start, end });
    return value;
  };

  const client = async (n: number) => {
    const random = seeded(options.seed * 1_000 + n);
    const pick = <T>(list: readonly T[]) => list[Math.floor(random() * list.length)] as T;
    // Tokens this client held once: a late finisher or a confused retry may use any of them.
    const mine: { id: string; token: string }[] = [];
    for (let round = 0; round < options.rounds; round++) {
      const id = pick(ids);
      const roll = random();
      if (roll < 0.15 && mine.length > 0) {
        // A late or stale holder acts on a token it held earlier.
        const old = pick(mine);
        const what = pick(['renew', 'complete', 'release'] as const);
        await act(what, n, old.id, old.token);
        continue;
      }
      if (roll < 0.25) {
        await logged(
          { client: n, kind: 'get', id, token: undefined },
          async () => store.get(id),
          () => true,
          (record) => record,
        );
        continue;
      }
      const token = `c${n}-${++tokens}`;
      const claimed = await claim(n, id, token, undefined);
      let held = claimed.claimed ? token : undefined;
      if (!claimed.claimed && claimed.record.state === 'abandoned' && random() < 0.8) {
        // The engine's crash recovery: take the abandoned record over by the token it was answered.
        const again = `c${n}-${++tokens}`;
        const takeover = await claim(n, id, again, claimed.record.token);
        if (takeover.claimed) held = again;
      }
      if (held === undefined) continue;
      mine.push({ id, token: held });
      const renewals = Math.floor(random() * 3);
      for (let r = 0; r < renewals; r++) await act('renew', n, id, held);
      const end = random();
      if (end < 0.3) await act('complete', n, id, held);
      else if (end < 0.75) await act('release', n, id, held);
      // else: the holder walks away (a crash); the operator may end its lease, and it may come back late.
    }
  };

  const claim = (n: number, id: string, token: string, replaces: string | undefined) =>
    logged(
      { client: n, kind: 'claim', id, token, ...(replaces === undefined ? {} : { replaces }) },
      async () =>
        store.claim({
          id,
          token,
          fingerprint: 'fp',
          leaseMs,
          keepAfterLeaseMs: keepMs,
          ...(replaces === undefined ? {} : { replaces }),
        }),
      (result) => result.claimed,
      (result) => (result.claimed ? undefined : result.record),
    );

  const act = (what: 'renew' | 'complete' | 'release', n: number, id: string, token: string) =>
    logged(
      { client: n, kind: what, id, token },
      async () =>
        what === 'renew'
          ? store.renew({ id, token, leaseMs })
          : what === 'complete'
            ? store.complete({
                id,
                token,
                response: { status: 201, headers: { 'x-token': token }, body: bodyOf(token) },
                retentionMs,
              })
            : store.release({ id, token }),
      (value) => value,
    );

  // The operator: ends a random id's lease now and then, as a crash of its holder would.
  const operator = async () => {
    const random = seeded(options.seed * 1_000 + 999);
    while (running > 0) {
      const id = ids[Math.floor(random() * ids.length)] as string;
      const start = performance.now();
      const token = await target.endLease(id);
      calls.push({ client: -1, kind: 'endLease', id, token, ok: token !== undefined, start, end: performance.now() });
      await new Promise((resolve) => setImmediate(resolve));
    }
  };

  await Promise.all([
    operator(),
    ...Array.from({ length: options.clients }, (_, n) =>
      client(n).finally(() => {
        running--;
      }),
    ),
  ]);
  return calls;
}

/**
 * Checks the log for what no interleaving allows, and returns the figures of the run (so a test can
 * also check it reached takeovers and late finishers). Throws with the offending calls.
 */
export function checkLog(calls: readonly Call[]): ConcurrencyFigures {
  const problems: string[] = [];
  const show = (c: Call) =>
    `${c.kind}(${c.token ?? ''}${c.replaces ? ` replaces ${c.replaces}` : ''}) by ${c.client} -> ${c.ok} [${c.start.toFixed(2)}, ${c.end.toFixed(2)}]`;
  const byId = new Map<string, Call[]>();
  for (const c of calls) byId.set(c.id, [...(byId.get(c.id) ?? []), c]);
  let fencedLate = 0;

  for (const [id, log] of byId) {
    const claims = log.filter((c) => c.kind === 'claim' && c.ok);
    const claimed = new Set(claims.map((c) => c.token));
    const successes = (token: string) =>
      log.filter((c) => c.token === token && c.kind !== 'claim' && c.kind !== 'endLease' && c.kind !== 'get' && c.ok);

    // A token no claim was granted never changes anything.
    for (const c of log) {
      if (c.kind !== 'claim' && c.kind !== 'get' && c.kind !== 'endLease' && c.ok && !claimed.has(c.token)) {
        problems.push(`${id}: a token never granted acted: ${show(c)}`);
      }
    }

    // One outcome per id, kept for its retention: once stored, every later read answers it and
    // nothing changes the record.
    // (Redis answers true to the same completion sent twice, same token and same outcome: its
    // documented answer to a reply lost and the command sent again. It changes nothing.)
    const completions = log.filter((c) => c.kind === 'complete' && c.ok);
    const firsts = completions.filter((c, i) => completions.findIndex((d) => d.token === c.token) === i);
    if (firsts.length > 1) problems.push(`${id}: completed twice: ${firsts.map(show).join('; ')}`);
    for (const done of firsts) {
      for (const c of log) {
        if (c.start <= done.end || (c.kind === 'complete' && c.token === done.token)) continue;
        if (c.kind === 'claim' && c.ok) problems.push(`${id}: claimed after ${show(done)}: ${show(c)}`);
        if ((c.kind === 'renew' || c.kind === 'release' || c.kind === 'complete' || c.kind === 'endLease') && c.ok) {
          problems.push(`${id}: changed after ${show(done)}: ${show(c)}`);
        }
        if ((c.kind === 'get' || (c.kind === 'claim' && !c.ok)) && !isOutcomeOf(c.record, done.token as string)) {
          problems.push(`${id}: ${show(c)} read ${JSON.stringify(c.record)} after ${show(done)}`);
        }
      }
    }

    // A completion by A means no other claim was granted between A's and it (then A's token would
    // be dead), nor after it (the record is completed): so every claim granted to another token
    // came before A's, and none named A in `replaces`, whatever the timing.
    for (const done of firsts) {
      const granted = claims.find((c) => c.token === done.token) as Call;
      for (const b of claims) {
        if (b === granted) continue;
        if (b.start > granted.end || b.replaces === done.token) {
          problems.push(`${id}: ${show(b)} granted, yet ${show(done)} after ${show(granted)}`);
        }
      }
    }

    for (const b of claims) {
      for (const a of claims) {
        if (a === b || a.end >= b.start) continue;
        const holder = a.token as string;
        // Fencing: A was granted before B asked; once B is granted, A's token is dead.
        for (const late of successes(holder)) {
          if (late.start > b.end) problems.push(`${id}: ${show(late)} succeeded after ${show(b)} took over`);
        }
        fencedLate += log.filter((c) => c.token === holder && !c.ok && c.start > b.end && c.kind !== 'claim').length;
        // Never two live leases: B may be granted only once A let go (released), or A's lease ended
        // (with no renewal of A bringing it back before B asked) and a takeover named A: an
        // abandoned record is kept for its keep, and only a claim naming its token replaces it.
        const revived = (c: Call) =>
          successes(holder).some((r) => r.kind === 'renew' && r.start > c.end && r.end < b.start);
        const replaced = claims.some((t) => t.replaces === holder && t.start < b.end);
        const freed = log.filter(
          (c) =>
            c.token === holder &&
            c.ok &&
            c.start < b.end &&
            (c.kind === 'release' || (c.kind === 'endLease' && replaced && !revived(c))),
        );
        if (freed.length === 0) {
          problems.push(`${id}: ${show(b)} granted while ${show(a)} still held the lease`);
        }
      }
    }
  }
  if (problems.length > 0) throw new Error(`${problems.length} violation(s):\n${problems.slice(0, 20).join('\n')}`);
  return {
    calls: calls.length,
    claims: calls.filter((c) => c.kind === 'claim' && c.ok).length,
    takeovers: calls.filter((c) => c.kind === 'claim' && c.ok && c.replaces !== undefined).length,
    completions: calls.filter((c) => c.kind === 'complete' && c.ok).length,
    releases: calls.filter((c) => c.kind === 'release' && c.ok).length,
    endedLeases: calls.filter((c) => c.kind === 'endLease' && c.ok).length,
    fencedLate,
  };
}

const isOutcomeOf = (record: StoreRecord | undefined, token: string) =>
  record?.state === 'completed' &&
  record.token === token &&
  record.response.status === 201 &&
  Buffer.from(record.response.body).equals(Buffer.from(bodyOf(token)));

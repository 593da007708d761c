// A reference model of the Store contract (packages/core/src/store.ts, docs/stores.md, DESIGN.md's
// state machine), written from the documents and not from any store, and a runner that plays random
// histories of claim, renew, complete, release, get and time passing against a store and the model
// in lock step. Used by model.audit.test.ts (memoryStore, injected clock) and
// model.audit.int.test.ts (Redis and PostgreSQL, whose clocks are the servers': time passing is
// played by moving every record's expiry back by the same amount, which is what their clock would do).
import type { Store, StoredResponse, StoreRecord } from '@idem/core';
import fc from 'fast-check';
import { expect } from 'vitest';

/** A record as compared: bodies as plain arrays, so a Buffer and a Uint8Array compare equal. */
export type PlainRecord =
  | { state: 'in_progress' | 'abandoned'; token: string; fingerprint: string }
  | {
      state: 'completed';
      token: string;
      fingerprint: string;
      response: { status: number; headers: Record<string, string>; body: number[] };
    };

export const plain = (record: StoreRecord | undefined): PlainRecord | undefined => {
  if (record === undefined) return undefined;
  if (record.state !== 'completed')
    return { state: record.state, token: record.token, fingerprint: record.fingerprint };
  const { status, headers, body } = record.response;
  return {
    state: 'completed',
    token: record.token,
    fingerprint: record.fingerprint,
    response: { status, headers: { ...headers }, body: [...body] },
  };
};

interface ModelEntry {
  state: 'in_progress' | 'completed';
  token: string;
  fingerprint: string;
  /** In progress: when the lease ends. */
  leaseEnd: number;
  /** In progress: how long it stays abandoned after its lease (carried over by renewals). */
  keepMs: number;
  /** When the id is unseen again: lease end plus keep, or completion plus retention. */
  expiresAt: number;
  response?: StoredResponse;
}

const sameResponse = (a: StoredResponse, b: StoredResponse) =>
  a.status === b.status &&
  JSON.stringify(Object.entries(a.headers).sort()) === JSON.stringify(Object.entries(b.headers).sort()) &&
  Buffer.from(a.body).equals(Buffer.from(b.body));

/**
 * The contract as documented, on a clock of its own. Every time is compared as the documents say:
 * a lease of `leaseMs` claimed at t is live while the clock is below t + leaseMs, and a record whose
 * end is now is gone (the memory store's `<=`, Redis's PX, PostgreSQL's `expires_at > now`).
 */
export class StoreModel {
  now = 0;
  readonly entries = new Map<string, ModelEntry>();

  private live(id: string): ModelEntry | undefined {
    const entry = this.entries.get(id);
    if (entry === undefined) return undefined;
    if (entry.expiresAt <= this.now) {
      this.entries.delete(id);
      return undefined;
    }
    return entry;
  }

  /** Records whose end has not come, by id. */
  liveEntries(): [string, ModelEntry][] {
    return [...this.entries].filter(([, entry]) => entry.expiresAt > this.now);
  }

  /** Drops a record a bounded store evicted. */
  evict(id: string) {
    this.entries.delete(id);
  }

  /** Completed, or in progress with its lease run out. */
  settled(entry: ModelEntry) {
    return entry.state === 'completed' || entry.leaseEnd <= this.now;
  }

  private abandoned(entry: ModelEntry) {
    return entry.state === 'in_progress' && entry.leaseEnd <= this.now;
  }

  private view(entry: ModelEntry): PlainRecord {
    const { token, fingerprint } = entry;
    if (entry.state === 'completed') {
      return plain({
        state: 'completed',
        token,
        fingerprint,
        response: entry.response as StoredResponse,
      }) as PlainRecord;
    }
    return { state: this.abandoned(entry) ? 'abandoned' : 'in_progress', token, fingerprint };
  }

  /** The current holder's token of `id`, if a record lives. */
  tokenOf(id: string): string | undefined {
    return this.live(id)?.token;
  }

  get(id: string): PlainRecord | undefined {
    const entry = this.live(id);
    return entry && this.view(entry);
  }

  claim(input: {
    id: string;
    token: string;
    fingerprint: string;
    leaseMs: number;
    keepAfterLeaseMs: number;
    replaces?: string;
  }): { claimed: true } | { claimed: false; record: PlainRecord } {
    const existing = this.live(input.id);
    if (existing) {
      // Taken over only when still abandoned and still held by the token the claim names.
      if (input.replaces === undefined || !this.abandoned(existing) || existing.token !== input.replaces) {
        return { claimed: false, record: this.view(existing) };
      }
    }
    this.entries.set(input.id, {
      state: 'in_progress',
      token: input.token,
      fingerprint: input.fingerprint,
      leaseEnd: this.now + input.leaseMs,
      keepMs: input.keepAfterLeaseMs,
      expiresAt: this.now + input.leaseMs + input.keepAfterLeaseMs,
    });
    return { claimed: true };
  }

  /** Holder of the current token, abandoned included (until someone takes it over). */
  private held(id: string, token: string): ModelEntry | undefined {
    const entry = this.live(id);
    return entry?.state === 'in_progress' && entry.token === token ? entry : undefined;
  }

  renew(input: { id: string; token: string; leaseMs: number }): boolean {
    const entry = this.held(input.id, input.token);
    if (!entry) return false;
    entry.leaseEnd = this.now + input.leaseMs;
    entry.expiresAt = entry.leaseEnd + entry.keepMs;
    return true;
  }

  /**
   * The answers a store may give: false when the token is not the holder's. Redis documents one
   * more: the same completion sent twice (same token, same outcome) answers true the second time.
   */
  complete(input: { id: string; token: string; response: StoredResponse; retentionMs: number }): boolean[] {
    const entry = this.held(input.id, input.token);
    if (!entry) {
      const done = this.live(input.id);
      const twice =
        done?.state === 'completed' &&
        done.token === input.token &&
        sameResponse(done.response as StoredResponse, input.response);
      return twice ? [false, true] : [false];
    }
    entry.state = 'completed';
    entry.response = {
      status: input.response.status,
      headers: { ...input.response.headers },
      body: Uint8Array.from(input.response.body),
    };
    entry.expiresAt = this.now + input.retentionMs;
    return [true];
  }

  release(input: { id: string; token: string }): boolean {
    if (!this.held(input.id, input.token)) return false;
    this.entries.delete(input.id);
    return true;
  }
}

/** The responses a history completes with: empty bodies, JSON, newlines and every byte value. */
export const responses: readonly StoredResponse[] = [
  { status: 200, headers: {}, body: new Uint8Array(0) },
  {
    status: 201,
    headers: { 'content-type': 'application/json', location: '/charges/ch_1' },
    body: new TextEncoder().encode('{"id":"ch_1"}'),
  },
  { status: 204, headers: {}, body: new Uint8Array(0) },
  { status: 500, headers: { 'x-a': 'b' }, body: new Uint8Array([0, 10, 13, 255, 10, 10]) },
  {
    status: 402,
    headers: { 'content-type': 'application/octet-stream' },
    body: new Uint8Array(256).map((_, i) => i),
  },
];

const fingerprints = ['', 'fp1', 'fp2', 'f\n"é'];

/** Which token an operation names: the holder's, one an earlier claim of the id was given, or one never given. */
export type Who = { kind: 'current' } | { kind: 'earlier'; n: number } | { kind: 'never' };
/** What a claim names in `replaces`: nothing, the token last answered for the id, any earlier one, or one never given. */
export type Replaces = { kind: 'none' } | { kind: 'seen' } | { kind: 'earlier'; n: number } | { kind: 'never' };

export type Command =
  | { op: 'claim'; id: number; fingerprint: number; leaseMs: number; keepMs: number; replaces: Replaces }
  | { op: 'renew'; id: number; who: Who; leaseMs: number }
  | { op: 'complete'; id: number; who: Who; response: number; retentionMs: number }
  | { op: 'release'; id: number; who: Who }
  | { op: 'get'; id: number }
  | { op: 'advance'; ms: number };

/** The durations a history draws from. */
export interface Durations {
  leases: number[];
  keeps: number[];
  retentions: number[];
  advances: number[];
}

/** Durations of a few milliseconds: for a store on a clock the test drives, every boundary and ±1 ms around it. */
export const fineDurations: Durations = {
  leases: [1, 5, 10, 37],
  keeps: [0, 1, 10, 50],
  retentions: [1, 10, 60],
  advances: [1, 2, 4, 5, 9, 10, 11, 36, 37, 38, 49, 50, 51, 100],
};

/**
 * Durations in whole units of `unitMs`, for a store on a server's clock: real time passes between
 * the steps too (always forward, a few ms), so a step never lands within a unit short of a
 * boundary, and a step landing exactly on one is on its far side for both the model and the store.
 */
export const coarseDurations = (unitMs: number): Durations => ({
  leases: [2, 4].map((u) => u * unitMs),
  keeps: [0, 3, 6].map((u) => u * unitMs),
  retentions: [5, 9].map((u) => u * unitMs),
  advances: [1, 2, 3, 4, 5, 6, 8].map((u) => u * unitMs),
});

const who: fc.Arbitrary<Who> = fc.oneof(
  { weight: 5, arbitrary: fc.constant({ kind: 'current' as const }) },
  { weight: 3, arbitrary: fc.nat(6).map((n) => ({ kind: 'earlier' as const, n })) },
  { weight: 1, arbitrary: fc.constant({ kind: 'never' as const }) },
);

const replaces: fc.Arbitrary<Replaces> = fc.oneof(
  { weight: 4, arbitrary: fc.constant({ kind: 'none' as const }) },
  { weight: 4, arbitrary: fc.constant({ kind: 'seen' as const }) },
  { weight: 2, arbitrary: fc.nat(6).map((n) => ({ kind: 'earlier' as const, n })) },
  { weight: 1, arbitrary: fc.constant({ kind: 'never' as const }) },
);

/** Random commands over `idCount` ids with the given durations. */
export function commandArbitrary(d: Durations, idCount = 3): fc.Arbitrary<Command> {
  const id = fc.nat(idCount - 1);
  return fc.oneof(
    {
      weight: 5,
      arbitrary: fc.record({
        op: fc.constant('claim' as const),
        id,
        fingerprint: fc.nat(fingerprints.length - 1),
        leaseMs: fc.constantFrom(...d.leases),
        keepMs: fc.constantFrom(...d.keeps),
        replaces,
      }),
    },
    {
      weight: 3,
      arbitrary: fc.record({ op: fc.constant('renew' as const), id, who, leaseMs: fc.constantFrom(...d.leases) }),
    },
    {
      weight: 3,
      arbitrary: fc.record({
        op: fc.constant('complete' as const),
        id,
        who,
        response: fc.nat(responses.length - 1),
        retentionMs: fc.constantFrom(...d.retentions),
      }),
    },
    { weight: 2, arbitrary: fc.record({ op: fc.constant('release' as const), id, who }) },
    { weight: 2, arbitrary: fc.record({ op: fc.constant('get' as const), id }) },
    { weight: 3, arbitrary: fc.record({ op: fc.constant('advance' as const), ms: fc.constantFrom(...d.advances) }) },
  );
}

/** A record a bounded store dropped to make room, as its `onEvict` told. */
export interface SeenEviction {
  id: string;
  expiresAt: number;
  at: number;
}

/** A store under test, with a way to move its clock as the model's moves. */
export interface ModelTarget {
  store: Store;
  /** Moves the store's clock `ms` forward for the records `ids` (the only ones the history touches). */
  advance(ms: number, ids: readonly string[]): Promise<void> | void;
  /**
   * For a bounded store (memoryStore's `maxEntries`): its bound, its size, and the evictions its
   * `onEvict` reported since the last call. Each is checked against the documented rule: only a
   * completed or abandoned record goes, never a live lease, reported with its real end; every
   * expired record goes before one is evicted; the one evicted is the settled record nearest its
   * end; and a claim that adds a record over the bound makes room when there is a settled record to drop.
   */
  bounded?: { maxEntries: number; size(): number; evictions(): SeenEviction[] };
}

/**
 * Plays `commands` against `target` and a fresh model, and fails at the first answer the model does
 * not allow. `ids` are this history's record ids (fresh per history, so histories never meet).
 * Returns the log of steps, for the failure message.
 */
export async function playHistory(
  target: ModelTarget,
  commands: readonly Command[],
  ids: readonly string[],
  coverage: Coverage = newCoverage(),
): Promise<Coverage> {
  const model = new StoreModel();
  // Per id: every token a claim was given (successful or not: a refused claim's token was never
  // current), and the token a claim or get last answered with.
  const given = ids.map(() => [] as string[]);
  const seen = ids.map(() => undefined as string | undefined);
  let tokens = 0;
  const log: string[] = [];
  const pick = (i: number, w: Who): string => {
    const list = given[i] as string[];
    if (w.kind === 'never' || list.length === 0) return 'never-given';
    if (w.kind === 'current') return model.tokenOf(ids[i] as string) ?? (list[list.length - 1] as string);
    return list[w.n % list.length] as string;
  };
  const step = (what: string, actual: unknown, allowed: unknown[]) => {
    log.push(`${what} -> ${JSON.stringify(actual)}`);
    const ok = allowed.some((answer) => {
      try {
        expect(actual).toEqual(answer);
        return true;
      } catch {
        return false;
      }
    });
    if (!ok) {
      throw new Error(
        `store answered ${JSON.stringify(actual)}, the model allows ${allowed.map((a) => JSON.stringify(a)).join(' or ')}\n  at t=${model.now}: ${what}\n  history:\n    ${log.join('\n    ')}`,
      );
    }
  };
  for (const c of commands) {
    if (c.op === 'advance') {
      model.now += c.ms;
      await target.advance(c.ms, ids);
      log.push(`advance ${c.ms} (t=${model.now})`);
      continue;
    }
    const id = ids[c.id] as string;
    switch (c.op) {
      case 'claim': {
        // Odd tokens now and then: a store must fence on the whole token, escaped or not.
        const token = ++tokens % 3 === 0 ? `t${tokens}"\n` : `t${tokens}`;
        const list = given[c.id] as string[];
        const replacing =
          c.replaces.kind === 'none'
            ? undefined
            : c.replaces.kind === 'seen'
              ? seen[c.id]
              : c.replaces.kind === 'never' || list.length === 0
                ? 'never-given'
                : list[c.replaces.n % list.length];
        const input = {
          id,
          token,
          fingerprint: fingerprints[c.fingerprint] as string,
          leaseMs: c.leaseMs,
          keepAfterLeaseMs: c.keepMs,
          ...(replacing === undefined ? {} : { replaces: replacing }),
        };
        list.push(token);
        const before = model.get(id);
        const expected = model.claim(input);
        const result = await target.store.claim(input);
        const actual = result.claimed ? result : { claimed: false, record: plain(result.record) };
        step(`claim ${JSON.stringify({ ...input, id: c.id })}`, actual, [expected]);
        if (target.bounded) checkEvictions(model, target.bounded, log, expected.claimed && before === undefined);
        if (expected.claimed && before?.state === 'abandoned') coverage.takeovers++;
        if (!expected.claimed && expected.record.state === 'abandoned') coverage.abandoned++;
        seen[c.id] = expected.claimed ? token : expected.record.token;
        break;
      }
      case 'renew': {
        const input = { id, token: pick(c.id, c.who), leaseMs: c.leaseMs };
        const wasAbandoned = model.get(id)?.state === 'abandoned';
        const expected = model.renew(input);
        step(`renew ${JSON.stringify({ ...input, id: c.id })}`, await target.store.renew(input), [expected]);
        if (expected && wasAbandoned) coverage.abandoned++;
        if (!expected && c.who.kind !== 'current') coverage.fenced++;
        break;
      }
      case 'complete': {
        const input = {
          id,
          token: pick(c.id, c.who),
          response: responses[c.response] as StoredResponse,
          retentionMs: c.retentionMs,
        };
        const expected = model.complete(input);
        const what = `complete ${JSON.stringify({ id: c.id, token: input.token, response: c.response, retentionMs: c.retentionMs })}`;
        step(what, await target.store.complete(input), expected);
        if (expected.includes(true)) coverage.completed++;
        else if (c.who.kind !== 'current') coverage.fenced++;
        break;
      }
      case 'release': {
        const input = { id, token: pick(c.id, c.who) };
        const expected = model.release(input);
        step(`release ${JSON.stringify({ ...input, id: c.id })}`, await target.store.release(input), [expected]);
        if (expected) coverage.released++;
        break;
      }
      case 'get': {
        const expected = model.get(id);
        step(`get ${c.id}`, plain(await target.store.get(id)), [expected]);
        if (expected) seen[c.id] = expected.token;
        if (expected?.state === 'abandoned') coverage.abandoned++;
        break;
      }
    }
  }
  return coverage;
}

const fail = (message: string, log: string[]): never => {
  throw new Error(`${message}\n  history:\n    ${log.join('\n    ')}`);
};

// The documented eviction rule, checked after a claim (the only operation that evicts). `added`: the
// claim added a record (a takeover replaces one, and makes no room).
function checkEvictions(
  model: StoreModel,
  bounded: NonNullable<ModelTarget['bounded']>,
  log: string[],
  added: boolean,
) {
  const evictions = bounded.evictions();
  for (const eviction of evictions) {
    log.push(`  evicted ${JSON.stringify(eviction)}`);
    const entry = model.entries.get(eviction.id);
    if (!entry || entry.expiresAt <= model.now) fail(`evicted ${eviction.id}, which had already expired`, log);
    const victim = entry as ModelEntry;
    if (!model.settled(victim)) fail(`evicted ${eviction.id}, a live lease`, log);
    if (eviction.expiresAt !== victim.expiresAt)
      fail(`reported ${eviction.id} ending at ${eviction.expiresAt}, not ${victim.expiresAt}`, log);
    // Ties may go either way: any of the settled records nearest their end will do.
    const sooner = model.liveEntries().find(([, e]) => model.settled(e) && e.expiresAt < victim.expiresAt);
    if (sooner)
      fail(
        `evicted ${eviction.id} (ending at ${victim.expiresAt}) before ${sooner[0]} (ending at ${sooner[1].expiresAt})`,
        log,
      );
    model.evict(eviction.id);
  }
  const size = bounded.size();
  // Expired records go first, all of them: once one record was evicted, none is left.
  const live = model.liveEntries().length;
  if (evictions.length > 0 && size !== live) fail(`evicted a record while holding ${size - live} expired ones`, log);
  if (added && size > bounded.maxEntries && model.liveEntries().some(([, e]) => model.settled(e))) {
    fail(`grew to ${size} over maxEntries ${bounded.maxEntries} with a settled record to evict`, log);
  }
}

/** How often a run of histories reached the cases worth reaching: a model test that never gets there proves nothing. */
export interface Coverage {
  /** Claims that took an abandoned record over. */
  takeovers: number;
  /** Abandoned records answered (claim, get), or renewed back to life. */
  abandoned: number;
  completed: number;
  released: number;
  /** Stale or never-given tokens refused by renew or complete. */
  fenced: number;
}

export const newCoverage = (): Coverage => ({ takeovers: 0, abandoned: 0, completed: 0, released: 0, fenced: 0 });

import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { createIdempotency } from '../src/engine.js';
import type { Lease } from '../src/engine-types.js';
import { memoryStore } from '../src/memory-store.js';

const LEASE = 5_000;
const RETENTION = 86_400_000;

type Command =
  | { op: 'begin'; key: 'a' | 'b'; fp: 'f1' | 'f2' }
  | { op: 'complete'; lease: number }
  | { op: 'release'; lease: number }
  | { op: 'crash'; lease: number }
  | { op: 'advance'; ms: number };

type ModelRecord =
  // An attempt in progress holds its lease until `leaseUntil`, and is kept abandoned (its fingerprint
  // still refusing other parameters) for the retention after that.
  | { state: 'in_progress'; holder: number; fp: string; leaseUntil: number; expiresAt: number }
  | { state: 'completed'; fp: string; body: string; expiresAt: number };

const command: fc.Arbitrary<Command> = fc.oneof(
  {
    weight: 4,
    arbitrary: fc.record({
      op: fc.constant('begin' as const),
      key: fc.constantFrom('a' as const, 'b' as const),
      fp: fc.constantFrom('f1' as const, 'f2' as const),
    }),
  },
  { weight: 2, arbitrary: fc.record({ op: fc.constant('complete' as const), lease: fc.nat(20) }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('release' as const), lease: fc.nat(20) }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('crash' as const), lease: fc.nat(20) }) },
  {
    weight: 2,
    arbitrary: fc.record({
      op: fc.constant('advance' as const),
      ms: fc.constantFrom(1, 1_000, 4_999, 5_000, 3_600_000, RETENTION),
    }),
  },
);

describe('engine against a model (fast-check)', () => {
  it('never runs two live executions of a key, replays the same bytes until retention ends, refuses other parameters after a crash, and ignores stale tokens', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(command, { minLength: 1, maxLength: 40 }), async (commands) => {
        let now = 1_000_000;
        const store = memoryStore({ now: () => now });
        const engine = createIdempotency({
          store,
          lease: LEASE,
          retention: RETENTION,
          heartbeat: false,
          now: () => now,
        });
        const model = new Map<string, ModelRecord>();
        const leases: { lease: Lease; key: string; done: boolean }[] = [];

        const live = (key: string): ModelRecord | undefined => {
          const record = model.get(key);
          if (record && record.expiresAt <= now) {
            model.delete(key);
            return undefined;
          }
          return record;
        };

        for (const cmd of commands) {
          if (cmd.op === 'advance') {
            now += cmd.ms;
            continue;
          }
          if (cmd.op === 'begin') {
            const expected = live(cmd.key);
            const result = await engine.begin({
              key: cmd.key,
              scope: 'user',
              operation: 'POST /x',
              fingerprint: cmd.fp,
            });
            const abandoned = expected?.state === 'in_progress' && expected.leaseUntil <= now;
            if (!expected || (abandoned && expected.fp === cmd.fp)) {
              expect(result.kind).toBe('execute');
              if (result.kind !== 'execute') return;
              // A crashed attempt's key, taken over with the same parameters, says so.
              expect(result.lease.recovered).toBe(abandoned);
              leases.push({ lease: result.lease, key: cmd.key, done: false });
              model.set(cmd.key, {
                state: 'in_progress',
                holder: leases.length - 1,
                fp: cmd.fp,
                leaseUntil: now + LEASE,
                expiresAt: now + LEASE + RETENTION,
              });
              // The store now names this lease as the only holder: every earlier lease is fenced.
              expect((await store.get(result.lease.id))?.token).toBe(result.lease.token);
            } else if (expected.state === 'in_progress') {
              // A live lease: 409. An abandoned one (here with other parameters): 422.
              expect(result.kind === 'reject' && result.error.code).toBe(
                abandoned ? 'fingerprint_mismatch' : 'in_progress',
              );
            } else if (expected.fp !== cmd.fp) {
              expect(result.kind === 'reject' && result.error.code).toBe('fingerprint_mismatch');
            } else {
              expect(result.kind).toBe('replay');
              if (result.kind === 'replay') expect(new TextDecoder().decode(result.response.body)).toBe(expected.body);
            }
            continue;
          }
          const entry = leases[cmd.lease];
          if (!entry || entry.done) continue;
          if (cmd.op === 'crash') {
            entry.done = true; // the worker died: nobody will complete or release this lease
            continue;
          }
          entry.done = true;
          const expected = live(entry.key);
          const current = expected?.state === 'in_progress' && expected.holder === cmd.lease;
          if (cmd.op === 'complete') {
            const body = `response of lease ${cmd.lease}`;
            const result = await engine.complete(entry.lease, {
              status: 201,
              headers: {},
              body: new TextEncoder().encode(body),
            });
            if (current) {
              expect(result).toEqual({ ok: true, stored: true });
              model.set(entry.key, { state: 'completed', fp: expected.fp, body, expiresAt: now + RETENTION });
            } else {
              expect(result).toEqual({ ok: false, reason: 'lease-lost' });
            }
          } else {
            const result = await engine.release(entry.lease);
            if (current) {
              expect(result).toEqual({ ok: true });
              // A recovered run that had no effect leaves the key abandoned, its lease ended at once:
              // the crashed attempt before it may have had effects.
              if (entry.lease.recovered && expected?.state === 'in_progress')
                model.set(entry.key, { ...expected, leaseUntil: now + 1, expiresAt: now + 1 + RETENTION });
              else model.delete(entry.key);
            } else {
              expect(result).toEqual({ ok: false, reason: 'lease-lost' });
            }
          }
        }
      }),
      { numRuns: 1_000 },
    );
  });
});

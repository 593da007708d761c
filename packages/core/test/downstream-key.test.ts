import { describe, expect, it } from 'vitest';
import { downstreamKey } from '../src/downstream-key.js';
import { createIdempotency } from '../src/engine.js';
import { memoryStore } from '../src/memory-store.js';
import { recordId } from '../src/record-id.js';

const uuidV8 = /^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

describe('downstreamKey', () => {
  it('is a UUID of version 8 and variant 10 (RFC 9562), the same bytes as an independent computation', () => {
    // Expected values computed outside the library (Python hashlib, the framing written out by hand).
    expect(downstreamKey({ id: 'q3J-record', fingerprint: 'ab12' }, 'charge')).toBe(
      'd0b9566a-793c-8d28-9554-8eb1bc1437b0',
    );
    expect(downstreamKey({ id: 'q3J-record', fingerprint: 'ab12' }, 'refund:é')).toBe(
      '839f3855-0288-87d7-b9f9-babc6319bf5e',
    );
    for (let i = 0; i < 200; i++) {
      expect(downstreamKey({ id: `id-${i}`, fingerprint: 'fp' }, `call-${i}`)).toMatch(uuidV8);
    }
  });

  it('is the same for every run of one request, and differs by caller, operation, key, body and purpose', () => {
    const id = recordId('user:alice', 'POST /charges', 'k-1');
    const base = downstreamKey({ id, fingerprint: 'fp-a' }, 'charge');
    expect(downstreamKey({ id: recordId('user:alice', 'POST /charges', 'k-1'), fingerprint: 'fp-a' }, 'charge')).toBe(
      base,
    );
    const others = [
      downstreamKey({ id: recordId('user:bob', 'POST /charges', 'k-1'), fingerprint: 'fp-a' }, 'charge'),
      downstreamKey({ id: recordId('user:alice', 'POST /orders', 'k-1'), fingerprint: 'fp-a' }, 'charge'),
      downstreamKey({ id: recordId('user:alice', 'POST /charges', 'k-2'), fingerprint: 'fp-a' }, 'charge'),
      downstreamKey({ id, fingerprint: 'fp-b' }, 'charge'),
      downstreamKey({ id, fingerprint: 'fp-a' }, 'email'),
    ];
    expect(new Set([base, ...others]).size).toBe(6);
  });

  it('cannot be made to collide by moving characters between the parts', () => {
    expect(downstreamKey({ id: 'a', fingerprint: 'bc' }, 'd')).not.toBe(
      downstreamKey({ id: 'ab', fingerprint: 'c' }, 'd'),
    );
    expect(downstreamKey({ id: 'a', fingerprint: 'b' }, 'cd')).not.toBe(
      downstreamKey({ id: 'a', fingerprint: 'bc' }, 'd'),
    );
    expect(downstreamKey({ id: '1:a', fingerprint: '' }, 'x')).not.toBe(
      downstreamKey({ id: '', fingerprint: 'a' }, 'x'),
    );
    // Lone surrogates, which UTF-8 would merge into U+FFFD, stay apart.
    const source = { id: 'id', fingerprint: 'fp' };
    expect(new Set(['r\ud800', 'r\udc00', 'r\ufffd'].map((purpose) => downstreamKey(source, purpose))).size).toBe(3);
  });

  it('refuses a purpose that is not a non-empty string', () => {
    const source = { id: 'id', fingerprint: 'fp' };
    expect(() => downstreamKey(source, '')).toThrow(new TypeError('purpose must be a non-empty string'));
    expect(() => downstreamKey(source, undefined as unknown as string)).toThrow(TypeError);
    expect(() => downstreamKey(source, 7 as unknown as string)).toThrow(TypeError);
  });

  it("takes the engine's lease: a run after the key was released derives the same key as the first", async () => {
    const store = memoryStore();
    const engine = createIdempotency({ store, heartbeat: false });
    // A hex SHA-256, as the adapters pass: the engine keeps it as given (other text it hashes first).
    const fingerprint = 'a'.repeat(64);
    const request = { key: 'k-1', scope: 'user:alice', operation: 'POST /charges', fingerprint };
    const first = await engine.begin(request);
    if (first.kind !== 'execute') throw new Error('expected an execution');
    const key = downstreamKey(first.lease, 'charge');
    expect(key).toBe(downstreamKey({ id: recordId('user:alice', 'POST /charges', 'k-1'), fingerprint }, 'charge'));
    // The run failed and the policy let the key go: the retry is a new run with a new lease token.
    await engine.release(first.lease);
    const second = await engine.begin(request);
    if (second.kind !== 'execute') throw new Error('expected a second execution');
    expect(second.lease.token).not.toBe(first.lease.token);
    expect(downstreamKey(second.lease, 'charge')).toBe(key);
  });
});

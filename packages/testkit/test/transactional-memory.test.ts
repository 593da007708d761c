import { memoryStore } from '@idem/core';
import { describe, expect, it } from 'vitest';
import { transactionalMemoryStore } from '../src/index.js';

describe('transactionalMemoryStore', () => {
  // As postgresStore's transaction: an id or token no store could keep apart (a lone surrogate, a
  // NUL) is refused before the handler runs, not after it ran for a commit that cannot land.
  it('refuses a transaction whose id or token holds U+0000 or a lone surrogate with a TypeError, before its handler runs', async () => {
    const inner = memoryStore({ now: () => 0 });
    const store = transactionalMemoryStore({ store: inner });
    await inner.claim({ id: 'r', token: 't', fingerprint: '', leaseMs: 5_000 });
    let runs = 0;
    const handler = async () => {
      runs++;
      return { value: undefined, response: undefined, retentionMs: 60_000 };
    };
    for (const bad of ['\u0000', '\ud800', '\udc00']) {
      await expect(store.transaction({ id: `r${bad}`, token: 't' }, handler)).rejects.toThrow(TypeError);
      await expect(store.transaction({ id: 'r', token: `t${bad}` }, handler)).rejects.toThrow(TypeError);
    }
    expect(runs).toBe(0);
    expect(inner.get('r')).toEqual({ state: 'in_progress', token: 't', fingerprint: '' });
  });
});

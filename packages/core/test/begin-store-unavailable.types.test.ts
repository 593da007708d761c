// engine.begin's overloads (storeUnavailable, anchors case 14): `unprotected` is among its answers
// whenever the call may ask for 'fail-open', also through an option that is only typed so. The
// type-level lines are checked by `npm run typecheck` (tsc); the runtime lines, run by vitest, keep
// each type next to the answer a call really gets.
import { describe, expect, expectTypeOf, it } from 'vitest';
import {
  type BeginResult,
  createIdempotency,
  memoryStore,
  type Store,
  StoreUnavailableError,
  type StoreUnavailablePolicy,
  type UnprotectedResult,
} from '../src/index.js';

const request = { key: 'k-1', scope: 'caller', operation: 'POST /charges', fingerprint: 'f' };
// A store that cannot be reached.
const down: Store = {
  ...memoryStore(),
  claim: () => Promise.reject(new StoreUnavailableError('Redis claim failed')),
};

describe('engine.begin with storeUnavailable', () => {
  // Was wrong: a policy passed on from an optional setting (typed `StoreUnavailablePolicy |
  // undefined`) missed the overload that answers `unprotected`, and the call was typed as never
  // answering it: a caller's exhaustive switch compiled, and met `{ kind: 'unprotected' }` at run time.
  it("answers unprotected for a policy typed as possibly 'fail-open', and says so in its type", async () => {
    const engine = createIdempotency({ store: down });
    const settings: { storeUnavailable?: StoreUnavailablePolicy | undefined } = { storeUnavailable: 'fail-open' };
    const started = engine.begin({ ...request, storeUnavailable: settings.storeUnavailable });
    expectTypeOf(started).toEqualTypeOf<Promise<BeginResult | UnprotectedResult>>();
    expect(await started).toEqual({ kind: 'unprotected' });
  });

  it("is typed as the plain answers where no 'fail-open' can be asked for", async () => {
    const engine = createIdempotency({ store: down });
    const plain = engine.begin(request);
    expectTypeOf(plain).toEqualTypeOf<Promise<BeginResult>>();
    expect(await plain).toMatchObject({ kind: 'reject', error: { code: 'store_unavailable' } });
    const closed = engine.begin({ ...request, storeUnavailable: 'fail-closed' });
    expectTypeOf(closed).toEqualTypeOf<Promise<BeginResult>>();
    expect(await closed).toMatchObject({ kind: 'reject' });
    const open = engine.begin({ ...request, storeUnavailable: 'fail-open' });
    expectTypeOf(open).toEqualTypeOf<Promise<BeginResult | UnprotectedResult>>();
    expect(await open).toEqual({ kind: 'unprotected' });
  });
});

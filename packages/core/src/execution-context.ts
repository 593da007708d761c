import { downstreamKey } from './downstream-key.js';
import type { Lease } from './engine-types.js';
import type { IdempotencyContext } from './http-types.js';
import { answeringForHandler } from './lease-marks.js';

// One class for every execution's context: `signal` is a getter on the prototype, and the lease
// makes its AbortController only when a handler asks for it.
export class ExecutionContext implements IdempotencyContext {
  tx: unknown = undefined;
  readonly #lease: Lease;
  readonly #sayNoEffect: (lease: Lease) => void;
  #release: (() => void) | undefined = undefined;
  #answering: (() => void) | undefined = undefined;
  #keyFor: ((purpose: string) => string) | undefined = undefined;

  constructor(
    public key: string,
    public minted: boolean,
    lease: Lease,
    sayNoEffect: (lease: Lease) => void,
  ) {
    this.#lease = lease;
    this.#sayNoEffect = sayNoEffect;
  }

  // The methods are bound to their execution on first use, so a handler may take them off the
  // context (`const { release } = req.idempotency`): unbound, `release()` threw, Express answered
  // 500, and the policy stored the very answer the handler said must not be kept. Made on first use,
  // since most handlers call neither.
  get release(): () => void {
    if (this.#release === undefined) this.#release = () => this.#sayNoEffect(this.#lease);
    return this.#release;
  }

  get answeringForHandler(): () => void {
    if (this.#answering === undefined) this.#answering = answeringForHandler.bind(undefined, this.#lease);
    return this.#answering;
  }

  get signal(): AbortSignal {
    return this.#lease.signal;
  }

  get recovered(): boolean {
    return this.#lease.recovered;
  }

  get keyFor(): (purpose: string) => string {
    if (this.#keyFor === undefined) this.#keyFor = (purpose) => downstreamKey(this.#lease, purpose);
    return this.#keyFor;
  }
}

// describeAdapter() with `adapterOptions` whose settings are given as undefined, as a configuration
// object read from the environment hands them on. Run only by adapter-options-undefined.audit.test.ts,
// in a child vitest with fixture.vitest.config.ts (see third-party-adapter.fixture.ts for why a child).
import { describeAdapter } from '@idem/testkit';
import { makeNodeHttpServer } from './node-http-adapter.js';

// `as never`: `store` is required in HttpIdempotencyOptions, so it takes no undefined in
// Partial<HttpIdempotencyOptions>; a configuration read at run time can still hold one.
describeAdapter('store left out', (options) => makeNodeHttpServer(options), {
  adapterOptions: { store: undefined } as never,
});
describeAdapter('listener left out', (options) => makeNodeHttpServer(options), {
  adapterOptions: { onEvent: undefined, storeTimeout: undefined },
});

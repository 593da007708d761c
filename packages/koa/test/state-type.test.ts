import { memoryStore } from '@idem/core';
import Koa from 'koa';
import { expect, it } from 'vitest';
import { guard, type IdemState, idempotency } from '../src/index.js';

// Was a defect: `ctx.state.auth` and `ctx.state.idempotency` are typed on Koa's `DefaultState`, which
// an app with its own state type (`new Koa<MyState>()`) leaves aside: they were gone, and nothing
// named them to add back. `IdemState` does (this file's typecheck fails without it).
it('an app with its own state type reads auth and idempotency through IdemState', () => {
  const app = new Koa<{ tenant: string } & IdemState>();
  app.use(
    guard({
      audience: 'https://api.example',
      issuers: [{ issuer: 'https://id.example', secret: 'koa-state-type-test-secret-32-bytes+' }],
    }),
  );
  app.use(idempotency({ store: memoryStore() }));
  app.use((ctx) => {
    const sub: string | undefined = ctx.state.auth?.sub;
    const key: string | undefined = ctx.state.idempotency?.key;
    // Typed, not `any`: a principal's sub is no number.
    // @ts-expect-error
    const wrong: number | undefined = ctx.state.auth?.sub;
    ctx.body = { sub, key, wrong, tenant: ctx.state.tenant };
  });
  expect(app.middleware).toHaveLength(3);
});

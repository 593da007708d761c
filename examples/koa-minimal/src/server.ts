import { json } from 'node:stream/consumers';
import { memoryStore } from '@idem/core';
import { idempotency } from '@idem/koa';
import Koa from 'koa';

const app = new Koa();
let count = 0;

// In production the guard sets ctx.state.auth, the default scope; here a demo caller header stands in,
// and a request without it is turned away first, as the guard turns away one without a token.
app.use(async (ctx, next) => {
  if (ctx.get('x-customer')) return next();
  ctx.status = 401;
  ctx.body = { error: 'send x-customer: <id>' };
});
app.use(idempotency({ store: memoryStore(), scope: (ctx) => ctx.get('x-customer') || undefined }));

app.use(async (ctx) => {
  if (ctx.method !== 'POST' || ctx.path !== '/charges') return;
  // The middleware read the raw body and put it back: any body parser (here, the plain stream) reads it.
  const body = (await json(ctx.req)) as { amount: number };
  const id = `ch_${++count}`;
  ctx.status = 201;
  ctx.set('location', `/charges/${id}`);
  ctx.body = { id, amount: body.amount };
});

const port = Number(process.env.PORT ?? 3000);
app.listen(port, () => {
  console.log(`koa-minimal on http://localhost:${port}; send this twice:`);
  console.log(
    `curl -i localhost:${port}/charges -H 'x-customer: c1' -H 'Idempotency-Key: k1' -H 'content-type: application/json' -d '{"amount":100}'`,
  );
});

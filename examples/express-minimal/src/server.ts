import { memoryStore } from '@idem/core';
import { idempotency } from '@idem/express';
import express from 'express';

const app = express();
let count = 0;

// In production the guard sets req.auth, the default scope; here a demo caller header stands in,
// and a request without it is turned away first, as the guard turns away one without a token.
const idem = idempotency({ store: memoryStore(), scope: (req) => req.get('x-customer') });
const caller: express.RequestHandler = (req, res, next) =>
  req.get('x-customer') ? next() : res.status(401).json({ error: 'send x-customer: <id>' });

// idempotency() goes before the body parser: it hashes the raw bytes and hands them on.
app.post('/charges', caller, idem, express.json(), (req, res) => {
  const id = `ch_${++count}`;
  res.status(201).location(`/charges/${id}`).json({ id, amount: req.body.amount });
});

const port = Number(process.env.PORT ?? 3000);
app.listen(port, () => {
  console.log(`express-minimal on http://localhost:${port}; send this twice:`);
  console.log(
    `curl -i localhost:${port}/charges -H 'x-customer: c1' -H 'Idempotency-Key: k1' -H 'content-type: application/json' -d '{"amount":100}'`,
  );
});

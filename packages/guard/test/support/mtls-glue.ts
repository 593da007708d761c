// What the glues' RFC 8705 tests over real TLS (express, fastify, koa: mtls.int.test.ts) all start
// with: a guard that takes certificate-bound tokens, and a token bound to a client certificate. From
// `@idem/guard` (the built package) as the glues import it, so the glue sees the guard it ships with.
import { createGuard, type Guard } from '@idem/guard';
import type { IssuedCert } from './tls-certs.js';
import { AUDIENCE, ISSUER, makeToken, manualClock, SECRET } from './tokens.js';

/** A guard on the test issuer that checks certificate-bound tokens against the TLS peer certificate. */
export const mtlsGuard = (): Guard =>
  createGuard({
    audience: AUDIENCE,
    now: manualClock().now,
    issuers: [{ issuer: ISSUER, secret: SECRET }],
    mtls: {},
  });

/** Request headers with a Bearer token bound to `cert` (`cnf["x5t#S256"]`). */
export const boundHeaders = (cert: IssuedCert) => ({
  authorization: `Bearer ${makeToken({ claims: { cnf: { 'x5t#S256': cert.x5t } } })}`,
});

import { createHash, randomUUID } from 'node:crypto';
import { calculateJwkThumbprint } from 'jose';
import { describe, expect, it } from 'vitest';
import { createGuard } from '../src/index.js';
import { AUDIENCE, b64url, ISSUER, makeToken, manualClock, SECRET, signSegments, testKeys } from './support/tokens.js';

// A token bound both ways (cnf.jkt and cnf["x5t#S256"]) on a guard that checks DPoP but not
// certificates (no `mtls`): the certificate binding is one this guard cannot check.

const ORIGIN = 'https://api.example';
// 43 base64url characters, the last of the 16 a SHA-256 can end with: a well-formed thumbprint.
const X5T = createHash('sha256').update('some client certificate').digest('base64url');

describe('a DPoP + mTLS-bound token on a guard without mtls', () => {
  // It passed on the DPoP proof alone, the certificate binding skipped, while with `mtls` on the same
  // token needs both. Decided: refused, as a bound token presented without its proof is (fail closed).
  it('is refused (token_bound): its certificate binding cannot be checked here', async () => {
    const keys = testKeys();
    const clock = manualClock();
    const guard = createGuard({
      audience: AUDIENCE,
      now: clock.now,
      issuers: [{ issuer: ISSUER, secret: SECRET }],
      dpop: { origin: ORIGIN },
    });
    const jkt = await calculateJwkThumbprint(keys.ec.publicJwk as never, 'sha256');
    const token = makeToken({ claims: { cnf: { jkt, 'x5t#S256': X5T } } });
    const proof = signSegments(
      b64url({ typ: 'dpop+jwt', alg: 'ES256', jwk: keys.ec.publicJwk }),
      b64url({
        jti: randomUUID(),
        htm: 'GET',
        htu: `${ORIGIN}/orders`,
        iat: clock.seconds(),
        ath: createHash('sha256').update(token).digest('base64url'),
      }),
      'ES256',
      keys.ec.privateKey,
    );
    const result = await guard.authenticate({
      headers: { authorization: `DPoP ${token}`, dpop: proof },
      method: 'GET',
      url: '/orders',
    });
    expect(result.ok ? 'ok' : result.error.code).toBe('token_bound');
  });
});

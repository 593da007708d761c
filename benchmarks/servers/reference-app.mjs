// The reference app's resource side (gateway, guard, internal token, API with transactional
// idempotency and the PostgreSQL outbox) on the machine's PostgreSQL, in a schema of its own that
// is dropped on stop. The gateway trusts one HS256 issuer made here; the child signs the one access
// token the load sends, so the parent never needs the gateway's audience before it has a port.
import { randomUUID } from 'node:crypto';
import { SignJWT } from 'jose';
import { databaseUrl } from './backends.mjs';

const issuer = 'https://id.bench.example';
const secret = 'bench-reference-app-secret-0123456789abcdef';

/**
 * Starts the stack and resolves with the gateway's port, a bearer token with `charges:write`, and close().
 *
 * @example
 * const { port, bearer, close } = await startReferenceApp();
 */
export async function startReferenceApp() {
  const { openDatabase } = await import('../../examples/reference-app/src/db.ts');
  const { startResourceStack } = await import('../../examples/reference-app/src/api/index.ts');
  const schema = `bench_${randomUUID().slice(0, 8)}`;
  const db = await openDatabase({ url: databaseUrl, schema });
  let stack;
  try {
    // The relay is left off: the bench measures the charge and its outbox row committing together,
    // not the delivery of webhooks, which would add the receiver's work to the same two cores.
    stack = await startResourceStack({
      db,
      gatewayPort: 0,
      apiPort: 0,
      receiverPort: 0,
      issuers: [{ issuer, secret, algorithms: ['HS256'] }],
      relay: false,
      seed: false,
    });
  } catch (error) {
    await db.query(`drop schema if exists ${schema} cascade`).catch(() => {});
    await db.close();
    throw error;
  }
  const now = Math.floor(Date.now() / 1000);
  const bearer = await new SignJWT({ scope: 'charges:write', client_id: 'bench' })
    .setProtectedHeader({ alg: 'HS256', typ: 'at+jwt' })
    .setIssuer(issuer)
    .setAudience(stack.gateway.baseUrl)
    .setSubject('bench-user')
    .setJti(randomUUID())
    .setIssuedAt(now)
    .setExpirationTime(now + 3_600)
    .sign(new TextEncoder().encode(secret));
  return {
    port: new URL(stack.gateway.url).port,
    bearer,
    close: async () => {
      await stack.close();
      await db.query(`drop schema if exists ${schema} cascade`).catch(() => {});
      await db.close();
    },
  };
}

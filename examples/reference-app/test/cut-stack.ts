// Shared by the gateway cut audit: the resource stack behind a test issuer, plus a second gateway
// whose link to the API runs through a cutting proxy, a raw-socket client and a cutting proxy.
import { randomUUID } from 'node:crypto';
import type { IssuerOptions } from '@idem/guard';
import { createCutProxy, frameRequest } from '@idem/testkit';
import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import { type RunningResourceStack, startResourceStack } from '../src/api/resource-stack.js';
import type { Database } from '../src/db.js';
import { type GatewayOptions, type RunningGateway, startGateway } from '../src/gateway/server.js';
import { closeTestRedis, openTestDatabase, openTestRedis } from './services.js';
import { allScopes } from './test-stack.js';

export { type CutHow, type RawAnswer, sendRaw } from '@idem/testkit';

/** The raw bytes of a keyed `POST /charges`, with Content-Length or chunked. */
export function chargeBytes(
  token: string,
  key: string,
  body: string,
  options: { chunked?: boolean } = {},
): { bytes: Buffer; headEnd: number } {
  const head =
    `POST /charges HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${token}\r\n` +
    `Idempotency-Key: "${key}"\r\nContent-Type: application/json\r\nConnection: close\r\n`;
  return frameRequest(head, Buffer.from(body), options.chunked);
}

export const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** The stack, a second gateway to the API through a cutting proxy, and an access-token minter. */
export interface CutStack {
  readonly stack: RunningResourceStack;
  readonly db: Database;
  /** A gateway like the stack's, whose connections to the API run through `upstreamProxy`. */
  readonly cutGateway: RunningGateway;
  readonly upstreamProxy: Awaited<ReturnType<typeof createCutProxy>>;
  /** A proxy in front of the stack's gateway (client to gateway). */
  readonly frontProxy: Awaited<ReturnType<typeof createCutProxy>>;
  readonly gatewayPort: number;
  /** One more gateway like the stack's, to another API (closed with the stack). */
  gatewayTo(apiUrl: string, options?: Partial<GatewayOptions>): Promise<RunningGateway>;
  token(): Promise<string>;
  charges(key: string): Promise<string[]>;
  close(): Promise<void>;
}

export async function startCutStack(name: string): Promise<CutStack> {
  const issuer = `https://issuer.${name}-test.example`;
  const audience = `http://gateway.${name}-test`;
  const kid = `${name}-test`;
  const pair = await generateKeyPair('ES256');
  const jwk = { ...(await exportJWK(pair.publicKey)), kid, alg: 'ES256' };
  const db = await openTestDatabase(name);
  const redis = await openTestRedis(name);
  const issuers: IssuerOptions[] = [{ issuer, jwks: { keys: [jwk] }, algorithms: ['ES256'] }];
  const stack = await startResourceStack({
    db,
    gatewayPort: 0,
    apiPort: 0,
    receiverPort: 0,
    baseUrl: audience,
    issuers,
    relay: false,
    ...(redis ? { redis } : {}),
  });
  const apiPort = Number(new URL(stack.api.url).port);
  const upstreamProxy = await createCutProxy(apiPort);
  const cutGateway = await startGateway({
    port: 0,
    apiUrl: `http://127.0.0.1:${upstreamProxy.port}`,
    apiAudience: 'reference-api',
    internalIssuer: stack.gateway.internalIssuer,
    baseUrl: audience,
    issuers,
  });
  const gatewayPort = Number(new URL(stack.gateway.url).port);
  const frontProxy = await createCutProxy(gatewayPort);
  const others: RunningGateway[] = [];
  return {
    stack,
    db,
    cutGateway,
    upstreamProxy,
    frontProxy,
    gatewayPort,
    async gatewayTo(apiUrl, options = {}) {
      const gateway = await startGateway({
        port: 0,
        apiUrl,
        apiAudience: 'reference-api',
        internalIssuer: stack.gateway.internalIssuer,
        baseUrl: audience,
        issuers,
        ...options,
      });
      others.push(gateway);
      return gateway;
    },
    token: () =>
      new SignJWT({ scope: allScopes, roles: [], client_id: 'photo-app' })
        .setProtectedHeader({ alg: 'ES256', kid, typ: 'at+jwt' })
        .setIssuer(issuer)
        .setSubject('user-alice')
        .setAudience(audience)
        .setIssuedAt()
        .setExpirationTime('10m')
        .setJti(randomUUID())
        .sign(pair.privateKey),
    async charges(key) {
      const { rows } = await db.query<{ id: string }>('select id from api_charges where idempotency_key = $1', [key]);
      return rows.map((row) => row.id);
    },
    async close() {
      for (const gateway of others) await gateway.close();
      await cutGateway.close();
      await upstreamProxy.close();
      await frontProxy.close();
      await stack.close();
      await closeTestRedis(redis);
      await db.close();
    },
  };
}

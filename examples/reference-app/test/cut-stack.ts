// Shared by the gateway cut audit: the resource stack behind a test issuer, plus a second gateway
// whose link to the API runs through a cutting proxy, a raw-socket client and a cutting proxy.
import { randomUUID } from 'node:crypto';
import net from 'node:net';
import type { IssuerOptions } from '@idem/guard';
import { type CutHow, createCutProxy } from '@idem/testkit';
import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import { type RunningResourceStack, startResourceStack } from '../src/api/resource-stack.js';
import type { Database } from '../src/db.js';
import { type GatewayOptions, type RunningGateway, startGateway } from '../src/gateway/server.js';
import { closeTestRedis, openTestDatabase, openTestRedis } from './services.js';
import { allScopes } from './test-stack.js';

export type { CutHow } from '@idem/testkit';

export interface RawAnswer {
  status: number;
  head: string;
  headers: Record<string, string>;
  body: Buffer;
  raw: Buffer;
  timedOut: boolean;
  /** Milliseconds until the connection closed. */
  ms: number;
}

export function parseAnswer(raw: Buffer): Omit<RawAnswer, 'timedOut' | 'raw' | 'ms'> {
  const end = raw.indexOf('\r\n\r\n');
  const head = raw.subarray(0, end === -1 ? raw.length : end).toString('latin1');
  const match = /^HTTP\/1\.[01] (\d{3})/.exec(head);
  const headers: Record<string, string> = {};
  for (const line of head.split('\r\n').slice(1)) {
    const colon = line.indexOf(':');
    if (colon > 0) headers[line.slice(0, colon).toLowerCase()] = line.slice(colon + 1).trim();
  }
  const body = end === -1 ? Buffer.alloc(0) : raw.subarray(end + 4);
  return { status: match ? Number(match[1]) : 0, head, headers, body };
}

/**
 * Writes the first `cutAt` bytes of `bytes` on a fresh connection to `port` (all of them when
 * undefined), then FIN (`fin`), RST (`reset`) or nothing more (undefined); resolves with what came
 * back once the connection closed, or after `limitMs`.
 */
export function sendRaw(port: number, bytes: Buffer, cutAt?: number, how?: CutHow, limitMs = 5000): Promise<RawAnswer> {
  return new Promise((resolve) => {
    const started = Date.now();
    const socket = net.connect(port, '127.0.0.1');
    const chunks: Buffer[] = [];
    let done = false;
    const finish = (timedOut: boolean) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      socket.destroy();
      const raw = Buffer.concat(chunks);
      resolve({ ...parseAnswer(raw), raw, timedOut, ms: Date.now() - started });
    };
    const timer = setTimeout(() => finish(true), limitMs);
    socket.on('data', (chunk) => chunks.push(chunk));
    socket.on('end', () => finish(false));
    socket.on('close', () => finish(false));
    socket.on('error', () => finish(false));
    socket.on('connect', () => {
      socket.write(cutAt === undefined ? bytes : bytes.subarray(0, cutAt), () => {
        if (how === 'fin') socket.end();
        else if (how === 'reset') socket.resetAndDestroy();
      });
    });
  });
}

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
  const payload = Buffer.from(body);
  if (!options.chunked) {
    const first = Buffer.from(`${head}Content-Length: ${payload.length}\r\n\r\n`);
    return { bytes: Buffer.concat([first, payload]), headEnd: first.length };
  }
  const first = Buffer.from(`${head}Transfer-Encoding: chunked\r\n\r\n`);
  const half = Math.ceil(payload.length / 2);
  const pieces = [payload.subarray(0, half), payload.subarray(half)];
  const chunks = pieces.flatMap((piece) => [
    Buffer.from(`${piece.length.toString(16)}\r\n`),
    piece,
    Buffer.from('\r\n'),
  ]);
  return { bytes: Buffer.concat([first, ...chunks, Buffer.from('0\r\n\r\n')]), headEnd: first.length };
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

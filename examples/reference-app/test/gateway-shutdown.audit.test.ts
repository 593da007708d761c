// Shutdown of the gateway (`npm start` closes it before the API, see main.ts): the README promises that
// each component "stops taking requests and gives those already running up to 10 s to finish". The
// other servers go through drainable() (src/drain.ts); the gateway is Fastify's own server.
import { randomUUID } from 'node:crypto';
import { Agent, createServer, type IncomingMessage, request, type Server } from 'node:http';
import { type AddressInfo, connect } from 'node:net';
import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import { afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { type GatewayOptions, type RunningGateway, startGateway } from '../src/gateway/server.js';

const issuer = 'https://issuer.gateway-shutdown.example';
const audience = 'http://gateway-shutdown.test';
let privateKey: CryptoKey;
let publicJwk: Record<string, unknown>;

beforeAll(async () => {
  const pair = await generateKeyPair('ES256', { extractable: true });
  privateKey = pair.privateKey;
  publicJwk = { ...(await exportJWK(pair.publicKey)), kid: 'test-key', alg: 'ES256' };
});

function mint(): Promise<string> {
  const iat = Math.floor(Date.now() / 1000);
  return new SignJWT({ scope: 'photos:read photos:write', roles: [], client_id: 'photo-app' })
    .setProtectedHeader({ alg: 'ES256', kid: 'test-key', typ: 'at+jwt' })
    .setIssuer(issuer)
    .setSubject('user-alice')
    .setAudience(audience)
    .setIssuedAt(iat)
    .setExpirationTime(iat + 300)
    .setJti(randomUUID())
    .sign(privateKey);
}

const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

/** An upstream whose every request waits until the test answers it. */
async function slowUpstream(): Promise<{ port: number; arrived: Promise<void>; answer: () => void }> {
  let arrive: () => void = () => undefined;
  const arrived = new Promise<void>((resolve) => {
    arrive = resolve;
  });
  let pending: (() => void) | undefined;
  const server: Server = createServer((req, res) => {
    req.resume();
    pending = () => res.writeHead(200, { 'content-type': 'application/json' }).end('{"ok":true}');
    arrive();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  cleanups.push(() => {
    server.closeAllConnections();
    return new Promise<void>((resolve) => server.close(() => resolve()));
  });
  // Answers once: a test that answered leaves its cleanup nothing to answer.
  const answer = () => {
    const now = pending;
    pending = undefined;
    now?.();
  };
  return { port: (server.address() as AddressInfo).port, arrived, answer };
}

async function gatewayTo(port: number, options: Partial<GatewayOptions> = {}): Promise<RunningGateway> {
  const gateway = await startGateway({
    port: 0,
    apiUrl: `http://127.0.0.1:${port}`,
    baseUrl: audience,
    issuers: [{ issuer, jwks: { keys: [publicJwk] }, algorithms: ['ES256'] }],
    ...options,
  });
  return gateway;
}

function get(
  url: string,
  agent: Agent,
  token: string,
): Promise<{ status: number; headers: IncomingMessage['headers']; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(new URL('/photos', url), { agent, headers: { authorization: `Bearer ${token}` } }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        body += chunk;
      });
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

/** True once the gateway at `url` refuses a new connection: its close has begun (the listener is gone). */
function refuses(url: string): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(Number(new URL(url).port), '127.0.0.1');
    socket.once('connect', () => {
      socket.destroy();
      resolve(false);
    });
    socket.once('error', (error: NodeJS.ErrnoException) => resolve(error.code === 'ECONNREFUSED'));
  });
}

const within = <T>(promise: Promise<T>, ms: number) =>
  Promise.race([
    promise.then(() => 'settled' as const),
    new Promise<'timed out'>((resolve) => setTimeout(() => resolve('timed out'), ms).unref()),
  ]);

describe('gateway shutdown with a request in flight on a keep-alive connection', () => {
  // Was a defect: the gateway's close() is Fastify's, which closes idle connections once; the connection of a request answered during the close stays open for Fastify's 72 s keepAliveTimeout, so `npm start` hangs that long on SIGTERM (a supervisor's 10-30 s stop timeout SIGKILLs it before the API, relay, Redis and the database are closed).
  it('finishes the request, then closes promptly (not after the 72 s keep-alive timeout)', async () => {
    const upstream = await slowUpstream();
    const gateway = await gatewayTo(upstream.port);
    cleanups.push(() => gateway.close());
    const agent = new Agent({ keepAlive: true });
    cleanups.push(() => agent.destroy());
    const response = get(gateway.url, agent, await mint());
    await upstream.arrived;
    let closed = false;
    const closing = gateway.close().then(() => {
      closed = true;
    });
    // Draining (new connections refused), and still not closed while the request runs.
    await expect.poll(() => refuses(gateway.url)).toBe(true);
    expect(closed).toBe(false);
    upstream.answer();
    const answered = await response;
    expect(answered.status).toBe(200);
    // The drained servers (drainable) close within milliseconds of the last answer.
    expect(await within(closing, 2_000)).toBe('settled');
  }, 10_000);

  // Was a defect: a response answered while the gateway closed said nothing of it, so the client's
  // agent reused the connection; the request then met Fastify's own 503 (application/json, no
  // Retry-After) or, on the drained servers, a reset as the socket closed: for a POST, an answer
  // it cannot tell from a lost one. Now the response says `Connection: close`, and the next request
  // finds the port closed, a refused connection that is plainly safe to retry.
  it('says Connection: close on a response answered while it drains; the next request is refused, not reset', async () => {
    const upstream = await slowUpstream();
    const gateway = await gatewayTo(upstream.port);
    cleanups.push(() => gateway.close());
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    cleanups.push(() => agent.destroy());
    const token = await mint();
    const first = get(gateway.url, agent, token);
    await upstream.arrived;
    const closing = gateway.close();
    // Answered only once the gateway drains (new connections refused).
    await expect.poll(() => refuses(gateway.url)).toBe(true);
    upstream.answer();
    const answered = await first;
    expect(answered.status).toBe(200);
    expect(answered.headers.connection).toBe('close');
    await closing;
    const second = await get(gateway.url, agent, token).then(
      () => 'answered',
      (error: NodeJS.ErrnoException) => error.code,
    );
    expect(second).toBe('ECONNREFUSED');
  }, 10_000);
  // Checked, no defect: a balancer's probe on its kept-alive connection is never answered 200 once
  // the gateway drains. The close ends the idle connection at once (the probe's next try finds the
  // port closed), and a probe pipelined behind a running request is not read: the running request's
  // answer says `Connection: close` and ends the connection.
  it('answers no /healthz probe ok once it drains, kept-alive or pipelined', async () => {
    const upstream = await slowUpstream();
    const gateway = await gatewayTo(upstream.port);
    cleanups.push(() => gateway.close());
    const { port, host } = new URL(gateway.url);
    const probe = (agent: Agent) =>
      new Promise<number | string>((resolve) => {
        const req = request(new URL('/healthz', gateway.url), { agent }, (res) => {
          res.resume();
          res.on('end', () => resolve(res.statusCode ?? 0));
        });
        req.on('error', (error: NodeJS.ErrnoException) => resolve(error.code ?? 'error'));
        req.end();
      });
    const balancer = new Agent({ keepAlive: true, maxSockets: 1 });
    cleanups.push(() => balancer.destroy());
    expect(await probe(balancer)).toBe(200);
    const socket = connect(Number(port), '127.0.0.1');
    cleanups.push(() => {
      socket.destroy();
    });
    let received = '';
    socket.setEncoding('utf8');
    socket.on('data', (chunk: string) => {
      received += chunk;
    });
    const ended = new Promise<void>((resolve) => socket.once('close', () => resolve()));
    socket.write(
      `GET /photos HTTP/1.1\r\nHost: ${host}\r\nAuthorization: Bearer ${await mint()}\r\n\r\n` +
        `GET /healthz HTTP/1.1\r\nHost: ${host}\r\n\r\n`,
    );
    await upstream.arrived;
    const closing = gateway.close();
    await expect.poll(() => refuses(gateway.url)).toBe(true);
    // Draining (the request above still runs): the balancer's connection is gone.
    expect(await probe(balancer)).not.toBe(200);
    upstream.answer();
    expect(await within(ended, 2_000)).toBe('settled');
    const statuses = [...received.matchAll(/^HTTP\/1\.1 (\d{3})/gm)].map((match) => match[1]);
    expect(statuses).toEqual(['200']);
    await closing;
  }, 10_000);

  /** A gateway holding one request its upstream never answers: closed, only its grace ends it. */
  async function stuckRequest(options: Partial<GatewayOptions> = {}) {
    const upstream = await slowUpstream();
    const gateway = await gatewayTo(upstream.port, options);
    // Reverse order: the upstream is shut last-registered-first, so the gateway's own close can end.
    cleanups.push(() => gateway.close());
    const agent = new Agent({ keepAlive: true });
    cleanups.push(() => agent.destroy());
    const response = get(gateway.url, agent, await mint()).catch((error: Error) => error);
    cleanups.push(async () => {
      upstream.answer();
      await response;
    });
    await upstream.arrived;
    return { gateway, upstream, response };
  }

  // Was a defect: the gateway's close() has no grace (unlike drainable's 10 s): a request the API never answers holds the shutdown until reply-from's 300 s undici timeout, and the API behind it, whose own drain would cut the request at 10 s, is only closed after the gateway.
  // The grace is shutdownGraceMs (a short one here: the default's 10 s is pinned below without waiting it).
  it('gives a request that never ends at most its grace (shutdownGraceMs), then closes', async () => {
    const { gateway, response } = await stuckRequest({ shutdownGraceMs: 300 });
    const started = performance.now();
    let closed = false;
    const closing = gateway.close().then(() => {
      closed = true;
    });
    expect(closed).toBe(false);
    expect(await within(closing, 5_000)).toBe('settled');
    // Held while the grace ran: the request was not cut before it ended.
    expect(performance.now() - started).toBeGreaterThanOrEqual(290);
    // Cut, not answered: the client sees its connection end.
    expect(await response).toBeInstanceOf(Error);
  }, 10_000);

  it('gives 10 s of grace by default: the timer that cuts what still runs is set to 10 000 ms', async () => {
    const { gateway, upstream } = await stuckRequest();
    const timers = vi.spyOn(globalThis, 'setTimeout');
    try {
      const closing = gateway.close();
      const delays = timers.mock.calls.map((call) => call[1]);
      expect(delays).toContain(10_000);
      upstream.answer();
      expect(await within(closing, 5_000)).toBe('settled');
    } finally {
      timers.mockRestore();
    }
  }, 10_000);

  it('refuses a shutdownGraceMs that is not a whole number of milliseconds from 0 to 2^31 - 1', async () => {
    for (const shutdownGraceMs of [-1, 1.5, Number.NaN, 2 ** 31, '10s' as unknown as number]) {
      await expect(gatewayTo(9, { shutdownGraceMs })).rejects.toThrow(/shutdownGraceMs/);
    }
  });
});

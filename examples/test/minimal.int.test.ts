// The three minimal examples (issue 4): each is one idempotent POST /charges under 40 lines, and
// behaves as its curl line promises: 201 first, the same answer replayed for the retry (whitespace
// in the JSON body does not matter), 422 for the key reused with another amount, 400 without a key.
// Each server module is imported as `npm start` runs it (tsx src/server.ts), on a free port.
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { fileURLToPath } from 'node:url';
import { describe, expect, it, vi } from 'vitest';

const examples = ['express-minimal', 'fastify-minimal', 'koa-minimal'] as const;

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
  });
}

// Starts an example and resolves once it printed its address (it does so once it listens).
async function start(name: (typeof examples)[number]): Promise<string> {
  const port = await freePort();
  const listening = new Promise<void>((resolve) => {
    const log = vi.spyOn(console, 'log').mockImplementation((...args: unknown[]) => {
      if (String(args[0]).startsWith(`${name} on http://localhost:${port}`)) {
        log.mockRestore();
        resolve();
      }
    });
  });
  vi.stubEnv('PORT', String(port));
  await import(`../${name}/src/server.ts`);
  vi.unstubAllEnvs();
  await listening;
  return `http://127.0.0.1:${port}/charges`;
}

const charge = (url: string, key: string | undefined, body: string, customer: string | null = 'c1') =>
  fetch(url, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      ...(customer === null ? {} : { 'x-customer': customer }),
      ...(key ? { 'idempotency-key': key } : {}),
    },
    body,
  });

describe.each(examples)('examples/%s', (name) => {
  it('is under 40 lines', () => {
    const source = readFileSync(fileURLToPath(new URL(`../${name}/src/server.ts`, import.meta.url)), 'utf8');
    expect(source.trimEnd().split('\n').length).toBeLessThan(40);
  });

  it('runs POST /charges once per key: 201, the replay, 422 for another body, 400 without a key, 401 without a caller', async () => {
    const url = await start(name);
    const first = await charge(url, 'k1', '{"amount":100}');
    expect(first.status).toBe(201);
    expect(first.headers.get('location')).toBe('/charges/ch_1');
    expect(first.headers.get('idempotency-key')).toBe('k1');
    const body = await first.text();
    expect(JSON.parse(body)).toEqual({ id: 'ch_1', amount: 100 });

    const again = await charge(url, 'k1', '{ "amount": 100 }');
    expect(again.status).toBe(201);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(again.headers.get('location')).toBe('/charges/ch_1');
    expect(await again.text()).toBe(body);

    const other = await charge(url, 'k1', '{"amount":200}');
    expect(other.status).toBe(422);
    expect(other.headers.get('content-type')).toBe('application/problem+json');
    expect((await charge(url, undefined, '{"amount":100}')).status).toBe(400);
    // A new key is a new charge.
    expect(JSON.parse(await (await charge(url, 'k2', '{"amount":5}')).text())).toEqual({ id: 'ch_2', amount: 5 });
    // No demo caller, as no token: 401 before any key is looked at, and nothing runs.
    const stranger = await charge(url, 'k3', '{"amount":5}', null);
    expect(stranger.status).toBe(401);
    expect(await stranger.json()).toEqual({ error: 'send x-customer: <id>' });
    expect(JSON.parse(await (await charge(url, 'k4', '{"amount":6}')).text())).toEqual({ id: 'ch_3', amount: 6 });
  });
});

// The calibration row turns the #4 ratios into microseconds of added work, so its layer must cost
// what it says, where idem is mounted, and change nothing else about the route.
import { describe, expect, it } from 'vitest';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { spin } from '../servers/calibration-layer.mjs';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { startCharges } from '../servers/charges.mjs';

const body = JSON.stringify({ amount: 1000, currency: 'usd' });

describe('spin', () => {
  it('returns no sooner than the time asked', () => {
    for (const micros of [1, 50, 2_000]) {
      const started = process.hrtime.bigint();
      spin(micros);
      expect(Number(process.hrtime.bigint() - started) / 1000).toBeGreaterThanOrEqual(micros);
    }
  });
});

describe.each(['express', 'fastify', 'koa'])('calibration layer on %s', (framework) => {
  it('spins for its microseconds on every request and answers as the bare route does', async () => {
    // 30 ms per request: far above a request's own cost, so the lower bound below cannot pass by luck.
    const servers = {
      bare: await startCharges({ framework, variant: 'bare' }),
      calibration: await startCharges({ framework, variant: 'calibration', spinMicros: 30_000 }),
    };
    try {
      const post = async (port: number) => {
        const started = performance.now();
        const response = await fetch(`http://127.0.0.1:${port}/charges`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body,
        });
        const json = (await response.json()) as Record<string, unknown>;
        return { status: response.status, json, millis: performance.now() - started };
      };
      const bare = await post(servers.bare.port);
      const slowed = await post(servers.calibration.port);
      expect(slowed.millis).toBeGreaterThanOrEqual(30);
      expect(slowed.status).toBe(bare.status);
      expect(slowed.status).toBe(201);
      expect({ ...slowed.json, id: undefined }).toEqual({ ...bare.json, id: undefined });
    } finally {
      await servers.bare.close();
      await servers.calibration.close();
    }
  });
});

it('refuses a calibration server without its microseconds', async () => {
  await expect(startCharges({ framework: 'express', variant: 'calibration' })).rejects.toThrow(/spinMicros/);
  await expect(startCharges({ framework: 'koa', variant: 'calibration', spinMicros: 0 })).rejects.toThrow(/spinMicros/);
});

import net from 'node:net';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { postgresAnswers, redisAnswers, serviceAvailable } from '../src/services.js';

describe('service probes', () => {
  afterEach(() => {
    vi.unstubAllEnvs();
    vi.restoreAllMocks();
  });

  it('recognise the real Redis and PostgreSQL, and nothing else', async () => {
    expect(await redisAnswers()).toBe(true);
    expect(await postgresAnswers()).toBe(true);
    // Each protocol's probe fails against the other server.
    expect(
      await redisAnswers(process.env.DATABASE_URL?.replace(/^postgres(ql)?:/, 'redis:') ?? 'redis://127.0.0.1:5432'),
    ).toBe(false);
    expect(await postgresAnswers('postgres://127.0.0.1:6379/x')).toBe(false);
  });

  it('answer false, quickly, for a port where nobody listens or a server that stays silent', async () => {
    // Accepts connections and never answers; it keeps them to close them itself at the end.
    const held = new Set<net.Socket>();
    const silent = net.createServer((socket) => held.add(socket));
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', () => resolve()));
    const port = (silent.address() as net.AddressInfo).port;
    expect(await redisAnswers(`redis://127.0.0.1:${port}`, 200)).toBe(false);
    expect(await postgresAnswers(`postgres://127.0.0.1:${port}/x`, 200)).toBe(false);
    for (const socket of held) socket.destroy();
    await new Promise((resolve) => silent.close(resolve));
    expect(await redisAnswers(`redis://127.0.0.1:${port}`)).toBe(false);
  });

  it('skip loudly outside CI and fail under CI=true', () => {
    const warn = vi.spyOn(console, 'warn').mockImplementation(() => undefined);
    vi.stubEnv('CI', '');
    expect(serviceAvailable('Thing', true, 'tests')).toBe(true);
    expect(serviceAvailable('Thing', false, 'the thing tests')).toBe(false);
    expect(warn.mock.calls[0]?.[0]).toContain('the thing tests are SKIPPED');
    vi.stubEnv('CI', 'true');
    expect(() => serviceAvailable('Thing', false, 'the thing tests')).toThrow(/CI=true/);
  });
});

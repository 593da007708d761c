import { type ChildProcess, spawn } from 'node:child_process';
import { createServer, request as httpRequest, type IncomingMessage } from 'node:http';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { seededRandom } from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const root = fileURLToPath(new URL('../../..', import.meta.url));
const fixture = (name: string) => fileURLToPath(new URL(`./fixtures/${name}`, import.meta.url));
const children: ChildProcess[] = [];

function run(script: string, env: Record<string, string>): ChildProcess {
  const child = spawn(process.execPath, ['--import', 'tsx', fixture(script)], {
    cwd: root,
    env: { ...process.env, WEBHOOK_SECRET: SECRET, ...env },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  children.push(child);
  return child;
}

function firstLine(child: ChildProcess, pattern: RegExp): Promise<RegExpExecArray> {
  return new Promise((resolve, reject) => {
    let seen = '';
    child.stdout?.on('data', (chunk: Buffer) => {
      seen += chunk.toString();
      const match = pattern.exec(seen);
      if (match) resolve(match);
    });
    child.once('exit', (code) => {
      const match = pattern.exec(seen);
      if (match) resolve(match);
      else reject(new Error(`process exited (${code}) before printing ${pattern}`));
    });
  });
}

async function read(request: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of request) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

afterAll(() => {
  for (const child of children) child.kill('SIGKILL');
});

describe('end to end: sender and receiver processes behind a lossy network', () => {
  it('applies every event exactly once and the sender stops at the first acknowledgement it receives', async () => {
    const receiver = run('e2e-receiver.ts', {});
    const receiverPort = (await firstLine(receiver, /listening (\d+)/))[1];

    // The network: every request reaches the receiver, but a third of the answers are lost (the
    // connection is cut after the receiver replied), so the sender cannot tell and must retry.
    const random = seededRandom(2026);
    const forwarded = new Map<string, number>();
    const acknowledged = new Map<string, number>();
    let dropped = 0;
    let total = 0;
    const proxy = createServer(async (incoming, outgoing) => {
      const body = await read(incoming);
      const id = String(incoming.headers['webhook-id']);
      forwarded.set(id, (forwarded.get(id) ?? 0) + 1);
      const upstream = httpRequest(
        { host: '127.0.0.1', port: Number(receiverPort), method: 'POST', path: '/hooks', headers: incoming.headers },
        async (answer) => {
          const reply = await read(answer);
          total++;
          if (random() < 1 / 3) {
            dropped++;
            incoming.socket.destroy();
            return;
          }
          if (answer.statusCode === 200) acknowledged.set(id, (acknowledged.get(id) ?? 0) + 1);
          outgoing.writeHead(answer.statusCode ?? 502, answer.headers);
          outgoing.end(reply);
        },
      );
      upstream.end(body);
    });
    await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
    const proxyUrl = `http://127.0.0.1:${(proxy.address() as AddressInfo).port}/hooks`;

    try {
      const count = 60;
      const sender = run('e2e-sender.ts', { TARGET: proxyUrl, COUNT: String(count), SEED: '11' });
      const results = JSON.parse((await firstLine(sender, /^(\[.*\])$/m))[1] as string) as {
        id: string;
        outcome: string;
        attempts: string[];
      }[];

      expect(results).toHaveLength(count);
      expect(results.every((r) => r.outcome === 'delivered')).toBe(true);

      const stats = await (await fetch(`http://127.0.0.1:${receiverPort}/stats`)).json();
      expect(Object.keys(stats)).toHaveLength(count);
      expect(Object.values(stats).every((n) => n === 1)).toBe(true);

      for (const result of results) {
        // The sender made exactly as many attempts as reached the network, and stopped at the first
        // acknowledgement that got through: one per event, its last attempt.
        expect(forwarded.get(result.id)).toBe(result.attempts.length);
        expect(acknowledged.get(result.id)).toBe(1);
        expect(result.attempts.at(-1)).toBe('delivered');
        expect(result.attempts.slice(0, -1).every((a) => a === 'network-error')).toBe(true);
      }
      // The network really was lossy: about a third of the answers were lost, and retried.
      expect(dropped / total).toBeGreaterThan(0.2);
      expect(dropped / total).toBeLessThan(0.45);
      expect(results.some((r) => r.attempts.length >= 3)).toBe(true);
    } finally {
      await new Promise<void>((resolve) => {
        proxy.closeAllConnections();
        proxy.close(() => resolve());
      });
    }
  });
});

// docs/webhooks.md, "Endpoint URLs you did not choose (SSRF)": the recipe itself, run as printed.
// The block is read from the page, compiled, and run with its imports (node:dns, node:net, undici,
// @idem/webhooks), so the page's code is what is tested, not a copy of it. The page promises: "A
// refused attempt is a `network-error` with `error: 'EPRIVATEADDR'`, retried like any other until the
// horizon or `maxAttempts` dead-letters it, with no response kept", for a name that resolves to a
// private address (checked at connect time) and for an IP literal (never looked up, checked first).
// No test ran the recipe before this audit.
import * as dns from 'node:dns';
import { readFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import * as net from 'node:net';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import * as undici from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import * as webhooks from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';

/** The page's recipe, compiled and run: what it builds. */
function runRecipe(): { sender: webhooks.Sender; publicOnlyFetch: typeof fetch; isPrivate: (a: string) => boolean } {
  const page = readFileSync(fileURLToPath(new URL('../../../docs/webhooks.md', import.meta.url)), 'utf8');
  const section = page.slice(page.indexOf('**Endpoint URLs you did not choose (SSRF).**'));
  const block = /```ts\n([\s\S]*?)```/.exec(section)?.[1];
  if (block === undefined) throw new Error('docs/webhooks.md: no ts block after the SSRF paragraph');
  const js = ts.transpileModule(`${block}\nmodule.exports = { sender, publicOnlyFetch, isPrivate };`, {
    compilerOptions: { module: ts.ModuleKind.CommonJS, target: ts.ScriptTarget.ES2022 },
  }).outputText;
  const modules: Record<string, unknown> = {
    'node:dns': dns,
    'node:net': net,
    undici,
    '@idem/webhooks': webhooks,
  };
  const module = { exports: {} as Record<string, unknown> };
  const require = (name: string) => {
    if (!(name in modules)) throw new Error(`the recipe imports ${name}, which this test does not provide`);
    return modules[name];
  };
  // The recipe reads its secret from the environment.
  const process = { env: { WEBHOOK_SIGNING_SECRET: SECRET } };
  new Function('require', 'module', 'exports', 'process', js)(require, module, module.exports, process);
  return module.exports as ReturnType<typeof runRecipe>;
}

describe('docs/webhooks.md: the SSRF recipe refuses private addresses', () => {
  let server: Server;
  let port: number;
  let requests = 0;
  beforeAll(async () => {
    server = createServer((request, response) => {
      requests++;
      request.resume();
      response.end('internal secrets');
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    port = (server.address() as AddressInfo).port;
  });
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

  const recipe = runRecipe();
  const message = (host: string) => ({ url: `http://${host}:${port}/hooks`, id: 'evt_ssrf', body: '{}' });

  it.each([
    ['an IP literal', '127.0.0.1'],
    ['a decimal IP literal', '2130706433'],
    ['an IPv4-mapped IPv6 literal', '[::ffff:127.0.0.1]'],
    ['a name resolved at connect time', 'localhost'],
  ])(
    'Held: %s (%s) is a network-error with error EPRIVATEADDR, no response kept, no request made',
    async (_what, host) => {
      const before = requests;
      const attempt = await recipe.sender.attempt(message(host), 1);
      expect(attempt).toMatchObject({ result: 'network-error', error: 'EPRIVATEADDR' });
      expect(attempt.status).toBeUndefined();
      expect(attempt.responseBody).toBeUndefined();
      expect(requests).toBe(before);
    },
  );

  it('Held: a refused attempt is retried like any other until maxAttempts dead-letters it', async () => {
    const sender = webhooks.createSender({
      secret: SECRET,
      fetch: recipe.publicOnlyFetch,
      schedule: { maxAttempts: 3 },
      sleep: () => Promise.resolve(),
    });
    const result = await sender.send(message('localhost'));
    expect(result).toMatchObject({ outcome: 'dead-letter', reason: 'max-attempts' });
    expect(result.attempts.map((a) => a.error)).toEqual(['EPRIVATEADDR', 'EPRIVATEADDR', 'EPRIVATEADDR']);
  });

  it('Held: the block list leaves public addresses alone (the control)', () => {
    expect(recipe.isPrivate('93.184.216.34')).toBe(false);
    expect(recipe.isPrivate('2606:2800:220:1:248:1893:25c8:1946')).toBe(false);
    expect(recipe.isPrivate('169.254.169.254')).toBe(true);
    expect(recipe.isPrivate('::1')).toBe(true);
  });
});

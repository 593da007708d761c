// createCutProxy's arm() promise: a client that pools connections sends its next request on the
// armed connection, not on the keep-alive one it used before. That needs the client to have dropped
// its pooled connection by the time arm() resolves; a client that reused it would fail on a
// connection the proxy closed, and the cut under test would never happen.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { Agent, request as undiciRequest } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type CutProxy, createCutProxy } from '../src/cut-proxy.js';

let server: http.Server;
let proxy: CutProxy;

beforeAll(async () => {
  server = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => res.end('ok'));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  proxy = await createCutProxy((server.address() as AddressInfo).port);
});

afterAll(async () => {
  await proxy.close();
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
});

type Send = () => Promise<string>;

const clients: Record<string, () => { send: Send; close: () => Promise<unknown> }> = {
  'node:http keep-alive agent': () => {
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    const send: Send = () =>
      new Promise((resolve, reject) => {
        const req = http.request({ port: proxy.port, host: '127.0.0.1', method: 'POST', agent }, (res) => {
          let body = '';
          res.setEncoding('utf8');
          res.on('data', (chunk: string) => {
            body += chunk;
          });
          res.on('end', () => resolve(body));
          res.on('error', reject);
        });
        req.on('error', reject);
        req.end('hello');
      });
    return { send, close: async () => agent.destroy() };
  },
  'undici agent': () => {
    const agent = new Agent();
    const send: Send = async () => {
      const answer = await undiciRequest(`http://127.0.0.1:${proxy.port}/`, {
        method: 'POST',
        body: 'hello',
        dispatcher: agent,
      });
      return answer.body.text();
    };
    return { send, close: () => agent.close() };
  },
};

describe('createCutProxy arm() with a pooling client', () => {
  for (const [name, make] of Object.entries(clients)) {
    it(`${name}: each request after arm() is the cut one, 20 times in a row`, async () => {
      const client = make();
      try {
        expect(await client.send()).toBe('ok');
        for (let round = 0; round < 20; round++) {
          const cuts = proxy.cuts;
          // The previous request's connection is idle in the client's pool now.
          await proxy.arm('response', 0, 'reset');
          await expect(client.send(), `round ${round}`).rejects.toThrow();
          expect(proxy.cuts, `round ${round}: the request went on a pooled connection`).toBe(cuts + 1);
          expect(await client.send(), `round ${round}`).toBe('ok');
        }
      } finally {
        await client.close();
      }
    });
  }
});

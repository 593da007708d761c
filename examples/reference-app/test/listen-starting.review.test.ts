// listen() answers 503 starting_up until a handler is attached, a request Node's parser refuses too
// (its own clientError listener). Once use() attaches one, that listener is gone: a head that does
// not parse gets Node's own 400 again, never a 503 that says the component is still starting.
import { afterEach, describe, expect, it } from 'vitest';
import { type ListeningPort, listen } from '../src/listen.js';
import { sendBytes } from './hostile-send.js';

let port: ListeningPort | undefined;
afterEach(async () => {
  await port?.close();
  port = undefined;
});

const malformed = 'NOT A REQUEST\r\n\r\n';

describe('listen(): a request Node refuses, before and after a handler is attached', () => {
  it('is 503 starting_up before use(), and Node 400 after it, with the handler never called', async () => {
    port = await listen(0);
    const before = await sendBytes(port.url, malformed);
    expect(before.status).toBe(503);
    expect(JSON.parse(before.body)).toMatchObject({ code: 'starting_up' });
    let handled = 0;
    port.use((_req, res) => {
      handled += 1;
      res.end('ok');
    });
    const after = await sendBytes(port.url, malformed);
    expect(after.status).toBe(400);
    expect(after.body).not.toContain('starting_up');
    expect(handled).toBe(0);
    // And a good request reaches the handler.
    const good = await sendBytes(port.url, 'GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
    expect([good.status, good.body]).toEqual([200, 'ok']);
  });
});

// A window of replays must be replays: primeReplay completes the key once and proves that a second
// request with it is answered from the record, not executed again.
import { createServer, type Server } from 'node:http';
import { afterEach, describe, expect, it } from 'vitest';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { primeReplay } from '../lib/http-load.mjs';

let server: Server | undefined;
afterEach(() => new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve())));

// A POST /charges server: `remember` keeps each key's first answer; without it every request executes.
// `inFlightAnswers`: how many requests after the first still get 409, as from a layer that answers
// before it has stored.
async function start(options: { remember: boolean; status?: number; inFlightAnswers?: number }): Promise<string> {
  const answers = new Map<string, string>();
  let count = 0;
  let inFlight = options.inFlightAnswers ?? 0;
  server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const key = String(req.headers['idempotency-key']);
      if (answers.has(key) && inFlight > 0) {
        inFlight--;
        res.writeHead(409).end();
        return;
      }
      const body = (options.remember && answers.get(key)) || JSON.stringify({ id: `ch_${++count}` });
      answers.set(key, body);
      res.writeHead(options.status ?? 201, { 'content-type': 'application/json' }).end(body);
    });
  });
  await new Promise<void>((resolve) => server?.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  if (address === null || typeof address === 'string') throw new Error('no port');
  return `http://127.0.0.1:${address.port}/charges`;
}

describe('primeReplay', () => {
  it('resolves when the second request with the key gets the first answer back', async () => {
    await expect(primeReplay(await start({ remember: true }), 'k-1')).resolves.toBeUndefined();
  });

  it('throws when the second request executed again', async () => {
    await expect(primeReplay(await start({ remember: false }), 'k-1')).rejects.toThrow(/was not replayed/);
  });

  it('asks again while the key is still in flight (409), then takes the replay', async () => {
    const url = await start({ remember: true, inFlightAnswers: 2 });
    await expect(primeReplay(url, 'k-1')).resolves.toBeUndefined();
  });

  it('throws when the first execution did not create the charge', async () => {
    await expect(primeReplay(await start({ remember: true, status: 200 }), 'k-1')).rejects.toThrow(/answered 200/);
  });
});

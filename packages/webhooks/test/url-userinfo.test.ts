// A URL with a user name or password (`https://user:secret@receiver.test/hooks`) passes send()'s and
// add()'s check, but fetch (Node's and every WHATWG one) refuses to build a request from it, on every
// attempt: the message was retried until the horizon and dead-lettered with only `TypeError` to say
// why, where the docs promise a URL no attempt could send is a TypeError in the call that made it.
import { describe, expect, it } from 'vitest';
import { createOutbox, createSender } from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const url = 'https://user:s3cret@receiver.test/hooks';

describe('a URL with credentials in it', () => {
  it('the premise: the default fetch refuses it before any request goes out', async () => {
    const refused = await fetch(url, { method: 'POST' }).catch((error: unknown) => error);
    expect(refused).toBeInstanceOf(TypeError);
    expect(String((refused as Error).message)).toContain('credentials');
  });

  // Refused up front, never quoted: a custom fetch that would turn it into Basic auth (node-fetch 2)
  // gets the credentials in `headers` instead, and the outbox never stores a password.
  it('send() with the default fetch rejects with a TypeError that does not quote the password', async () => {
    const sender = createSender({ secret: SECRET, schedule: { maxAttempts: 1 } });
    const error = await sender.send({ url, id: 'evt_1', body: '{}' }).then(
      () => undefined,
      (caught: unknown) => caught,
    );
    expect(error).toBeInstanceOf(TypeError);
    expect(String((error as Error).message)).not.toContain('s3cret');
  });

  it('outbox.add() refuses it the same way (a user name alone too), before any statement', async () => {
    const outbox = createOutbox({ table: 'never_used' });
    const db = {
      query: () => {
        throw new Error('no statement expected');
      },
    };
    for (const spelt of [url, 'https://user@receiver.test/hooks', new URL(url)]) {
      const error = await outbox.add(db, { url: spelt, id: 'evt_1', body: '{}' }).catch((caught: unknown) => caught);
      expect(error).toBeInstanceOf(TypeError);
      expect(String((error as Error).message)).not.toContain('s3cret');
    }
  });
});

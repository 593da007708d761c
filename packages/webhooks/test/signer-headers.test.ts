// The signer's three headers (`webhook-id`, `webhook-timestamp`, `webhook-signature`) and the content
// type are the sender's own: every attempt sets them. Given in `headers`, they were replaced in
// silence, so a caller who wrote `'content-type': 'text/plain'` without `contentType` sent
// `application/json` and never knew. They are a `TypeError` where the headers are given, as any other
// header no attempt could send as written; the value is never quoted (it may be a credential).
import { describe, expect, it } from 'vitest';
import { recordingSender } from './support/recording-sender.js';

const message = { url: 'https://receiver.test/hooks', id: 'evt_1', body: '{"n":1}' };
const VALUE = 'secret-looking-value';

const refusal = async (run: () => unknown) => {
  try {
    await run();
  } catch (error) {
    return error as Error;
  }
  throw new Error('expected a TypeError');
};

describe("the signer's headers and the content type given in headers", () => {
  for (const name of ['webhook-id', 'Webhook-Timestamp', 'WEBHOOK-SIGNATURE']) {
    it(`send() refuses ${name} before any request, without quoting its value`, async () => {
      const { sender, sent } = recordingSender();
      const error = await refusal(() => sender.send({ ...message, headers: { [name]: VALUE } }));
      expect(error).toBeInstanceOf(TypeError);
      expect(error.message).toContain(name.toLowerCase());
      expect(error.message).not.toContain(VALUE);
      expect(sent).toHaveLength(0);
    });

    it(`createSender({ headers }) refuses ${name}`, async () => {
      const error = await refusal(() => recordingSender({ [name]: VALUE }));
      expect(error).toBeInstanceOf(TypeError);
      expect(error.message).not.toContain(VALUE);
    });
  }

  it('send() refuses a content-type in headers and points to contentType, with or without one', async () => {
    const { sender, sent } = recordingSender();
    for (const extra of [{}, { contentType: 'text/plain' }, { contentType: 'application/json' }]) {
      const error = await refusal(() =>
        sender.send({ ...message, ...extra, headers: { 'Content-Type': 'text/plain' } }),
      );
      expect(error).toBeInstanceOf(TypeError);
      expect(error.message).toContain('contentType');
      expect(error.message).not.toContain('text/plain');
    }
    expect(sent).toHaveLength(0);
  });

  it('createSender({ headers }) refuses a content-type', async () => {
    const error = await refusal(() => recordingSender({ 'content-type': 'application/json' }));
    expect(error).toBeInstanceOf(TypeError);
    expect(error.message).toContain('contentType');
  });

  it('another webhook-* name is the caller’s, and goes out as given', async () => {
    const { sender, sent } = recordingSender({ 'webhook-tenant': 'a' });
    const result = await sender.send({ ...message, contentType: 'text/plain', headers: { 'Webhook-Region': 'eu' } });
    expect(result.outcome).toBe('delivered');
    expect(sent[0]).toMatchObject({ 'webhook-tenant': 'a', 'webhook-region': 'eu', 'content-type': 'text/plain' });
  });

  // Was wrong: a content-length in headers was dropped in silence (fetch counts the body), while the
  // other names that never go out as given were refused. Refused too now, naming it.
  for (const name of ['content-length', 'Content-Length']) {
    it(`send() refuses ${name} before any request, naming it, without quoting its value`, async () => {
      const { sender, sent } = recordingSender();
      const error = await refusal(() => sender.send({ ...message, headers: { [name]: '7654321' } }));
      expect(error).toBeInstanceOf(TypeError);
      expect(error.message).toContain('content-length');
      expect(error.message).not.toContain('7654321');
      expect(sent).toHaveLength(0);
    });

    it(`createSender({ headers }) refuses ${name}, naming it`, async () => {
      const error = await refusal(() => recordingSender({ [name]: '7654321' }));
      expect(error).toBeInstanceOf(TypeError);
      expect(error.message).toContain('content-length');
      expect(error.message).not.toContain('7654321');
    });
  }

  // attempt() is the relay's path: a row an earlier version stored with such headers is still sent,
  // with the signer's headers and the row's content type, as before.
  it('attempt() still sends a stored message that holds them, with its own values', async () => {
    const { sender, sent } = recordingSender();
    const record = await sender.attempt(
      { ...message, headers: { 'Webhook-Id': 'other', 'Content-Type': 'text/plain', 'Content-Length': '3' } },
      1,
    );
    expect(record.result).toBe('delivered');
    expect(sent[0]).toMatchObject({ 'webhook-id': 'evt_1', 'content-type': 'application/json' });
    // Its content-length is still left to fetch, which counts the body.
    expect(Object.keys(sent[0] ?? {}).map((name) => name.toLowerCase())).not.toContain('content-length');
  });
});

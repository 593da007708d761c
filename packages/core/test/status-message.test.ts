// A reason phrase of the handler's own (`201 Created Fine`): checked like a header value, counted in
// the record's size, kept by the memory store, and written back by writeResponse over HTTP/1.1.
import { once } from 'node:events';
import { createServer, IncomingMessage, request, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Socket } from 'node:net';
import { describe, expect, it } from 'vitest';
import {
  assertStoredResponse,
  InvalidResponseError,
  memoryStore,
  ownReasonPhrase,
  type StoredResponse,
  storedResponseSize,
  writeResponse,
} from '../src/index.js';

const body = new Uint8Array([1, 2, 3]);

describe('StoredResponse.statusMessage', () => {
  it('is refused when Node could not write it: a line break, or not a string', () => {
    expect(() => assertStoredResponse({ status: 201, headers: {}, body, statusMessage: 'Created Fine' })).not.toThrow();
    expect(() => assertStoredResponse({ status: 201, headers: {}, body, statusMessage: 'a\r\nb' })).toThrow(
      InvalidResponseError,
    );
    expect(() => assertStoredResponse({ status: 201, headers: {}, body, statusMessage: 7 })).toThrow(
      InvalidResponseError,
    );
  });

  it('counts in the size as the member it is in the JSON of status and headers', () => {
    const plain: StoredResponse = { status: 201, headers: {}, body };
    expect(storedResponseSize({ ...plain, statusMessage: 'Fine' })).toBe(
      storedResponseSize(plain) + ',"m":"Fine"'.length,
    );
    expect(storedResponseSize({ ...plain, statusMessage: undefined })).toBe(storedResponseSize(plain));
  });

  it('is kept by memoryStore and given back; a response without one reads back without one', async () => {
    const store = memoryStore();
    for (const [id, response] of [
      ['a', { status: 201, headers: {}, body, statusMessage: 'Created Fine' }],
      ['b', { status: 201, headers: {}, body }],
    ] as const) {
      await store.claim({ id, token: 't', fingerprint: 'f', leaseMs: 1_000 });
      expect(await store.complete({ id, token: 't', response, retentionMs: 60_000 })).toBe(true);
    }
    const a = await store.get('a');
    const b = await store.get('b');
    expect(a?.state === 'completed' && a.response.statusMessage).toBe('Created Fine');
    expect(b?.state === 'completed' && 'statusMessage' in b.response).toBe(false);
  });

  it('goes out on the status line when writeResponse writes a response that has one', async () => {
    const server = createServer((req, res) => {
      writeResponse(res, {
        status: 201,
        headers: { 'content-type': 'text/plain' },
        body: Buffer.from('ok'),
        ...(req.url === '/own' ? { statusMessage: 'Created Fine' } : {}),
      });
    });
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    const { port } = server.address() as AddressInfo;
    const phraseOf = (path: string) =>
      new Promise<string | undefined>((resolve, reject) => {
        request({ port, host: '127.0.0.1', path }, (res) => {
          res.resume();
          resolve(res.statusMessage);
        })
          .on('error', reject)
          .end();
      });
    try {
      expect(await phraseOf('/own')).toBe('Created Fine');
      expect(await phraseOf('/default')).toBe('Created');
    } finally {
      server.close();
    }
  });
});

// What an adapter stores for a response the framework never wrote (a client gone): the phrase the
// head would have carried, when it is the handler's own.
describe('ownReasonPhrase', () => {
  const response = (statusMessage?: string) => {
    const res = new ServerResponse(new IncomingMessage(new Socket()));
    if (statusMessage !== undefined) res.statusMessage = statusMessage;
    return res;
  };

  it("is the handler's own phrase, and none for the status's default, an empty one or none set", () => {
    expect(ownReasonPhrase(response('Created Fine'), 201)).toBe('Created Fine');
    expect(ownReasonPhrase(response('Created'), 201)).toBeUndefined();
    expect(ownReasonPhrase(response(''), 201)).toBeUndefined();
    expect(ownReasonPhrase(response(), 201)).toBeUndefined();
    // The default of another status is the handler's choice for this one.
    expect(ownReasonPhrase(response('OK'), 201)).toBe('OK');
  });
});

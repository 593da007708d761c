// Audit of @idem/client on other fetch runtimes (Bun 1.4.5, Deno 2.9.6), reproduced here under Node
// with a `fetch` that behaves as theirs does. The probes that found these ran the built client on
// each runtime against a Node Express server with idempotency(): JSON, string, bytes, Blob, FormData,
// URLSearchParams and refused streams; 503 + Retry-After; attempt timeouts; redirects; AbortSignal;
// refused connections; a self-signed certificate. Everything else behaved as under Node.
import { createClient } from '@idem/client';
import { describe, expect, it } from 'vitest';
import { failure } from './support/failure.js';
import { fakeTime } from './support/fake-time.js';

interface Sent {
  headers: Headers;
  body: RequestInit['body'];
}

// A fetch that records what it was given and answers 201, or throws what `fail` makes.
function recordingFetch(fail?: () => unknown) {
  const sent: Sent[] = [];
  const fetch = async (_url: string, init: RequestInit): Promise<Response> => {
    sent.push({ headers: new Headers(init.headers), body: init.body });
    if (fail) throw fail();
    return new Response(null, { status: 201 });
  };
  return { sent, fetch };
}

function clientWith(fetch: (url: string, init: RequestInit) => Promise<Response>) {
  const time = fakeTime();
  return createClient({
    baseUrl: 'https://api.example',
    fetch,
    random: () => 0,
    sleep: time.sleep,
    now: time.now,
    retry: { maxAttempts: 3 },
  });
}

// What Deno's fetch (rustls) throws for a certificate it refuses: no `code` anywhere, only the
// message of the cause says it (self-signed, unknown issuer, expired, another host's name).
const denoCertificateError = (reason: string) =>
  new TypeError('fetch failed', {
    cause: new Error(
      `error sending request for url (https://api.example/charges): client error (Connect): invalid peer certificate: ${reason}`,
    ),
  });

describe('@idem/client on Bun and Deno', () => {
  // Was a defect: Deno's fetch reports a refused certificate without any `code` (its cause is a plain
  // Error whose message says "invalid peer certificate: UnknownIssuer"), so isCertificateError missed
  // it: a keyed POST to a host with a self-signed certificate was retried to attempts_exhausted
  // (three handshakes that could never pass) instead of ending at once with tls_failed, as it does
  // on Node and Bun (whose errors carry Node's codes, e.g. DEPTH_ZERO_SELF_SIGNED_CERT).
  it.each(['Other(OtherError(CaUsedAsEndEntity))', 'UnknownIssuer', 'Expired', 'NotValidForName'])(
    'a certificate Deno refuses (%s) ends with tls_failed after one attempt',
    async (reason) => {
      const { sent, fetch } = recordingFetch(() => denoCertificateError(reason));
      const error = await failure(clientWith(fetch).post('/charges', { amount: 1 }));
      expect(error.code).toBe('tls_failed');
      expect(sent).toHaveLength(1);
    },
  );

  it("another of Deno's connection errors stays a network error, and a keyed POST is retried", async () => {
    const { sent, fetch } = recordingFetch(
      () =>
        new TypeError('fetch failed', {
          cause: new Error(
            'error sending request for url (https://api.example/charges): client error (Connect): tcp connect error: Connection refused (os error 111)',
          ),
        }),
    );
    const error = await failure(clientWith(fetch).post('/charges', { amount: 1 }));
    expect(error.code).toBe('attempts_exhausted');
    expect(sent).toHaveLength(3);
  });

  // Was a defect: a string body went to fetch with no Content-Type, trusting fetch to add
  // `text/plain;charset=UTF-8` as the Fetch standard says. Bun's fetch adds none, so on Bun the
  // request had no Content-Type at all: express.text() and the like skip it, and the same call sent
  // from Node and from Bun were two different requests to a server that fingerprints the type.
  it('a string body carries text/plain;charset=UTF-8 whatever the fetch adds', async () => {
    const { sent, fetch } = recordingFetch();
    await clientWith(fetch).post('/notes', 'hello');
    expect(sent[0]?.headers.get('content-type')).toBe('text/plain;charset=UTF-8');
  });

  it("a string body keeps the caller's Content-Type", async () => {
    const { sent, fetch } = recordingFetch();
    await clientWith(fetch).post('/notes', '<a/>', { headers: { 'content-type': 'application/xml' } });
    expect(sent[0]?.headers.get('content-type')).toBe('application/xml');
  });

  it('a Blob without a type still goes without a Content-Type, as fetch sends it', async () => {
    const { sent, fetch } = recordingFetch();
    await clientWith(fetch).post('/files', new Blob(['x']));
    expect(sent[0]?.headers.has('content-type')).toBe(false);
  });
});

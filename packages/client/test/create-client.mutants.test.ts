import { describe, expect, it } from 'vitest';
import { failure } from './support/failure.js';
import { empty, json } from './support/fake-fetch.js';
import { scriptedClient } from './support/scripted-client.js';

// Tests written by a mutation-testing pass: each one kills a mutant of create-client.ts the other
// client tests let live (named in the test's comment).

const setup = scriptedClient;

const encoder = new TextEncoder();

/** A body that arrives in the given chunks, recording how many were pulled and whether it was cancelled. */
function chunkedBody(chunks: string[]) {
  const state = { pulled: 0, cancelled: false };
  const stream = new ReadableStream<Uint8Array>(
    {
      pull(controller) {
        const chunk = chunks[state.pulled++];
        if (chunk === undefined) controller.close();
        else controller.enqueue(encoder.encode(chunk));
      },
      cancel() {
        state.cancelled = true;
      },
    },
    { highWaterMark: 0 },
  );
  return { stream, state };
}

/** A body whose headers arrive but whose bytes never do. */
function stalledBody() {
  return new ReadableStream<Uint8Array>({ pull: () => new Promise(() => undefined) }, { highWaterMark: 0 });
}

describe('readCapped', () => {
  // Kills: chunks pushed only once, the single-chunk shortcut taken for any count, `at` not advanced.
  it('joins a body that arrives in several chunks, in order', async () => {
    const { stream } = chunkedBody(['{"a":', '"bc",', '"d":[1,', '2]}']);
    const { client } = setup([() => new Response(stream, { headers: { 'content-type': 'application/json' } })], {
      maxResponseBytes: 100,
    });
    expect((await client.get('/x')).body).toEqual({ a: 'bc', d: [1, 2] });
  });

  // Kills: the declared-length check removed (the body would be read, and cancelled only past the limit).
  it('refuses a declared Content-Length past the limit without reading a byte, and cancels the body', async () => {
    const { stream, state } = chunkedBody(Array.from({ length: 20 }, () => 'z'.repeat(10)));
    const { client } = setup([() => new Response(stream, { headers: { 'content-length': '200' } })], {
      maxResponseBytes: 50,
    });
    expect((await failure(client.get('/x'))).code).toBe('response_too_large');
    expect(state.pulled).toBe(0);
    expect(state.cancelled).toBe(true);
  });

  // Kills: reader.cancel() dropped when the streamed body runs past the limit.
  it('cancels a body that runs past the limit while streaming (no length declared)', async () => {
    const { stream, state } = chunkedBody(Array.from({ length: 20 }, () => 'z'.repeat(10)));
    const { client } = setup([() => new Response(stream)], { maxResponseBytes: 50 });
    expect((await failure(client.get('/x'))).code).toBe('response_too_large');
    expect(state.pulled).toBe(6);
    expect(state.cancelled).toBe(true);
  });

  // Kills: the content-encoding exemption dropped. A coded body's Content-Length counts the coded
  // bytes; the decoded ones can be fewer (incompressible data plus the coding's overhead).
  it('does not trust a declared length under a content coding: the decoded bytes are what count', async () => {
    const { client } = setup(
      [() => new Response('small', { headers: { 'content-length': '120', 'content-encoding': 'gzip' } })],
      { maxResponseBytes: 100 },
    );
    expect((await client.get('/x', { parse: 'text' })).body).toBe('small');
  });

  // Kills: the 16 MiB default changed (to 1 MiB here).
  it('defaults to 16 MiB: a 2 MiB body is read, a declared 16 MiB + 1 is refused', async () => {
    const twoMiB = new Uint8Array(2 * 2 ** 20);
    const { client } = setup([() => new Response(twoMiB)]);
    expect(((await client.get('/x', { parse: 'bytes' })).body as Uint8Array).byteLength).toBe(twoMiB.byteLength);
    const { client: other } = setup([
      () => new Response(stalledBody(), { headers: { 'content-length': String(16 * 2 ** 20 + 1) } }),
    ]);
    expect((await failure(other.get('/x'))).code).toBe('response_too_large');
  });

  // Kills: a request's own maxResponseBytes used unchecked.
  it("checks a request's own maxResponseBytes as it checks the client's", async () => {
    const { client, seen } = setup([json(200, {})]);
    for (const bad of [0, -1, 1.5, Number.NaN]) {
      await expect(client.get('/x', { maxResponseBytes: bad })).rejects.toThrow(TypeError);
    }
    expect(seen).toHaveLength(0);
  });
});

describe('dot segments', () => {
  // Kills: the query or the fragment left in the path searched for dot segments.
  it("looks for '..' in the path only, not in a query or fragment written into it", async () => {
    const { client, seen } = setup([json(200, {})]);
    await client.get('/files?path=a/../b');
    await client.get('/files#a/../b');
    expect(seen.map((r) => new URL(r.url).pathname)).toEqual(['/v1/files', '/v1/files']);
    expect(new URL(seen[0]?.url ?? '').searchParams.get('path')).toBe('a/../b');
  });
});

describe('what an error keeps of the last attempt', () => {
  // Kills: lastBody not reset when a later attempt's headers arrive (the error would pair the 201
  // with the 503's body).
  it("does not pair a later attempt's status with an earlier attempt's body", async () => {
    const { client } = setup(
      [
        json(503, { title: 'busy' }),
        () =>
          new Response(
            new ReadableStream({
              pull: (c) => c.error(new TypeError('terminated')),
            }),
            { status: 201 },
          ),
      ],
      { retry: { maxAttempts: 2 } },
    );
    const error = await failure(client.post('/charges', {}));
    expect([error.code, error.status, error.body]).toEqual(['attempts_exhausted', 201, undefined]);
  });

  // Kills: the aborted attempt's error (the caller's reason) no longer recorded on it.
  it("records the caller's reason as the aborted attempt's error", async () => {
    const controller = new AbortController();
    const reason = new Error('user left');
    const { client } = setup([
      (_request, signal) =>
        new Promise<Response>((_, reject) => {
          signal.addEventListener('abort', () => reject(signal.reason));
          controller.abort(reason);
        }),
    ]);
    const error = await failure(client.post('/charges', {}, { signal: controller.signal }));
    expect(error.code).toBe('aborted');
    expect(error.attempts[0]?.error).toBe(reason);
  });

  // Kills: the response dropped from an aborted attempt whose headers had arrived.
  it('keeps the status of a response whose body read the caller aborted', async () => {
    const controller = new AbortController();
    const { client } = setup([
      () => {
        queueMicrotask(() => controller.abort(new Error('user left')));
        return new Response(stalledBody(), { status: 201 });
      },
    ]);
    const error = await failure(client.post('/charges', {}, { signal: controller.signal }));
    expect([error.code, error.status, error.attempts[0]?.status]).toEqual(['aborted', 201, 201]);
  });

  // Kills: the response dropped from an attempt that timed out reading the body.
  it('keeps the status of a response whose body read timed out', async () => {
    const { client } = setup([() => new Response(stalledBody(), { status: 201 })], {
      retry: { maxAttempts: 1, timeout: 20 },
    });
    const error = await failure(client.post('/charges', {}));
    expect([error.attempts[0]?.outcome, error.status]).toEqual(['timeout', 201]);
  });
});

describe('echoed keys', () => {
  // Pins (with the hostile-server PUT test) that only a write adopts an echoed key.
  it('a DELETE keeps sending no key when the server echoes one', async () => {
    const { client, seen } = setup([empty(503, { 'idempotency-key': '"srv-1"' }), empty(204)]);
    await client.delete('/x');
    expect(seen.map((r) => r.headers.get('idempotency-key'))).toEqual([null, null]);
  });
});

// Audit (branch audit-atrest): what the stores really keep. docs/security.md, "What is stored, and for
// how long": an idempotency record holds "the request fingerprint (a SHA-256)", and "Not stored: the
// request body". The adapters and the webhook receiver hand the engine a hex SHA-256; these tests are
// about a direct caller of the engine, which the concepts page shows passing a fingerprint of its own.
import { createIdempotency, memoryStore } from '@idem/core';
import { expect, it } from 'vitest';

const request = { key: 'k-1', scope: 'user:alice', operation: 'POST /charges' };

// Was a defect: `begin()` kept a printable-ASCII fingerprint exactly as given (only other text was
// hashed). A caller that passed the request itself (`JSON.stringify(body)`, the natural first try)
// had the body written to every store, in progress and completed alike, for the lease plus a whole
// retention, whatever security.md says; and a fingerprint of any length was kept, with no cap
// (maxResponseBytes bounds only the response). Now anything but a hex SHA-256 is stored hashed. (No
// release holds the old form, so no record written before the change needs to be matched.)
it('a fingerprint that is the request body is not kept as the body, nor at any length', async () => {
  const store = memoryStore();
  const engine = createIdempotency({ store });
  const body = JSON.stringify({ card: '4111111111111111', note: 'x'.repeat(100_000) });
  const started = await engine.begin({ ...request, fingerprint: body });
  expect(started.kind).toBe('execute');
  if (started.kind !== 'execute') return;
  const record = await store.get(started.lease.id);
  expect(record?.fingerprint).not.toContain('4111111111111111');
  expect(record?.fingerprint.length).toBeLessThanOrEqual(71);
  // The same request is still recognised as such, another one refused.
  await engine.complete(started.lease, { status: 201, headers: {}, body: new Uint8Array() });
  expect((await engine.begin({ ...request, fingerprint: body })).kind).toBe('replay');
  expect(await engine.begin({ ...request, fingerprint: `${body} ` })).toMatchObject({
    kind: 'reject',
    error: { code: 'fingerprint_mismatch' },
  });
});

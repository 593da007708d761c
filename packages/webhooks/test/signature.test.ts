import { createHmac } from 'node:crypto';
import { Webhook } from 'standardwebhooks';
import { describe, expect, it } from 'vitest';
import {
  createSigner,
  createVerifier,
  generateSecret,
  isWebhookError,
  parseSecret,
  parseWebhookHeaders,
  sign,
  type Tolerance,
  verify,
  WebhookError,
} from '../src/index.js';

// The published Standard Webhooks v1 vector (every reference library embeds it) and the v1a vector
// from svix-server's test_asymmetric_key_signing (the spec's example v1a header).
const V1_SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const VECTOR_ID = 'msg_p5jXN8AQM9LWM0D4loKWxJek';
const VECTOR_TS = 1614265330;
const VECTOR_BODY = '{"test": 2432232314}';
const V1_SIGNATURE = 'v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=';
const V1A_PRIVATE = 'whsk_6Xb/dCcHpPea21PS1N9VY/NZW723CEc77N4rJCubMbfVKIDij2HKpMKkioLlX0dRqSKJp4AJ6p9lMicMFs6Kvg==';
const V1A_PUBLIC = 'whpk_1SiA4o9hyqTCpIqC5V9HUakiiaeACeqfZTInDBbOir4=';
const V1A_SIGNATURE = 'v1a,hnO3f9T8Ytu9HwrXslvumlUpqtNVqkhqw/enGzPCXe5BdqzCInXqYXFymVJaA7AZdpXwVLPo3mNl8EM+m7TBAg==';

const atVector = () => VECTOR_TS * 1000;
const vectorHeaders = (signature: string, overrides: Record<string, string> = {}) => ({
  'webhook-id': VECTOR_ID,
  'webhook-timestamp': String(VECTOR_TS),
  'webhook-signature': signature,
  ...overrides,
});
const codeOf = (result: ReturnType<typeof verify>) => (result.ok ? 'ok' : result.error.code);

describe('published test vectors', () => {
  it('signs the v1 vector byte for byte', () => {
    const headers = sign({ secret: V1_SECRET, id: VECTOR_ID, body: VECTOR_BODY, timestamp: VECTOR_TS });
    expect(headers).toEqual(vectorHeaders(V1_SIGNATURE));
  });

  it('verifies the v1 vector', () => {
    const result = verify({
      secret: V1_SECRET,
      now: atVector,
      headers: vectorHeaders(V1_SIGNATURE),
      body: VECTOR_BODY,
    });
    expect(result).toMatchObject({ ok: true, webhook: { id: VECTOR_ID, timestamp: VECTOR_TS, version: 'v1' } });
  });

  it('signs the v1a vector with the whsk_ key and verifies it with the whpk_ key (case 18)', () => {
    const headers = sign({ secret: V1A_PRIVATE, id: VECTOR_ID, body: VECTOR_BODY, timestamp: VECTOR_TS });
    expect(headers['webhook-signature']).toBe(V1A_SIGNATURE);
    const result = verify({
      secret: V1A_PUBLIC,
      now: atVector,
      headers: vectorHeaders(V1A_SIGNATURE),
      body: VECTOR_BODY,
    });
    expect(result).toMatchObject({ ok: true, webhook: { version: 'v1a' } });
  });

  it('rejects the v1a vector under another trusted key, and ignores keys offered by the request (case 18)', () => {
    const other = generateSecret('v1a');
    if (other.version !== 'v1a') throw new Error('expected a v1a pair');
    const headers = vectorHeaders(V1A_SIGNATURE, { 'webhook-public-key': V1A_PUBLIC, 'x-public-key': V1A_PUBLIC });
    expect(codeOf(verify({ secret: other.publicKey, now: atVector, headers, body: VECTOR_BODY }))).toBe(
      'signature_mismatch',
    );
  });
});

describe('interop with the standardwebhooks package', () => {
  const secret = generateSecret('v1');
  if (secret.version !== 'v1') throw new Error('expected v1');
  const body = Buffer.from('{"type":"payment.succeeded","data":{"amount":4200,"note":"caf\u00e9 \u{1F600}"}}');

  it('verifies what standardwebhooks signs', () => {
    const theirs = new Webhook(secret.secret);
    const now = new Date();
    const signature = theirs.sign('evt_interop_1', now, body);
    const headers = {
      'webhook-id': 'evt_interop_1',
      'webhook-timestamp': String(Math.floor(now.getTime() / 1000)),
      'webhook-signature': signature,
    };
    expect(verify({ secret: secret.secret, headers, body })).toMatchObject({ ok: true });
  });

  it('produces signatures standardwebhooks accepts, with rotation lists too', () => {
    const retired = generateSecret('v1');
    if (retired.version !== 'v1') throw new Error('expected v1');
    const headers = sign({ secret: [retired.secret, secret.secret], id: 'evt_interop_2', body, timestamp: new Date() });
    expect(headers['webhook-signature'].split(' ')).toHaveLength(2);
    const parsed = new Webhook(secret.secret).verify(body, { ...headers });
    expect(parsed).toEqual(JSON.parse(body.toString('utf8')));
  });

  it('standardwebhooks skips our v1a entry and still accepts the v1 one next to it', () => {
    const pair = generateSecret('v1a');
    if (pair.version !== 'v1a') throw new Error('expected v1a');
    const headers = sign({
      secret: [pair.privateKey, secret.secret],
      id: 'evt_interop_3',
      body,
      timestamp: new Date(),
    });
    expect(() => new Webhook(secret.secret).verify(body, { ...headers })).not.toThrow();
  });
});

describe('tamper and replay (cases 12, 14, 15)', () => {
  const now = () => VECTOR_TS * 1000;

  it('refuses a changed id or a timestamp moved by one second', () => {
    expect(
      codeOf(
        verify({
          secret: V1_SECRET,
          now,
          headers: vectorHeaders(V1_SIGNATURE, { 'webhook-id': 'msg_other' }),
          body: VECTOR_BODY,
        }),
      ),
    ).toBe('signature_mismatch');
    const moved = vectorHeaders(V1_SIGNATURE, { 'webhook-timestamp': String(VECTOR_TS + 1) });
    expect(codeOf(verify({ secret: V1_SECRET, now, headers: moved, body: VECTOR_BODY }))).toBe('signature_mismatch');
  });

  it('verifies over the timestamp exactly as the header wrote it', () => {
    // A zero-padded timestamp is a valid header; the signature covers its text, not the number.
    const padded = `0${VECTOR_TS}`;
    const key = Buffer.from(V1_SECRET.slice('whsec_'.length), 'base64');
    const mac = createHmac('sha256', key).update(`${VECTOR_ID}.${padded}.${VECTOR_BODY}`).digest('base64');
    const headers = vectorHeaders(`v1,${mac}`, { 'webhook-timestamp': padded });
    expect(codeOf(verify({ secret: V1_SECRET, now, headers, body: VECTOR_BODY }))).toBe('ok');
    const renumbered = vectorHeaders(V1_SIGNATURE, { 'webhook-timestamp': padded });
    expect(codeOf(verify({ secret: V1_SECRET, now, headers: renumbered, body: VECTOR_BODY }))).toBe(
      'signature_mismatch',
    );
  });

  it('refuses to sign with a negative or fractional timestamp', () => {
    for (const timestamp of [-1, 1.5, new Date(-1000)]) {
      expect(() => sign({ secret: V1_SECRET, id: VECTOR_ID, body: VECTOR_BODY, timestamp })).toThrow(TypeError);
    }
  });

  it('refuses one flipped body byte', () => {
    const body = Buffer.from(VECTOR_BODY);
    body[3] = (body[3] as number) ^ 1;
    expect(codeOf(verify({ secret: V1_SECRET, now, headers: vectorHeaders(V1_SIGNATURE), body }))).toBe(
      'signature_mismatch',
    );
  });

  it('accepts 60 s later, refuses at +301 s as too old and at -301 s as too new', () => {
    const at = (offset: number) => () => VECTOR_TS * 1000 + offset;
    const check = (offset: number) =>
      codeOf(verify({ secret: V1_SECRET, now: at(offset), headers: vectorHeaders(V1_SIGNATURE), body: VECTOR_BODY }));
    expect(check(60_000)).toBe('ok');
    expect(check(300_000)).toBe('ok');
    expect(check(301_000)).toBe('timestamp_too_old');
    expect(check(-300_000)).toBe('ok');
    expect(check(-301_000)).toBe('timestamp_too_new');
  });

  it('takes a configurable tolerance, per side', () => {
    const verifier = createVerifier({
      secret: V1_SECRET,
      tolerance: { past: '10m', future: '30s' },
      now: () => VECTOR_TS * 1000 - 31_000,
    });
    expect(codeOf(verifier.verify({ headers: vectorHeaders(V1_SIGNATURE), body: VECTOR_BODY }))).toBe(
      'timestamp_too_new',
    );
    const late = createVerifier({
      secret: V1_SECRET,
      tolerance: { past: '10m', future: '30s' },
      now: () => VECTOR_TS * 1000 + 599_000,
    });
    expect(codeOf(late.verify({ headers: vectorHeaders(V1_SIGNATURE), body: VECTOR_BODY }))).toBe('ok');
    expect(late.tolerance).toEqual({ pastMs: 600_000, futureMs: 30_000 });
  });

  it('refuses a tolerance under one second at construction: timestamps are whole seconds', () => {
    const tolerances: Tolerance[] = [0, 999, '500ms', '0s', { past: '5m', future: 0 }, { past: '0.5s', future: '5m' }];
    for (const tolerance of tolerances) {
      expect(() => createVerifier({ secret: V1_SECRET, tolerance })).toThrow(TypeError);
      expect(() =>
        verify({ secret: V1_SECRET, tolerance, headers: vectorHeaders(V1_SIGNATURE), body: VECTOR_BODY }),
      ).toThrow(/tolerance.*at least 1s/);
    }
    expect(() => createVerifier({ secret: V1_SECRET, tolerance: { past: '5m', future: 0 } })).toThrow(
      /tolerance\.future/,
    );
    // One second is the smallest window, and it passes a delivery signed this second, 999 ms later.
    const tight = createVerifier({ secret: V1_SECRET, tolerance: '1s', now: () => VECTOR_TS * 1000 + 999 });
    expect(codeOf(tight.verify({ headers: vectorHeaders(V1_SIGNATURE), body: VECTOR_BODY }))).toBe('ok');
  });
});

describe('strict headers (case 16)', () => {
  it.each(['1700000000abc', ' 1700000000', '1.7e9', '', '-5', '1614265330.9', '+1614265330'])(
    'refuses timestamp %j',
    (timestamp) => {
      const result = verify({
        secret: V1_SECRET,
        now: atVector,
        headers: vectorHeaders(V1_SIGNATURE, { 'webhook-timestamp': timestamp }),
        body: VECTOR_BODY,
      });
      expect(codeOf(result)).toBe('header_invalid');
    },
  );

  it('reports missing headers by name', () => {
    const result = verify({
      secret: V1_SECRET,
      now: atVector,
      headers: { 'webhook-id': VECTOR_ID },
      body: VECTOR_BODY,
    });
    expect(result.ok).toBe(false);
    if (!result.ok) {
      expect(result.error.code).toBe('headers_missing');
      expect(result.error.details.missing).toBe('webhook-timestamp,webhook-signature');
    }
  });

  it('refuses ids with dots, spaces or control characters, and duplicated field lines', () => {
    for (const id of ['msg.1', 'msg 1', 'msg\u00001', 'x'.repeat(257)]) {
      expect(
        codeOf(
          verify({
            secret: V1_SECRET,
            now: atVector,
            headers: vectorHeaders(V1_SIGNATURE, { 'webhook-id': id }),
            body: VECTOR_BODY,
          }),
        ),
      ).toBe('header_invalid');
    }
    const doubled = { ...vectorHeaders(V1_SIGNATURE), 'webhook-timestamp': [String(VECTOR_TS), String(VECTOR_TS)] };
    expect(codeOf(verify({ secret: V1_SECRET, now: atVector, headers: doubled, body: VECTOR_BODY }))).toBe(
      'header_invalid',
    );
  });

  it('refuses malformed signature lists', () => {
    for (const signature of [
      '',
      'v1',
      'v1,',
      'v1,abc,def',
      'v1,**',
      `${V1_SIGNATURE}, ${V1_SIGNATURE}`,
      Array(33).fill(V1_SIGNATURE).join(' '),
    ]) {
      expect(
        codeOf(verify({ secret: V1_SECRET, now: atVector, headers: vectorHeaders(signature), body: VECTOR_BODY })),
      ).toBe('header_invalid');
    }
  });

  it('reads fetch Headers and mixed-case header objects', () => {
    const headers = new Headers(vectorHeaders(V1_SIGNATURE));
    expect(codeOf(verify({ secret: V1_SECRET, now: atVector, headers, body: VECTOR_BODY }))).toBe('ok');
    const mixed = {
      'Webhook-Id': VECTOR_ID,
      'WEBHOOK-TIMESTAMP': String(VECTOR_TS),
      'Webhook-Signature': V1_SIGNATURE,
    };
    expect(codeOf(verify({ secret: V1_SECRET, now: atVector, headers: mixed, body: VECTOR_BODY }))).toBe('ok');
    expect(parseWebhookHeaders(mixed).ok).toBe(true);
  });
});

describe('rotation (case 17)', () => {
  const bad = 'v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=';
  const check = (signature: string) =>
    codeOf(verify({ secret: V1_SECRET, now: atVector, headers: vectorHeaders(signature), body: VECTOR_BODY }));

  it('accepts when any entry matches and skips unknown versions', () => {
    expect(check(`${bad} ${V1_SIGNATURE}`)).toBe('ok');
    expect(check(`v2,Zm9v ${V1_SIGNATURE}`)).toBe('ok');
  });

  it('skips an entry of an unknown version whatever it holds, and stays strict about v1 and v1a', () => {
    // Standard Webhooks: a receiver tries the versions it knows. A future scheme's entry, in a form we
    // cannot foresee, must not make a valid v1 entry beside it unreadable.
    for (const unknown of ['v9=%%%', 'v2,%%%', 'v2,a,b', 'V1,Zm9v', 't=1700000000', ';', ',x']) {
      expect(check(`${unknown} ${V1_SIGNATURE}`)).toBe('ok');
      expect(check(`${V1_SIGNATURE} ${unknown}`)).toBe('ok');
      expect(check(unknown)).toBe('signature_unsupported');
    }
    expect(check(`v1,%%% ${V1_SIGNATURE}`)).toBe('header_invalid');
    expect(check(`v1a,%%% ${V1_SIGNATURE}`)).toBe('header_invalid');
    // ", " is how Node and fetch join two field lines; no single header holds it.
    expect(check(`v2,whatever, ${V1_SIGNATURE}`)).toBe('header_invalid');
    expect(check(`, ${V1_SIGNATURE}`)).toBe('header_invalid');
  });

  it('refuses a lone bad entry, and says so distinctly when no entry has a usable version', () => {
    expect(check(bad)).toBe('signature_mismatch');
    expect(check('v2,Zm9v')).toBe('signature_unsupported');
    expect(check(V1A_SIGNATURE)).toBe('signature_unsupported');
  });

  it('checks an entry only against keys of its own version: an HMAC labelled v1a does not pass', () => {
    const relabelled = `v1a,${V1_SIGNATURE.slice('v1,'.length)}`;
    const result = verify({
      secret: [V1_SECRET, V1A_PUBLIC],
      now: atVector,
      headers: vectorHeaders(relabelled),
      body: VECTOR_BODY,
    });
    expect(codeOf(result)).toBe('signature_mismatch');
  });

  it('accepts with any of several trusted secrets', () => {
    const fresh = generateSecret('v1');
    if (fresh.version !== 'v1') throw new Error('expected v1');
    const result = verify({
      secret: [fresh.secret, V1A_PUBLIC, V1_SECRET],
      now: atVector,
      headers: vectorHeaders(V1_SIGNATURE),
      body: VECTOR_BODY,
    });
    expect(codeOf(result)).toBe('ok');
  });
});

describe('secret hygiene (case 19)', () => {
  const codeThrown = (fn: () => unknown) => {
    try {
      fn();
    } catch (error) {
      return isWebhookError(error) ? error.code : 'other';
    }
    return 'none';
  };

  it('throws secret_invalid at construction for empty, bare-prefix, short or non-base64 secrets', () => {
    for (const secret of ['', 'whsec_', 'whsec_c2hvcnQ=', 'whsec_not base64!', 'whsk_', 'whpk_AAAA', []]) {
      expect(codeThrown(() => createVerifier({ secret: secret as string }))).toBe('secret_invalid');
    }
  });

  it('strips only the whole whsec_ prefix: a bare base64 secret that starts with "whsec" is all key', () => {
    const secret = 'whsecAAAAAAAAAAAAAAAAAAAAAAAAAAA';
    const headers = sign({ secret, id: VECTOR_ID, body: VECTOR_BODY, timestamp: VECTOR_TS });
    const key = new Uint8Array(Buffer.from(secret, 'base64'));
    expect(codeOf(verify({ secret: key, now: atVector, headers, body: VECTOR_BODY }))).toBe('ok');
  });

  it('refuses a long secret that is not base64 instead of decoding what it can of it', () => {
    for (const secret of [
      'whsec_this-is-a-passphrase-not-base64-at-all',
      'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw!!!!',
      'MfKQ9r8GKYqrTwjU PD8ILPZIo2LaLaSw',
    ]) {
      expect(
        codeThrown(() => createVerifier({ secret })),
        secret,
      ).toBe('secret_invalid');
    }
  });

  it('holds key sizes exactly: a v1 secret of 16 bytes or more, a whsk_ key of 32 or 64 bytes', () => {
    expect(codeThrown(() => createVerifier({ secret: new Uint8Array(15).fill(7) }))).toBe('secret_invalid');
    expect(codeThrown(() => createVerifier({ secret: new Uint8Array(16).fill(7) }))).toBe('none');
    expect(codeThrown(() => createVerifier({ secret: `whsec_${Buffer.alloc(15, 7).toString('base64')}` }))).toBe(
      'secret_invalid',
    );
    const seed = Buffer.from(V1A_PRIVATE.slice(5), 'base64').subarray(0, 32);
    expect(codeThrown(() => createSigner({ secret: `whsk_${seed.toString('base64')}` }))).toBe('none');
    for (const size of [31, 33, 48, 65]) {
      const bytes = Buffer.alloc(size, 1);
      seed.copy(bytes, 0, 0, Math.min(32, size));
      expect(
        codeThrown(() => createSigner({ secret: `whsk_${bytes.toString('base64')}` })),
        String(size),
      ).toBe('secret_invalid');
    }
  });

  it('names the whitespace problem for a secret with a trailing newline', () => {
    try {
      createVerifier({ secret: `${V1_SECRET}\n` });
      expect.unreachable();
    } catch (error) {
      expect(error).toBeInstanceOf(WebhookError);
      expect((error as WebhookError).code).toBe('secret_invalid');
      expect((error as WebhookError).message).toMatch(/whitespace/);
    }
  });

  it('refuses to sign with a public key and to load a whsk_ key whose halves disagree', () => {
    expect(codeThrown(() => createSigner({ secret: V1A_PUBLIC }))).toBe('secret_invalid');
    const raw = Buffer.from(V1A_PRIVATE.slice(5), 'base64');
    raw[40] = (raw[40] as number) ^ 1;
    expect(codeThrown(() => parseSecret(`whsk_${raw.toString('base64')}`))).toBe('secret_invalid');
  });
});

describe('constant-time comparison (case 20)', () => {
  it('treats a wrong-length v1 or v1a signature as a mismatch, without throwing', () => {
    const v1 = parseSecret(V1_SECRET);
    expect(v1.verify(Buffer.from('x'), Buffer.alloc(31))).toBe(false);
    expect(v1.verify(Buffer.from('x'), Buffer.alloc(0))).toBe(false);
    const v1a = parseSecret(V1A_PUBLIC);
    expect(v1a.verify(Buffer.from('x'), Buffer.alloc(63))).toBe(false);
    expect(
      codeOf(verify({ secret: V1_SECRET, now: atVector, headers: vectorHeaders('v1,AAAA'), body: VECTOR_BODY })),
    ).toBe('signature_mismatch');
  });
});

describe('raw bytes (cases 21, 24, 25, 26)', () => {
  const signer = createSigner({ secret: V1_SECRET });
  const verifier = createVerifier({ secret: V1_SECRET, now: atVector });

  it('throws raw_body_required for a parsed object, and refuses a re-serialised body as a mismatch', () => {
    const body = '{"b": 1,  "a": [1, 2]}';
    const headers = signer.sign({ id: 'evt_1', body, timestamp: VECTOR_TS });
    try {
      verifier.verify({ headers, body: JSON.parse(body) });
      expect.unreachable();
    } catch (error) {
      expect(isWebhookError(error) && error.code).toBe('raw_body_required');
      expect((error as WebhookError).status).toBe(500);
    }
    expect(codeOf(verifier.verify({ headers, body: JSON.stringify(JSON.parse(body)) }))).toBe('signature_mismatch');
    expect(() => verifier.verify({ headers, body: undefined })).toThrow(/raw request body/);
  });

  it('verifies multi-byte text over its UTF-8 bytes, and refuses the same text decoded as latin1', () => {
    const body = Buffer.from('{"name":"Zoë 😀 Ωmega"}', 'utf8');
    const headers = signer.sign({ id: 'evt_2', body, timestamp: VECTOR_TS });
    expect(codeOf(verifier.verify({ headers, body }))).toBe('ok');
    expect(codeOf(verifier.verify({ headers, body: body.toString('utf8') }))).toBe('ok');
    expect(codeOf(verifier.verify({ headers, body: body.toString('latin1') }))).toBe('signature_mismatch');
  });

  it('keeps invalid UTF-8 bytes distinct: a signature over 0xff does not verify 0xfe', () => {
    const signed = Buffer.from([0x7b, 0xff, 0x7d]);
    const headers = signer.sign({ id: 'evt_3', body: signed, timestamp: VECTOR_TS });
    expect(codeOf(verifier.verify({ headers, body: signed }))).toBe('ok');
    expect(codeOf(verifier.verify({ headers, body: Buffer.from([0x7b, 0xfe, 0x7d]) }))).toBe('signature_mismatch');
  });

  it('refuses a body stripped of its trailing newline or wrapped in base64, reporting the length', () => {
    const body = Buffer.from('{"ok":true}\n');
    const headers = signer.sign({ id: 'evt_4', body, timestamp: VECTOR_TS });
    const stripped = verifier.verify({ headers, body: body.subarray(0, body.length - 1) });
    expect(stripped.ok).toBe(false);
    if (!stripped.ok) expect(stripped.error.details.bodyBytes).toBe(body.length - 1);
    expect(codeOf(verifier.verify({ headers, body: body.toString('base64') }))).toBe('signature_mismatch');
  });

  it('accepts Uint8Array views and ArrayBuffers over the same bytes', () => {
    const backing = new Uint8Array([0, 0, 0x61, 0x62, 0x63, 0]);
    const view = backing.subarray(2, 5);
    const headers = signer.sign({ id: 'evt_5', body: 'abc', timestamp: VECTOR_TS });
    expect(codeOf(verifier.verify({ headers, body: view }))).toBe('ok');
    expect(codeOf(verifier.verify({ headers, body: view.slice().buffer }))).toBe('ok');
  });
});

describe('problem bodies', () => {
  it('have a stable type per code and no secret material', () => {
    const result = verify({ secret: V1_SECRET, now: atVector, headers: vectorHeaders('v1,AAAA'), body: VECTOR_BODY });
    if (result.ok) throw new Error('expected a failure');
    const problem = result.error.toProblem();
    expect(problem).toMatchObject({
      type: 'https://idem.dev/problems/signature-mismatch',
      status: 400,
      code: 'signature_mismatch',
      retryable: false,
    });
    expect(JSON.stringify(problem)).not.toContain('MfKQ9r8');
    expect(JSON.stringify(problem)).not.toContain(VECTOR_ID);
  });
});

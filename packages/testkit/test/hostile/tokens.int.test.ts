// Hostile bearer tokens against the guard glue of Express, Fastify and Koa: the attack table of
// research/jwt-guard-anchors.md section 2 that can travel in one request, plus fast-check fuzzing of
// segments, sizes and signed-but-wrong headers and claims. Each is refused with 401 (or 400
// invalid_request, or Node's 431 for an oversized header) and an RFC 6750 challenge, identically on
// the three adapters, within a bounded time; the handler never runs. A well-formed token gets in,
// so a guard that refused everything would fail here too.
import { createHmac } from 'node:crypto';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type RawAnswer, rawRequest, sendRaw } from './raw-http.js';
import { AUDIENCE, type HostileServer, ISSUER, JWT_SECRET, startAll } from './servers.js';

const limitMs = 5000;
let servers: HostileServer[];
let tried = 0;

beforeAll(async () => {
  servers = await startAll();
});
afterAll(async () => {
  await Promise.all(servers.map((server) => server.close()));
  console.info(`[figures] hostile tokens ${JSON.stringify({ inputs: tried, adapters: servers.length })}`);
});

const b64 = (value: string | Buffer) => Buffer.from(value).toString('base64url');
const hmac = (input: string, key: string = JWT_SECRET) => createHmac('sha256', key).update(input).digest('base64url');

/** Signs any header and payload text with the issuer's real secret: only the content is wrong. */
function signed(header: unknown, payload: unknown, key?: string): string {
  const head = `${b64(typeof header === 'string' ? header : JSON.stringify(header))}.${b64(typeof payload === 'string' ? payload : JSON.stringify(payload))}`;
  return `${head}.${hmac(head, key)}`;
}

const now = () => Math.floor(Date.now() / 1000);
const goodClaims = () => ({
  iss: ISSUER,
  aud: AUDIENCE,
  sub: 'user-1',
  iat: now(),
  exp: now() + 300,
  client_id: 'app-1',
});
const goodHeader = { alg: 'HS256', typ: 'at+jwt' };

async function present(authorization: Array<string | Buffer>): Promise<RawAnswer[]> {
  tried++;
  const request = rawRequest({
    path: '/secure',
    headers: authorization.map((value) => [
      'Authorization',
      typeof value === 'string' ? Buffer.from(value, 'latin1') : value,
    ]),
  });
  return Promise.all(servers.map((server) => sendRaw(server.port, request, limitMs)));
}

function refused(answers: RawAnswer[], label: string, allowed: readonly number[] = [401]) {
  for (const [i, answer] of answers.entries()) {
    const where = `${servers[i]!.name}: ${label}`;
    expect(answer.timedOut, where).toBe(false);
    expect(answer.ms, where).toBeLessThan(limitMs);
    expect(allowed, `${where} got ${answer.status}`).toContain(answer.status);
    if (answer.status === 401 || answer.status === 400) {
      expect(answer.headers['www-authenticate'], where).toMatch(/^Bearer realm="[^"]*"/);
      // Nothing of the token is reflected into the challenge (RFC 6750 section 3 charset).
      expect(answer.headers['www-authenticate'], where).not.toMatch(/[\r\n]/);
      expect(answer.headers['content-type'], where).toMatch(/^application\/problem\+json/);
    }
  }
  expect(new Set(answers.map((a) => a.status)).size, `${label}: same status on every adapter`).toBe(1);
}

describe('hostile bearer tokens', () => {
  it('a valid token gets in (the control), on every adapter', async () => {
    const before = servers.map((s) => s.runs.secure);
    const answers = await present([`Bearer ${signed(goodHeader, goodClaims())}`]);
    expect(answers.map((a) => a.status)).toEqual([201, 201, 201]);
    expect(servers.map((s) => s.runs.secure)).toEqual(before.map((n) => n + 1));
  });

  it('the attack table: each row refused, the handler never runs', async () => {
    const before = servers.map((s) => s.runs.secure);
    const valid = signed(goodHeader, goodClaims());
    const [h, p] = valid.split('.') as [string, string, string];
    const rows: Array<[string, Array<string | Buffer>, readonly number[]]> = [
      ['1 no header', [], [401]],
      ['2 Basic scheme', [`Basic ${valid}`], [401]],
      ['2 Token scheme', [`Token ${valid}`], [401]],
      ['3 tab separator', [`Bearer\t${valid}`], [400, 401]],
      ['3 trailing junk', [`Bearer ${valid} junk`], [400, 401]],
      ['4 empty token', ['Bearer '], [400, 401]],
      ['5 two headers', [`Bearer ${valid}`, `Bearer ${valid}`], [400]],
      ['7 alg none', [`Bearer ${b64(JSON.stringify({ alg: 'none', typ: 'at+jwt' }))}.${p}.`], [401]],
      ['7 alg nOnE', [`Bearer ${b64(JSON.stringify({ alg: 'nOnE', typ: 'at+jwt' }))}.${p}.`], [401]],
      ['8 null signature', [`Bearer ${h}.${p}.`], [401]],
      ['13 alg not allowed', [`Bearer ${signed({ ...goodHeader, alg: 'HS512' }, goodClaims())}`], [401]],
      [
        '17 kid traversal',
        [`Bearer ${signed({ ...goodHeader, kid: '../../../../dev/null' }, goodClaims())}`],
        [401, 201],
      ],
      ['18 jku', [`Bearer ${signed({ ...goodHeader, jku: 'http://127.0.0.1:1/jwks' }, goodClaims())}`], [401]],
      [
        '19 embedded jwk',
        [`Bearer ${signed({ ...goodHeader, jwk: { kty: 'oct', k: b64('x') } }, goodClaims())}`],
        [401],
      ],
      [
        '20 crit unknown',
        [`Bearer ${signed({ ...goodHeader, crit: ['x-unknown'], 'x-unknown': 1 }, goodClaims())}`],
        [401],
      ],
      ['21 b64 false', [`Bearer ${signed({ ...goodHeader, b64: false, crit: ['b64'] }, goodClaims())}`], [401]],
      ['22 five segments', [`Bearer ${valid}.${p}.${h}`], [401]],
      ['24 two segments', [`Bearer ${h}.${p}`], [401]],
      ['24 trailing dot', [`Bearer ${valid}.`], [401]],
      ['25 padding', [`Bearer ${h}==.${p}.${valid.split('.')[2]}`], [400, 401]],
      ['25 plus and slash', [`Bearer ${h.replace(/-/g, '+')}/.${p}.sig`], [400, 401]],
      ['26 payload is an array', [`Bearer ${signed(goodHeader, [goodClaims()])}`], [401]],
      ['26 payload is null', [`Bearer ${signed(goodHeader, null)}`], [401]],
      [
        '27 duplicate sub',
        [
          `Bearer ${signed(goodHeader, `{"iss":"${ISSUER}","aud":"${AUDIENCE}","sub":"a","sub":"admin","exp":${now() + 300}}`)}`,
        ],
        [401],
      ],
      [
        '27 __proto__',
        [
          `Bearer ${signed(goodHeader, `{"__proto__":{"admin":true},"iss":"${ISSUER}","aud":"${AUDIENCE}","sub":"a","exp":${now() + 300}}`)}`,
        ],
        [401],
      ],
      [
        '28 invalid UTF-8',
        [`Bearer ${b64(JSON.stringify(goodHeader))}.${b64(Buffer.from([0x7b, 0xff, 0xfe, 0x7d]))}.${hmac('x')}`],
        [401],
      ],
      ['29 no exp', [`Bearer ${signed(goodHeader, { ...goodClaims(), exp: undefined })}`], [401]],
      ['30 exp now', [`Bearer ${signed(goodHeader, { ...goodClaims(), exp: now() - 120 })}`], [401]],
      ['31 exp as a string', [`Bearer ${signed(goodHeader, { ...goodClaims(), exp: '9999999999' })}`], [401]],
      [
        '31 exp 1e999',
        [`Bearer ${signed(goodHeader, `{"iss":"${ISSUER}","aud":"${AUDIENCE}","sub":"a","exp":1e999}`)}`],
        [401],
      ],
      [
        '35 issuer with a trailing slash',
        [`Bearer ${signed(goodHeader, { ...goodClaims(), iss: `${ISSUER}/` })}`],
        [401],
      ],
      ['36 audience missing', [`Bearer ${signed(goodHeader, { ...goodClaims(), aud: undefined })}`], [401]],
      ['38 an ID token (typ JWT)', [`Bearer ${signed({ alg: 'HS256', typ: 'JWT' }, goodClaims())}`], [401]],
      [
        'wrong secret',
        [`Bearer ${signed(goodHeader, goodClaims(), 'another-secret-that-is-also-32-bytes-long!!')}`],
        [401],
      ],
      ['44 a 12 KB header', [`Bearer ${'a'.repeat(12_000)}`], [400, 401]],
      ['44 a 20 KB header', [`Bearer ${'a'.repeat(20_000)}`], [431]],
      [
        '45 payload nested 600 deep',
        [`Bearer ${signed(goodHeader, `${'{"a":'.repeat(600)}1${'}'.repeat(600)}`)}`],
        [401],
      ],
      ['54 CR and quotes in the token', [`Bearer "x" realm="evil"`], [400, 401]],
      ['non-ASCII bytes', [Buffer.concat([Buffer.from('Bearer '), Buffer.from([0xc3, 0xa9, 0xff])])], [400, 401]],
    ];
    for (const [label, headers, allowed] of rows) refused(await present(headers), label, allowed);
    // Row 17 is allowed to pass only because an HMAC issuer ignores kid; every other row ran nothing.
    const passed = servers.map((s, i) => s.runs.secure - before[i]!);
    expect(passed.every((n) => n <= 1)).toBe(true);
  });

  it('fast-check: fuzzed segments and sizes are refused with 401 (or 400 / 431)', async () => {
    const segment = fc.oneof(
      fc.base64String({ maxLength: 400 }),
      fc.string({ unit: fc.constantFrom(...'ABCxyz019-_'.split('')), maxLength: 600 }),
      fc.uint8Array({ maxLength: 300 }).map((bytes) => b64(Buffer.from(bytes))),
    );
    const token = fc.array(segment, { minLength: 1, maxLength: 6 }).map((parts) => parts.join('.'));
    await fc.assert(
      fc.asyncProperty(token, async (value) => {
        refused(await present([`Bearer ${value}`]), `fuzzed ${value.slice(0, 40)}`, [400, 401, 431]);
      }),
      { numRuns: 100 },
    );
  });

  it('fast-check: correctly signed tokens with fuzzed headers and claims are refused', async () => {
    const header = fc.record(
      {
        alg: fc.constantFrom('HS256', 'none', 'RS256', 'hs256', 'HS384', '', 'ES256'),
        typ: fc.constantFrom('at+jwt', 'JWT', 'application/jwt', ''),
        kid: fc.string({ maxLength: 40 }),
        crit: fc.array(fc.string({ maxLength: 8 }), { maxLength: 2 }),
      },
      { requiredKeys: ['alg'] },
    );
    const claims = fc.record(
      {
        iss: fc.constantFrom(ISSUER, `${ISSUER}/`, 'https://evil.test'),
        aud: fc.oneof(fc.constantFrom(AUDIENCE), fc.array(fc.string({ maxLength: 10 }), { maxLength: 3 })),
        sub: fc.oneof(fc.string({ maxLength: 10 }), fc.integer()),
        exp: fc.oneof(fc.integer(), fc.double(), fc.string({ maxLength: 10 })),
        nbf: fc.oneof(fc.integer({ min: now() + 3600, max: now() + 99_999 }), fc.string({ maxLength: 4 })),
      },
      { requiredKeys: ['nbf'] },
    );
    await fc.assert(
      fc.asyncProperty(header, claims, async (h, c) => {
        // nbf is always in the future or not a number: no sample can be valid.
        refused(await present([`Bearer ${signed(h, c)}`]), JSON.stringify([h, c]).slice(0, 120), [400, 401]);
      }),
      { numRuns: 100 },
    );
  });
});

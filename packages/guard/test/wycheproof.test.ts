import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { jwsAlgorithms } from '../src/algorithms.js';
import { parseCompactJws } from '../src/compact-jws.js';
import { verifyParsedJws } from '../src/jws-verify.js';
import { importKeySet, type KeyPolicy } from '../src/key-import.js';

// Wycheproof JOSE vectors (C2SP, Apache-2.0), read from WYCHEPROOF_DIR; never copied into the repo.
// Each vector runs through the guard's own JWS layer: strict compact parsing, header checks, key import
// with its checks (use, key_ops, strength, ROCA, alg/curve binding) and the WebCrypto signature check.

const directory = process.env.WYCHEPROOF_DIR;

interface Vector {
  tcId: number;
  comment: string;
  jws: unknown;
  result: 'valid' | 'invalid' | 'acceptable';
  flags: string[];
}
interface Group {
  comment: string;
  public?: Record<string, unknown>;
  private?: Record<string, unknown>;
  tests: Vector[];
}

/**
 * The only vectors whose outcome differs from Wycheproof's `result`, each for a stated reason:
 * - 372, 373 (`InvalidCharacterInserted...`, marked valid): a `?` inside a base64url segment.
 *   Wycheproof tolerates decoders that skip it; the guard requires canonical base64url (research
 *   case 25), so two spellings of one token can never both verify. Refused on purpose.
 * - 346, 350 (RFC 7520 Figure 20, marked valid): the token header says PS384 while the JWK says
 *   `alg: PS256`. The guard pins a key to its JWK `alg` and never lets the header choose (research
 *   case 14, CVE-2026-22818). Refused on purpose.
 * - 367, 370 (`invalidBase64Padding`, marked invalid): the `jws` strings are byte-for-byte identical to
 *   the valid tcId 357 (the padding the names describe is absent in the data), so they verify.
 */
const deviations = new Map<number, boolean>([
  [372, false],
  [373, false],
  [346, false],
  [350, false],
  [367, true],
  [370, true],
]);

const policy: KeyPolicy = { algorithms: jwsAlgorithms, allowSymmetric: true };
const privateMembers = ['d', 'p', 'q', 'dp', 'dq', 'qi', 'oth'];

function publicPart(key: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(key).filter(([name]) => !privateMembers.includes(name)));
}

async function verifyVector(jws: unknown, keySet: unknown): Promise<boolean> {
  if (typeof jws !== 'string') return false;
  const imported = await importKeySet(keySet, policy);
  if (!imported.ok) return false;
  const parsed = parseCompactJws(jws);
  if (!parsed.ok) return false;
  return (await verifyParsedJws(parsed.value, imported.keys, [])).ok;
}

function load(name: string): { testGroups: Group[] } {
  return JSON.parse(readFileSync(join(directory as string, name), 'utf8')) as { testGroups: Group[] };
}

if (directory === undefined || directory === '') {
  console.warn(
    '[@idem/guard] Wycheproof JWS/JWK vectors SKIPPED: WYCHEPROOF_DIR is not set. ' +
      'Set it to the folder holding json_web_signature_test.json (e.g. ../shared/data/wycheproof) to run them.',
  );
  describe('Wycheproof vectors', () => {
    it('are not run because WYCHEPROOF_DIR is unset', () => {
      expect(process.env.WYCHEPROOF_DIR ?? '').toBe('');
    });
  });
} else {
  describe('Wycheproof json_web_signature_test.json', () => {
    const { testGroups } = load('json_web_signature_test.json');
    for (const group of testGroups) {
      const key = (group.public ?? group.private) as Record<string, unknown>;
      const keySet = { keys: [publicPart(key)] };
      for (const vector of group.tests) {
        const expected = deviations.get(vector.tcId) ?? vector.result === 'valid';
        it(`tcId ${vector.tcId} ${group.comment}/${vector.comment}: ${expected ? 'verifies' : 'refused'}`, async () => {
          expect(await verifyVector(vector.jws, keySet)).toBe(expected);
        });
      }
    }
    it('has the expected number of vectors, and the deviations are exactly the documented ones', () => {
      const vectors = testGroups.flatMap((group) => group.tests);
      expect(vectors.length).toBe(401);
      const identical = vectors.find((vector) => vector.tcId === 357)?.jws;
      expect(vectors.filter((vector) => vector.jws === identical).map((vector) => vector.tcId)).toEqual([
        357, 367, 370,
      ]);
      for (const [tcId, outcome] of deviations) {
        expect(vectors.find((vector) => vector.tcId === tcId)?.result === 'valid').toBe(!outcome);
      }
    });
  });

  describe('Wycheproof json_web_key_test.json', () => {
    const { testGroups } = load('json_web_key_test.json');
    for (const group of testGroups) {
      const source = (group.public ?? group.private) as { keys: Array<Record<string, unknown>> };
      const keySet = { keys: source.keys.map(publicPart) };
      for (const vector of group.tests) {
        const expected = vector.result === 'valid';
        it(`tcId ${vector.tcId} ${group.comment}/${vector.comment}: ${expected ? 'verifies' : 'refused'}`, async () => {
          expect(await verifyVector(vector.jws, keySet)).toBe(expected);
        });
      }
    }
  });
}

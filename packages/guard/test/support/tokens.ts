import { constants, createHash, createHmac, generateKeyPairSync, type KeyObject, randomUUID, sign } from 'node:crypto';

/** Test fixtures: keys, a manual clock, and a signer that signs any header/payload bytes. */

export const ISSUER = 'https://id.example';
export const AUDIENCE = 'https://api.example';
export const SECRET = 'test-secret-that-is-long-enough-for-hs256!';
export const START_MS = 1_800_000_000_000;

export function manualClock(start = START_MS) {
  let current = start;
  return {
    now: () => current,
    advance(seconds: number) {
      current += seconds * 1000;
    },
    seconds: () => Math.floor(current / 1000),
  };
}

export interface KeyPair {
  privateKey: KeyObject;
  publicPem: string;
  publicJwk: Record<string, unknown>;
}

function pair(kind: 'rsa' | 'rsa1024' | 'ec' | 'ec384' | 'ed25519'): KeyPair {
  const generated =
    kind === 'rsa' || kind === 'rsa1024'
      ? generateKeyPairSync('rsa', { modulusLength: kind === 'rsa' ? 2048 : 1024 })
      : kind === 'ec' || kind === 'ec384'
        ? generateKeyPairSync('ec', { namedCurve: kind === 'ec' ? 'P-256' : 'P-384' })
        : generateKeyPairSync('ed25519');
  return {
    privateKey: generated.privateKey,
    publicPem: generated.publicKey.export({ type: 'spki', format: 'pem' }) as string,
    publicJwk: generated.publicKey.export({ format: 'jwk' }) as Record<string, unknown>,
  };
}

let cache: Record<string, KeyPair> | undefined;
/** Keys generated once per test file. */
export function testKeys() {
  cache ??= {
    rsa: pair('rsa'),
    rsa2: pair('rsa'),
    ec: pair('ec'),
    ec2: pair('ec'),
    ec384: pair('ec384'),
    ed: pair('ed25519'),
    rsa1024: pair('rsa1024'),
  };
  return cache as Record<'rsa' | 'rsa2' | 'ec' | 'ec2' | 'ec384' | 'ed' | 'rsa1024', KeyPair>;
}

export function b64url(value: string | Uint8Array | object): string {
  if (typeof value === 'string') return Buffer.from(value, 'utf8').toString('base64url');
  if (value instanceof Uint8Array) return Buffer.from(value).toString('base64url');
  return Buffer.from(JSON.stringify(value), 'utf8').toString('base64url');
}

/** Signs `header.payload` segments (already encoded) with the algorithm's primitive. */
export function signSegments(
  headerSegment: string,
  payloadSegment: string,
  alg: string,
  key: KeyObject | string | Uint8Array,
): string {
  const input = `${headerSegment}.${payloadSegment}`;
  let signature: Buffer;
  if (alg.startsWith('HS')) {
    signature = createHmac(`sha${alg.slice(2)}`, key as string | Uint8Array)
      .update(input)
      .digest();
  } else if (alg.startsWith('RS')) {
    signature = sign(`sha${alg.slice(2)}`, Buffer.from(input), key as KeyObject);
  } else if (alg.startsWith('PS')) {
    signature = sign(`sha${alg.slice(2)}`, Buffer.from(input), {
      key: key as KeyObject,
      padding: constants.RSA_PKCS1_PSS_PADDING,
      saltLength: Number(alg.slice(2)) / 8,
    });
  } else if (alg.startsWith('ES')) {
    signature = sign(`sha${alg.slice(2)}`, Buffer.from(input), { key: key as KeyObject, dsaEncoding: 'ieee-p1363' });
  } else {
    signature = sign(null, Buffer.from(input), key as KeyObject);
  }
  return `${input}.${signature.toString('base64url')}`;
}

export interface TokenSpec {
  alg?: string;
  key?: KeyObject | string | Uint8Array;
  header?: Record<string, unknown>;
  /** Replaces the whole header (after defaults) when given. */
  rawHeader?: string;
  claims?: Record<string, unknown>;
  /** Replaces the whole payload when given (raw JSON text, or bytes). */
  rawPayload?: string | Uint8Array;
  omit?: string[];
  now?: number;
}

/** A valid access token by default (HS256 with {@link SECRET}); every part can be overridden. */
export function makeToken(spec: TokenSpec = {}): string {
  const alg = spec.alg ?? 'HS256';
  const key = spec.key ?? SECRET;
  const nowSeconds = Math.floor((spec.now ?? START_MS) / 1000);
  const header = { alg, typ: 'at+jwt', ...spec.header };
  const claims: Record<string, unknown> = {
    iss: ISSUER,
    sub: 'user-1',
    aud: AUDIENCE,
    iat: nowSeconds,
    exp: nowSeconds + 300,
    scope: 'orders:read profile',
    client_id: 'app-1',
    jti: 'jti-1',
    ...spec.claims,
  };
  for (const name of spec.omit ?? []) delete claims[name];
  const headerSegment = spec.rawHeader !== undefined ? b64url(spec.rawHeader) : b64url(header);
  const payloadSegment = spec.rawPayload !== undefined ? b64url(spec.rawPayload) : b64url(claims);
  return signSegments(headerSegment, payloadSegment, alg, key);
}

/**
 * The claims of a fresh DPoP proof for `POST <htu>`, made at `iat` (seconds) and bound to
 * `accessToken` by its hash (`ath`), with a new `jti`.
 */
export function proofClaims(accessToken: string, htu: string, iat: number) {
  return {
    jti: randomUUID(),
    htm: 'POST',
    htu,
    iat,
    ath: createHash('sha256').update(accessToken).digest('base64url'),
  };
}

import type { ClaimValue } from './claims.js';
import { defaultTokenLimits, type TokenLimits } from './compact-jws.js';
import { refuseUnknownOptions } from './option-names.js';
import { seconds } from './seconds.js';

// An optional duration: unset stays unset (no such bound).
// At least a second: 0 would refuse every token (none is issued and used in the same instant).
export const optionalSeconds = (value: number | undefined, name: string) =>
  value === undefined ? undefined : seconds(value, name, { min: 1 });

// The claims other options own: a value rule on one would pass tokens those options refuse, or
// refuse every token. (`sub` is free: Kubernetes service accounts are pinned by it.)
const ownedClaims: Readonly<Record<string, string>> = {
  iss: 'issuer',
  aud: 'audience',
  exp: 'maxLifetime',
  nbf: 'clockTolerance',
  iat: 'maxTokenAge',
  cnf: 'dpop and mtls',
};

const isClaimValue = (value: unknown): value is ClaimValue =>
  typeof value === 'string' || typeof value === 'boolean' || (typeof value === 'number' && Number.isFinite(value));

// Checks `claimValues` and gives it as pairs of a claim and its accepted values (a one-value rule
// is a list of one), the shape checkClaims walks per token.
export function claimValueRules(
  value: unknown,
  where: string,
): ReadonlyArray<readonly [string, readonly ClaimValue[]]> {
  if (value === undefined) return [];
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw new TypeError(`${where}: claimValues must be an object of claim names and accepted values`);
  }
  return Object.entries(value).map(([claim, accepted]) => {
    if (claim === '') throw new TypeError(`${where}: claimValues cannot name an empty claim`);
    // The token parser refuses a `__proto__` member, so no token could meet a rule on it.
    if (claim === '__proto__') throw new TypeError(`${where}: claimValues cannot rule on __proto__ (no token has it)`);
    // Own members only: `constructor` or `toString` are claims a token may carry, not owned ones.
    if (Object.hasOwn(ownedClaims, claim)) {
      throw new TypeError(`${where}: claimValues cannot rule on ${claim} (see ${ownedClaims[claim]})`);
    }
    const list: unknown[] = Array.isArray(accepted) ? accepted : [accepted];
    if (list.length === 0 || !list.every(isClaimValue)) {
      throw new TypeError(
        `${where}: claimValues.${claim} must be a string, a finite number or a boolean, or a non-empty list of them`,
      );
    }
    return [claim, list as ClaimValue[]] as const;
  });
}

export const notAudienceClaims: ReadonlySet<string> = new Set([
  'iss',
  'sub',
  'exp',
  'nbf',
  'iat',
  'jti',
  'cnf',
  'scope',
  'scp',
]);

export function claimName(value: unknown, name: string): string {
  if (typeof value !== 'string' || value === '') throw new TypeError(`${name} must be a claim name`);
  return value;
}

// A claim name, or a path of member names into nested claims (at most 8 deep: no provider nests roles
// deeper, and a longer path is more likely a string split by mistake).
export function claimPath(value: unknown, name: string): readonly string[] {
  if (typeof value === 'string') return Object.freeze([claimName(value, name)]);
  if (
    !Array.isArray(value) ||
    value.length === 0 ||
    value.length > 8 ||
    !value.every((part) => typeof part === 'string' && part !== '')
  ) {
    throw new TypeError(`${name} must be a claim name, or an array of 1 to 8 member names (a path into nested claims)`);
  }
  return Object.freeze([...(value as string[])]);
}

// The deepest JSON nesting a limit may allow: the strict parser recurses once per level, and a few
// thousand levels would overflow the stack (a throw, where verification must return a value).
const maxDepthCeiling = 1000;

const limitNames = ['maxTokenLength', 'maxHeaderLength', 'maxDepth'] as const satisfies readonly (keyof TokenLimits)[];

export function checkLimits(limits: Partial<TokenLimits> | undefined): TokenLimits {
  if (limits === undefined) return { ...defaultTokenLimits };
  if (limits === null || typeof limits !== 'object') throw new TypeError('limits must be an object');
  refuseUnknownOptions(limits, limitNames, 'limits');
  const checked = { ...defaultTokenLimits };
  for (const name of limitNames) {
    // An explicit `undefined` means the default, as an absent member does; it never lifts the bound.
    const value = limits[name];
    if (value === undefined) continue;
    const max = name === 'maxDepth' ? maxDepthCeiling : Number.MAX_SAFE_INTEGER;
    if (!Number.isSafeInteger(value) || value < 1 || value > max) {
      throw new TypeError(`limits.${name} must be a whole number from 1 to ${max}`);
    }
    checked[name] = value;
  }
  return checked;
}

// A string, or any iterable of them (an array, a Set). Anything else (a RegExp, a number, a plain
// object) is no list: undefined, so the caller's "is required" error names the option, rather than
// "value is not iterable" from the spread.
export function toList(value: string | readonly string[] | undefined): string[] | undefined {
  if (value === undefined) return undefined;
  if (typeof value === 'string') return [value];
  const iterable = value as unknown as { [Symbol.iterator]?: unknown } | null;
  return typeof iterable?.[Symbol.iterator] === 'function' ? [...value] : undefined;
}

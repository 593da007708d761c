/**
 * The `typ` of the gateway's internal token; the edge guard refuses it whatever an issuer allows.
 *
 * @example
 * internalTokenType; // 'internal+jwt'
 */
export const internalTokenType = 'internal+jwt';

/**
 * Normalises a `typ` or `cty` value: lower case, `application/` prefix removed (RFC 9068 §4,
 * RFC 7515 §4.1.9 and §4.1.10).
 *
 * @example
 * normalizeTyp('application/AT+JWT'); // 'at+jwt'
 */
export function normalizeTyp(value: string): string {
  const lower = value.toLowerCase();
  return lower.startsWith('application/') ? lower.slice('application/'.length) : lower;
}

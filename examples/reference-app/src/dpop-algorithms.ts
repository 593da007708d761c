/**
 * The DPoP proof algorithms (RFC 9449) of the whole app: the identity provider binds tokens only with
 * proofs of these, and the gateway takes these, so a token bound to a client's key is always one the
 * API can be called with. (The guard also takes RFC 9864's `Ed25519`; oidc-provider binds with the
 * names it lists, and one list keeps both sides the same.)
 *
 * @example
 * ```ts
 * const dpop = { origin: 'http://localhost:8080', algorithms: [...dpopAlgorithms] };
 * ```
 */
export const dpopAlgorithms = ['ES256', 'EdDSA'] as const;

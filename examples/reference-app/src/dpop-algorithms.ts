/**
 * The DPoP proof algorithms (RFC 9449) of the whole app: the identity provider binds tokens only with
 * proofs of these, and the gateway takes these, so a token bound to a client's key is always one the
 * API can be called with. Both names of EdDSA on Ed25519: oauth4webapi (and so openid-client) signs
 * an Ed25519 key's proofs as RFC 9864's `Ed25519`, never `EdDSA`, and without that name here such a
 * client, told `EdDSA` by discovery, got `invalid_dpop_proof` at the token endpoint.
 *
 * @example
 * ```ts
 * const dpop = { origin: 'http://localhost:8080', algorithms: [...dpopAlgorithms] };
 * ```
 */
export const dpopAlgorithms = ['ES256', 'Ed25519', 'EdDSA'] as const;

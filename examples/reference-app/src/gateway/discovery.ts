/** The parts of an OpenID Provider's discovery document the gateway uses. */
export interface ProviderMetadata {
  issuer: string;
  jwksUri: string;
}

/**
 * Reads `<issuer>/.well-known/openid-configuration` and returns its `jwks_uri`. The document's
 * `issuer` must equal the configured one exactly (OpenID Connect Discovery §4.3): a mismatch means
 * the URL points at another provider, whose keys must not be trusted for this issuer.
 *
 * @example
 * ```ts
 * const { jwksUri } = await discoverProvider('http://localhost:8081');
 * ```
 */
export async function discoverProvider(
  issuer: string,
  fetchImpl: typeof globalThis.fetch = globalThis.fetch,
): Promise<ProviderMetadata> {
  const url = `${issuer.replace(/\/$/, '')}/.well-known/openid-configuration`;
  let response: Response;
  try {
    response = await fetchImpl(url, { headers: { accept: 'application/json' }, signal: AbortSignal.timeout(5000) });
  } catch (error) {
    throw new Error(`gateway: the identity provider's discovery document at ${url} could not be fetched`, {
      cause: error,
    });
  }
  if (!response.ok) throw new Error(`gateway: ${url} answered ${response.status}`);
  const metadata = (await response.json()) as { issuer?: unknown; jwks_uri?: unknown };
  if (metadata.issuer !== issuer) {
    throw new Error(`gateway: the discovery document at ${url} names another issuer`);
  }
  if (typeof metadata.jwks_uri !== 'string' || !URL.canParse(metadata.jwks_uri)) {
    throw new Error(`gateway: the discovery document at ${url} has no valid jwks_uri`);
  }
  return { issuer, jwksUri: metadata.jwks_uri };
}

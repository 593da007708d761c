import type { ClientMetadata } from 'oidc-provider';
import type { Database } from '../db.js';

const loopbackHosts = new Set(['localhost', '127.0.0.1', '[::1]']);

/**
 * Refuses redirect URIs RFC 9700 section 2.6 forbids and oidc-provider would accept: `http:` on any
 * host but loopback. Web clients must use `https:`; `http:` is allowed only for loopback (a native app,
 * or this demo running on one machine). Fragments are refused too (RFC 6749 section 3.1.2), and user
 * information (RFC 9110 section 4.2.4: `https://app.example@evil.example/cb` reads as one host to a
 * person and is another). Post-logout redirect URIs are held to the same rules: the provider sends
 * browsers there too, and a registered one on plain http could be taken over on the way.
 *
 * @example
 * ```ts
 * assertRedirectUris({ client_id: 'x', redirect_uris: ['http://evil.example/cb'] }); // throws TypeError
 * ```
 */
export function assertRedirectUris(metadata: ClientMetadata): void {
  const uris = metadata.redirect_uris ?? [];
  if (uris.length === 0) throw new TypeError(`client ${metadata.client_id}: at least one redirect_uri is required`);
  for (const uri of uris) assertRedirectUri(metadata.client_id, 'redirect_uri', uri);
  for (const uri of metadata.post_logout_redirect_uris ?? []) {
    assertRedirectUri(metadata.client_id, 'post_logout_redirect_uri', uri);
  }
}

function assertRedirectUri(clientId: string, kind: string, uri: string): void {
  const parsed = URL.parse(uri);
  if (!parsed) throw new TypeError(`client ${clientId}: ${kind} is not a URL`);
  if (parsed.hash !== '' || uri.includes('#')) {
    throw new TypeError(`client ${clientId}: ${kind} must not have a fragment`);
  }
  if (parsed.username !== '' || parsed.password !== '') {
    throw new TypeError(`client ${clientId}: ${kind} must not carry user information`);
  }
  if (parsed.protocol === 'https:') return;
  if (parsed.protocol === 'http:' && loopbackHosts.has(parsed.hostname)) return;
  throw new TypeError(`client ${clientId}: ${kind} must be https (http only on loopback)`);
}

/**
 * Registers (or replaces) a client in the provider's storage, after {@link assertRedirectUris}. The
 * provider reads clients through its adapter (model `Client`), so a client saved here is live at once.
 *
 * @example
 * ```ts
 * await saveClient(db, { client_id: 'cli', token_endpoint_auth_method: 'none', redirect_uris: ['http://127.0.0.1/cb'] });
 * ```
 */
export async function saveClient(db: Database, metadata: ClientMetadata): Promise<void> {
  assertRedirectUris(metadata);
  await db.query(
    `insert into idp_models (model, id, payload) values ('Client', $1, $2)
     on conflict (model, id) do update set payload = excluded.payload`,
    [metadata.client_id, JSON.stringify(metadata)],
  );
}

/**
 * Registers a client unless one with its id is there already (then nothing changes), after
 * {@link assertRedirectUris}. Of several processes adding the same client at once, one wins and the
 * others read its metadata back: what two first starts need to agree on one generated secret.
 *
 * @example
 * ```ts
 * await addClientIfMissing(db, { client_id: 'cli', token_endpoint_auth_method: 'none', redirect_uris: ['http://127.0.0.1/cb'] });
 * ```
 */
export async function addClientIfMissing(db: Database, metadata: ClientMetadata): Promise<void> {
  assertRedirectUris(metadata);
  await db.query(
    `insert into idp_models (model, id, payload) values ('Client', $1, $2) on conflict (model, id) do nothing`,
    [metadata.client_id, JSON.stringify(metadata)],
  );
}

/**
 * Reads a registered client's metadata.
 *
 * @example
 * ```ts
 * const client = await findClient(db, 'photo-app');
 * ```
 */
export async function findClient(db: Database, clientId: string): Promise<ClientMetadata | undefined> {
  const { rows } = await db.query<{ payload: ClientMetadata }>(
    `select payload from idp_models where model = 'Client' and id = $1`,
    [clientId],
  );
  return rows[0]?.payload;
}

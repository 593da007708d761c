// Audit of the resource_metadata the gateway (and, since this session, the API and the receiver
// behind it) names in its challenges, for a BASE_URL written with a trailing slash, as env values
// often are: `BASE_URL=https://api.example.com/`. The gateway alone, with a test issuer.
import { exportJWK, generateKeyPair } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type RunningGateway, resourceMetadataUrl, startGateway } from '../src/gateway/server.js';

const issuer = 'https://issuer.base-url-test.example';

describe('gateway: a BASE_URL with a trailing slash', () => {
  let gateway: RunningGateway;
  beforeAll(async () => {
    const pair = await generateKeyPair('ES256');
    const jwk = { ...(await exportJWK(pair.publicKey)), kid: 'k', alg: 'ES256' };
    gateway = await startGateway({
      port: 0,
      apiUrl: 'http://127.0.0.1:9',
      baseUrl: 'http://gateway.test/',
      issuers: [{ issuer, jwks: { keys: [jwk] }, algorithms: ['ES256'] }],
    });
  });
  afterAll(async () => {
    await gateway?.close();
  });

  // Was wrong: the URL was `${baseUrl}/.well-known/...`, so a BASE_URL ending in "/" named
  // http://gateway.test//.well-known/oauth-protected-resource in every challenge (the API's and the
  // receiver's 403s too, through resourceMetadataUrl), a path the gateway takes for an API path and
  // answers 401: a client following RFC 9728 from the 401 found no metadata. The trailing slash is now left out.
  it('names a metadata URL the gateway serves in its challenge', async () => {
    expect(resourceMetadataUrl('http://gateway.test/')).toBe(
      'http://gateway.test/.well-known/oauth-protected-resource',
    );
    const response = await fetch(new URL('/charges', gateway.url));
    expect(response.status).toBe(401);
    const challenge = response.headers.get('www-authenticate') ?? '';
    const named = /resource_metadata="([^"]+)"/.exec(challenge)?.[1];
    expect(named).toBe('http://gateway.test/.well-known/oauth-protected-resource');
    const path = new URL(named ?? 'http://x/').pathname;
    const metadata = await fetch(new URL(path, gateway.url));
    expect(metadata.status).toBe(200);
    expect(await metadata.json()).toMatchObject({ authorization_servers: [issuer] });
  });
});

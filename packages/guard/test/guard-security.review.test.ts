import { generateKeyPairSync } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import {
  createGuard,
  createInternalTokenIssuer,
  createInternalVerifier,
  requireScopes,
  stripIdentityHeaders,
} from '../src/index.js';
import { AUDIENCE, ISSUER, makeToken, manualClock, SECRET } from './support/tokens.js';

const GATEWAY = 'https://gateway.example';

// The gateway passes the caller's scopes on as one space-delimited `scope` string, which the service
// splits again. An array item holding a space is one (unusable) scope at the edge and two behind it:
// the service would grant what the gateway never saw.
describe('scope arrays across the gateway', () => {
  for (const claim of ['scope', 'scp'] as const) {
    it(`a ${claim} array item holding a space is refused at the edge, not split behind it`, async () => {
      const clock = manualClock();
      const edge = createGuard({ audience: AUDIENCE, now: clock.now, issuers: [{ issuer: ISSUER, secret: SECRET }] });
      const internalTokens = createInternalTokenIssuer({ issuer: GATEWAY, now: clock.now });
      const service = createInternalVerifier({
        issuer: GATEWAY,
        audience: 'orders',
        jwks: () => internalTokens.jwks(),
        now: clock.now,
      });
      const token = makeToken({ claims: { scope: undefined, [claim]: ['orders:read orders:write'] } });
      const atEdge = await edge.verify(token);
      if (atEdge.ok) {
        // Accepted at the edge: the service behind must see the same scopes, never more.
        expect(edge.authorize(atEdge.principal, [requireScopes('orders:write')]).ok).toBe(false);
        const internal = await internalTokens.mint(atEdge.principal, { audience: 'orders' });
        const behind = await service.verify(internal);
        if (!behind.ok) throw new Error(behind.error.code);
        expect([...behind.principal.scope]).toEqual([...atEdge.principal.scope]);
      }
      expect(atEdge.ok ? 'ok' : atEdge.error.code).toBe('claim_invalid');
      // Items without a space still pass, as Duende writes them.
      const plain = await edge.verify(makeToken({ claims: { scope: undefined, [claim]: ['orders:read', 'a:b'] } }));
      expect(plain.ok ? [...plain.principal.scope] : plain.error.code).toEqual(['orders:read', 'a:b']);
    });
  }

  // Was a defect: a tab or a line break passed, in an array item or in the string, where a service
  // behind the gateway that splits scopes on any whitespace (as many do) reads two scopes the edge
  // read as one; RFC 6749 §3.3 has no whitespace but the space between tokens.
  it('a tab or a line break in a scope item or string is refused at the edge; spaces between tokens pass', async () => {
    const edge = createGuard({
      audience: AUDIENCE,
      now: manualClock().now,
      issuers: [{ issuer: ISSUER, secret: SECRET }],
    });
    const codeOf = async (claims: Record<string, unknown>) => {
      const result = await edge.verify(makeToken({ claims: { scope: undefined, ...claims } }));
      return result.ok ? 'ok' : result.error.code;
    };
    for (const value of ['orders:read\torders:write', 'orders:read\norders:write']) {
      expect(await codeOf({ scope: value }), JSON.stringify(value)).toBe('claim_invalid');
      expect(await codeOf({ scp: [value] }), JSON.stringify(value)).toBe('claim_invalid');
    }
    expect(await codeOf({ scope: 'orders:read orders:write' })).toBe('ok');
  });
});

// request-ip (the npm package most Node services use for the client address) reads, in order:
// x-client-ip, x-forwarded-for, cf-connecting-ip, fastly-client-ip, true-client-ip, x-real-ip,
// x-cluster-client-ip, x-forwarded, forwarded-for, forwarded, x-appengine-user-ip, cf-pseudo-ipv4.
// With the others stripped, a client's own Fastly-Client-IP was the address a service behind the
// gateway logged, rate-limited and allowlisted.
describe('client address headers', () => {
  const spoofed = {
    'Fastly-Client-IP': '10.0.0.1',
    'x-cluster-client-ip': '10.0.0.2',
    'X-Forwarded': 'for=10.0.0.3',
    'forwarded-for': '10.0.0.4',
    'x-appengine-user-ip': '10.0.0.5',
    'Cf-Pseudo-IPv4': '10.0.0.6',
    accept: 'application/json',
  };

  it('strips every client address header request-ip reads; keepForwarded keeps them as a proxy wrote them', () => {
    expect(stripIdentityHeaders(spoofed)).toEqual({ accept: 'application/json' });
    expect(stripIdentityHeaders(spoofed, { keepForwarded: true })).toEqual(spoofed);
    expect(stripIdentityHeaders({ fastly_client_ip: '10.0.0.1' }, { keepForwarded: true })).toEqual({});
  });
});

// A private JWK among the configured keys is refused ("holds private or symmetric material"), and so is
// a fetched set holding one. A private key in PEM was taken silently, its public half derived: the
// gateway's signing key copied to every service (or an identity provider's to every gateway), where
// whoever reads one service's configuration mints tokens that every other service accepts.
describe('private key material given as a public key', () => {
  const ed = generateKeyPairSync('ed25519').privateKey;
  const rsa = generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey;
  const ec = generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey;
  const privatePems = {
    'PKCS#8 Ed25519': ed.export({ type: 'pkcs8', format: 'pem' }) as string,
    'PKCS#1 RSA': rsa.export({ type: 'pkcs1', format: 'pem' }) as string,
    'SEC1 EC': ec.export({ type: 'sec1', format: 'pem' }) as string,
  };

  for (const [label, pem] of Object.entries(privatePems)) {
    it(`a ${label} private key PEM is refused at construction, by the guard and by the internal verifier`, () => {
      expect(() => createGuard({ audience: AUDIENCE, issuers: [{ issuer: ISSUER, publicKeys: [pem] }] })).toThrow(
        TypeError,
      );
      expect(() =>
        createGuard({ audience: AUDIENCE, issuers: [{ issuer: ISSUER, publicKeys: [{ pem, kid: 'k1' }] }] }),
      ).toThrow(TypeError);
      expect(() => createInternalVerifier({ issuer: GATEWAY, audience: 'orders', keys: [pem] })).toThrow(TypeError);
    });
  }

  it('public key PEMs and certificates still load', () => {
    const spki = generateKeyPairSync('ed25519').publicKey.export({ type: 'spki', format: 'pem' }) as string;
    const pkcs1 = generateKeyPairSync('rsa', { modulusLength: 2048 }).publicKey.export({
      type: 'pkcs1',
      format: 'pem',
    }) as string;
    expect(() =>
      createGuard({ audience: AUDIENCE, issuers: [{ issuer: ISSUER, publicKeys: [spki, pkcs1] }] }),
    ).not.toThrow();
  });
});

import { describe, expect, it } from 'vitest';
import { authorizeRequest, createGuard, principalFromClaims, requireRoles, requireScopes } from '../src/index.js';
import { AUDIENCE, ISSUER, makeToken, manualClock, SECRET } from './support/tokens.js';

// A principal is documented as immutable, and the verified-token cache hands the same one to every
// request with that token: a change made while handling one request would reach the next.

describe('principal', () => {
  it('scope and roles cannot be changed, so a later request with the same token sees them as verified', async () => {
    const guard = createGuard({
      audience: AUDIENCE,
      now: manualClock().now,
      issuers: [{ issuer: ISSUER, secret: SECRET }],
    });
    const token = makeToken({ claims: { scope: 'orders:read', roles: ['user'] } });
    const first = await guard.verify(token);
    if (!first.ok) throw new Error(first.error.code);
    // A handler that "enriches" the principal for one request.
    const scope = first.principal.scope as Set<string>;
    const roles = first.principal.roles as Set<string>;
    expect(() => scope.add('orders:write')).toThrow(TypeError);
    expect(() => roles.add('admin')).toThrow(TypeError);
    expect(() => scope.delete('orders:read')).toThrow(TypeError);
    expect(() => roles.clear()).toThrow(TypeError);
    // Still a Set for every read (code that checks `instanceof Set` keeps working).
    expect(scope).toBeInstanceOf(Set);
    const second = await guard.verify(token);
    if (!second.ok) throw new Error(second.error.code);
    expect(guard.stats().cacheHits).toBe(1);
    expect([...second.principal.scope]).toEqual(['orders:read']);
    expect([...second.principal.roles]).toEqual(['user']);
    expect(guard.authorize(second.principal, [requireScopes('orders:write')]).ok).toBe(false);
  });

  it('claims are frozen all the way down', () => {
    const principal = principalFromClaims({
      sub: 'u1',
      iss: ISSUER,
      aud: AUDIENCE,
      realm_access: { roles: ['user'] },
      groups: [{ name: 'staff' }],
    });
    const claims = principal.claims as Record<string, any>;
    expect(() => {
      claims.sub = 'admin';
    }).toThrow(TypeError);
    expect(() => claims.realm_access.roles.push('admin')).toThrow(TypeError);
    expect(() => {
      claims.groups[0].name = 'admins';
    }).toThrow(TypeError);
    expect(Object.isFrozen(principal.aud)).toBe(true);
    expect(Object.isFrozen(principal)).toBe(true);
  });

  it('a roles claim that is one string is one role; only the scope claims are space-delimited', () => {
    const principal = principalFromClaims(
      { sub: 'u1', iss: ISSUER, aud: AUDIENCE, groups: 'Finance Admin', scope: 'a b', scp: 'c d' },
      { rolesClaim: 'groups' },
    );
    expect([...principal.roles]).toEqual(['Finance Admin']);
    expect(authorizeRequest(principal, [requireRoles('Admin')], { headers: {} }).ok).toBe(false);
    expect(authorizeRequest(principal, [requireRoles('Finance Admin')], { headers: {} }).ok).toBe(true);
    expect([...principal.scope]).toEqual(['a', 'b', 'c', 'd']);
    expect([...principalFromClaims({ sub: 'u1', iss: ISSUER, aud: AUDIENCE, roles: ['x y', 'z'] }).roles]).toEqual([
      'x y',
      'z',
    ]);
  });

  it('read-only sets answer every read a Set answers', () => {
    const { scope } = principalFromClaims({ sub: 'u1', iss: ISSUER, aud: AUDIENCE, scope: 'a b', scp: ['c'] });
    expect(scope.size).toBe(3);
    expect(scope.has('b')).toBe(true);
    expect(scope.has('z')).toBe(false);
    expect([...scope]).toEqual(['a', 'b', 'c']);
    expect([...scope.values()]).toEqual(['a', 'b', 'c']);
    expect([...scope.keys()]).toEqual(['a', 'b', 'c']);
    expect([...scope.entries()]).toEqual([
      ['a', 'a'],
      ['b', 'b'],
      ['c', 'c'],
    ]);
    const seen: string[] = [];
    scope.forEach((value, key, set) => {
      expect(set).toBe(scope);
      seen.push(`${value}=${key}`);
    });
    expect(seen).toEqual(['a=a', 'b=b', 'c=c']);
    // The ES2025 set methods (not in this repo's ES2023 lib types) read it too, and give back a new Set.
    type Es2025Set = { union(other: unknown): Set<string>; isSubsetOf(other: unknown): boolean };
    const union = (scope as unknown as Es2025Set).union(new Set(['d']));
    expect([...union]).toEqual(['a', 'b', 'c', 'd']);
    expect((new Set(['a']) as unknown as Es2025Set).isSubsetOf(scope)).toBe(true);
  });

  it("principalFromClaims copies what it freezes: the caller's objects stay as they were", () => {
    const nested = { roles: ['user'] };
    const claims = { sub: 'u1', iss: ISSUER, aud: AUDIENCE, realm_access: nested };
    principalFromClaims(claims);
    expect(Object.isFrozen(claims)).toBe(false);
    expect(Object.isFrozen(nested)).toBe(false);
    nested.roles.push('admin');
    expect(nested.roles).toEqual(['user', 'admin']);
  });
});

// Auth0, Keycloak and Entra v2 name the requesting client in `azp`, not RFC 9068's `client_id`: with
// only `client_id` read, `principal.clientId` was undefined for their tokens, and a per-client scope
// (`principalScope(auth, { perClient: true })`) refused every one of them with 500 scope_missing.
describe('principal.clientId', () => {
  const base = { sub: 'user-1', iss: ISSUER, aud: AUDIENCE, exp: 2_000_000_000, iat: 1_000_000_000 };
  it('is client_id, else azp; other names stay in claims only', () => {
    expect(principalFromClaims({ ...base, client_id: 'app-1', azp: 'app-2' }).clientId).toBe('app-1');
    expect(principalFromClaims({ ...base, azp: 'app-2' }).clientId).toBe('app-2');
    expect(principalFromClaims({ ...base, cid: 'okta-app' }).clientId).toBeUndefined();
    expect(principalFromClaims({ ...base, azp: 42 }).clientId).toBeUndefined();
  });
});

// Keycloak keeps realm roles in `realm_access.roles`, an object claim: with `rolesClaim` limited to a
// top-level name, principal.roles was always empty for its tokens and requireRoles() refused them all
// (a policy() reading the claim by hand on every route was the only way).
describe('rolesClaim as a path into nested claims', () => {
  const base = { sub: 'user-1', iss: ISSUER, aud: AUDIENCE, exp: 2_000_000_000, iat: 1_000_000_000 };
  it('reads the roles at the path, own members of objects only', () => {
    const claims = {
      ...base,
      realm_access: { roles: ['clerk', 'viewer'] },
      'realm_access.roles': ['dotted'],
      resource_access: { account: { roles: ['manage-account'] } },
    };
    expect([...principalFromClaims(claims, { rolesClaim: ['realm_access', 'roles'] }).roles]).toEqual([
      'clerk',
      'viewer',
    ]);
    // A dotted string is one claim name, as Auth0's namespaced claims are.
    expect([...principalFromClaims(claims, { rolesClaim: 'realm_access.roles' }).roles]).toEqual(['dotted']);
    expect([...principalFromClaims(claims, { rolesClaim: ['resource_access', 'account', 'roles'] }).roles]).toEqual([
      'manage-account',
    ]);
    // Missing members, arrays on the way and inherited members lead nowhere.
    for (const path of [
      ['realm_access', 'missing'],
      ['resource_access', '0'],
      ['realm_access', 'constructor'],
      ['__proto__'],
    ]) {
      expect(
        [...principalFromClaims({ ...base, resource_access: [{}] }, { rolesClaim: path }).roles],
        path.join('/'),
      ).toEqual([]);
    }
  });

  it('gives requireRoles() the realm roles of a verified token', async () => {
    const guard = createGuard({
      audience: AUDIENCE,
      now: manualClock().now,
      issuers: [{ issuer: ISSUER, secret: SECRET, rolesClaim: ['realm_access', 'roles'] }],
    });
    const verified = await guard.verify(makeToken({ claims: { realm_access: { roles: ['clerk'] } } }));
    if (!verified.ok) throw new Error(verified.error.code);
    expect(authorizeRequest(verified.principal, [requireRoles('clerk')], { headers: {} }).ok).toBe(true);
    expect(authorizeRequest(verified.principal, [requireRoles('admin')], { headers: {} }).ok).toBe(false);
  });
});

// Duende IdentityServer writes `scope` as a JSON array unless told otherwise
// (EmitScopesAsSpaceDelimitedStringInJwt): its tokens were refused with claim_invalid.
describe('scope as an array', () => {
  it('is read item by item; an array with anything but strings is refused', async () => {
    const guard = createGuard({
      audience: AUDIENCE,
      now: manualClock().now,
      issuers: [{ issuer: ISSUER, secret: SECRET }],
    });
    const verified = await guard.verify(makeToken({ claims: { scope: ['orders:read', 'orders:write'] } }));
    if (!verified.ok) throw new Error(verified.error.code);
    expect([...verified.principal.scope]).toEqual(['orders:read', 'orders:write']);
    for (const scope of [['orders:read', 1], [null], { 0: 'a' }, 7]) {
      const refused = await guard.verify(makeToken({ claims: { scope } }));
      expect(refused.ok ? 'ok' : refused.error.code, JSON.stringify(scope)).toBe('claim_invalid');
    }
  });
});

// Review of the IdP adapter's rotation in one statement: `consume` of a refresh token inside a
// request (oidc-provider's request context) only notes it, and the `upsert` of its successor in that
// context uses it. oidc-provider 9 consumes a refresh token in one place only, the refresh_token
// grant, right before it saves the successor (lib/actions/grants/refresh_token.js); the other grants
// consume their own models (codes, device codes, CIBA requests) and revocation destroys. These pin
// the paths around that: a consume outside any request, one that no save follows, and the saves of
// a context after its rotation. On the test database (PGlite, or PostgreSQL with DATABASE_URL).
import type { AsyncLocalStorage } from 'node:async_hooks';
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../src/db.js';
import { sqlAdapterFactory } from '../src/idp/adapter.js';
import { migrateIdp } from '../src/idp/schema.js';
import { storedId } from '../src/idp/stored-id.js';
import { openTestDatabase } from './services.js';

// oidc-provider's request context is an AsyncLocalStorage (`Provider.ctx` reads it); entered here as
// the token endpoint enters it, with a plain object for the request.
const alsPath = 'oidc-provider/lib/helpers/als.js';
const { default: als } = (await import(alsPath)) as { default: AsyncLocalStorage<object> };

let db: Database;
const adapters = (refreshTokenReuseSeconds = 30) => sqlAdapterFactory(db, { refreshTokenReuseSeconds });

beforeAll(async () => {
  db = await openTestDatabase('review_idp_rotation');
  await migrateIdp(db);
});
afterAll(async () => {
  await db?.close();
});

const id = () => randomBytes(12).toString('base64url');
const token = (grantId: string) => ({ grantId, kind: 'RefreshToken', jti: id(), clientId: 'app' });
const stored = async (model: string, key: string) =>
  (
    await db.query<{ consumed: boolean; rotated_from: string | null }>(
      'select consumed_at is not null as consumed, rotated_from from idp_models where model = $1 and id = $2',
      [model, storedId(model, key)],
    )
  ).rows[0];

describe('the IdP adapter: consume of a refresh token', () => {
  // With no reuse interval, so that `find` reads the use as it is (within one, a token used and not
  // reused reads as unused: see the adapter). Outside a request there is no rotation to take a reuse,
  // so a second consume there is a replay whatever the interval.
  it('Held: outside any request (a script, a job), it uses the token at once, and a second one is a replay that revokes the grant', async () => {
    const adapter = adapters(0)('RefreshToken');
    const grantId = id();
    const presented = token(grantId);
    await adapter.upsert(presented.jti, presented, 3600);
    await adapter.consume(presented.jti);
    expect(await stored('RefreshToken', presented.jti)).toEqual({ consumed: true, rotated_from: null });
    expect((await adapter.find(presented.jti))?.consumed).toEqual(expect.any(Number));
    await expect(adapter.consume(presented.jti)).rejects.toMatchObject({ error: 'invalid_grant' });
    expect(await stored('RefreshToken', presented.jti)).toBeUndefined();
  });

  it('Held: in a request that saves no successor after it (the save failed before the adapter, say), the token stays unused and no token was issued', async () => {
    const adapter = adapters()('RefreshToken');
    const presented = token(id());
    await adapter.upsert(presented.jti, presented, 3600);
    await als.run({}, async () => {
      await adapter.consume(presented.jti);
    });
    expect(await stored('RefreshToken', presented.jti)).toEqual({ consumed: false, rotated_from: null });
    expect((await adapter.find(presented.jti))?.consumed).toBeUndefined();
  });

  it('Held: the save after the consume is the rotation (the successor linked, the token used); a further save in that request is a plain one', async () => {
    const adapter = adapters()('RefreshToken');
    const grantId = id();
    const presented = token(grantId);
    const successor = token(grantId);
    const another = token(grantId);
    await adapter.upsert(presented.jti, presented, 3600);
    await als.run({}, async () => {
      await adapter.consume(presented.jti);
      await adapter.upsert(successor.jti, successor, 3600);
      await adapter.upsert(another.jti, another, 3600);
    });
    expect(await stored('RefreshToken', presented.jti)).toEqual({ consumed: true, rotated_from: null });
    expect(await stored('RefreshToken', successor.jti)).toEqual({
      consumed: false,
      rotated_from: storedId('RefreshToken', presented.jti),
    });
    expect(await stored('RefreshToken', another.jti)).toEqual({ consumed: false, rotated_from: null });
  });

  it("Held: another model's consume in a request (an authorization code) uses it at once, and a refresh token saved after it is no rotation", async () => {
    const factory = adapters();
    const codes = factory('AuthorizationCode');
    const refreshTokens = factory('RefreshToken');
    const grantId = id();
    const code = { grantId, kind: 'AuthorizationCode', jti: id(), clientId: 'app' };
    const issued = token(grantId);
    await codes.upsert(code.jti, code, 60);
    await als.run({}, async () => {
      await codes.consume(code.jti);
      await refreshTokens.upsert(issued.jti, issued, 3600);
    });
    expect(await stored('AuthorizationCode', code.jti)).toEqual({ consumed: true, rotated_from: null });
    expect(await stored('RefreshToken', issued.jti)).toEqual({ consumed: false, rotated_from: null });
  });
});

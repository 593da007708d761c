// Audit of the refresh token reuse interval (`refresh-reuse.int.test.ts` has its bounds): concurrent
// presentations of one used token, the first use racing a reuse, failed saves of the token a refresh
// rotates to, and the deletion of expired rows, all over real HTTP to the token endpoint.
//
// Time is the database's, as in `refresh-reuse.int.test.ts`: moving `consumed_at` or `expires_at` into
// the past is what waiting would do. Faults and interleavings are made by a provider on the same
// database whose statements can be failed or held (`Database.query` wrapped, the adapter's one door to
// the pool), so no test waits on a timer for an order to happen.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../src/db.js';
import { purgeExpiredModels } from '../src/idp/adapter.js';
import { createIdp } from '../src/idp/server.js';
import { storedId } from '../src/idp/stored-id.js';
import { listen } from '../src/listen.js';
import { type RunningReferenceApp, startReferenceApp } from '../src/start.js';
import { type Credentials, codeFlow, type TokenResponse, tokenRequest } from './flow.js';
import { openTestDatabase } from './services.js';
import { alice, resource, startTestIdp, type TestIdp } from './test-idp.js';

let started: TestIdp;
let db: Database;
let running: RunningReferenceApp;
let app: Required<Credentials>;
let rigged: Awaited<ReturnType<typeof listen>>;

/** Statements of the rigged provider that fail (`failSaves` left) or wait (`hold`). */
const rig: {
  /** How many saves of a refresh token still fail, as a dropped connection would. */
  failSaves: number;
  /** How many saves of an (opaque) access token still fail. */
  failAccessTokenSaves?: number;
  /** Reads of this refresh token wait until `count` of them have been made (a real race's interleaving). */
  gate?: { token: string; count: number; waiting: Array<() => void> } | undefined;
  /** The next save of a refresh token waits for this promise. */
  holdSave?: { released: Promise<void>; reached: () => void } | undefined;
  /** Around every statement: wait before it, or fail it; told after it, with its row count. */
  before?: Hook | undefined;
  after?: After | undefined;
} = { failSaves: 0 };

type Hook = (text: string, params: readonly unknown[] | undefined) => Promise<'fail' | undefined> | undefined;
type After = (text: string, params: readonly unknown[] | undefined, rows: number) => void;

// A statement that stores a refresh token (whatever else it does): `$1` is the model.
const savesRefreshToken = (text: string, params?: readonly unknown[]) =>
  params?.[0] === 'RefreshToken' && /\binsert into idp_models\b/.test(text);

beforeAll(async () => {
  started = await startTestIdp('refresh_reuse_audit');
  ({ db, running, app } = started);
  const riggedDb: Database = {
    ...db,
    async query<Row>(text: string, params?: readonly unknown[]) {
      if ((await rig.before?.(text, params)) === 'fail') throw new Error('Connection terminated unexpectedly');
      if (rig.failAccessTokenSaves && params?.[0] === 'AccessToken' && /\binsert into idp_models\b/.test(text)) {
        rig.failAccessTokenSaves -= 1;
        throw new Error('Connection terminated unexpectedly');
      }
      if (savesRefreshToken(text, params)) {
        if (rig.failSaves > 0) {
          rig.failSaves -= 1;
          throw new Error('Connection terminated unexpectedly');
        }
        const hold = rig.holdSave;
        if (hold) {
          rig.holdSave = undefined;
          hold.reached();
          await hold.released;
        }
      }
      const result = await db.query<Row>(text, params);
      rig.after?.(text, params, result.rows.length);
      const gate = rig.gate;
      if (gate && /^\s*select\b[\s\S]*\bfrom idp_models m\b/.test(text) && params?.[1] === gate.token) {
        if (gate.waiting.length < gate.count) {
          await new Promise<void>((resolve) => {
            gate.waiting.push(resolve);
            if (gate.waiting.length === gate.count) for (const release of gate.waiting) release();
            // A request that never comes must not hang the test: the race is then only less tight.
            setTimeout(resolve, 5_000).unref();
          });
        }
      }
      return result;
    },
  };
  rigged = await listen(0);
  const idp = await createIdp({ db: riggedDb, issuer: rigged.url, resource });
  rigged.use(idp.app);
});

afterAll(async () => {
  await rigged?.close();
  await started?.close();
});

const refresh = (token: string): Promise<TokenResponse> =>
  tokenRequest(rigged.url, { grant_type: 'refresh_token', refresh_token: token }, app);

/** A signed-in alice: her refresh token, unused. */
async function signedIn(): Promise<string> {
  const { tokens } = await codeFlow(running.authUrl, app, alice);
  expect(tokens.status).toBe(200);
  return tokens.body.refresh_token as string;
}

/** A signed-in alice and her first refresh: the used token and the one it was rotated to. */
async function rotatedOnce() {
  const used = await signedIn();
  const first = await refresh(used);
  expect(first.status).toBe(200);
  return { used, successor: first.body.refresh_token as string };
}

/** `count` presentations of `token` at once, each reading it before any of them consumes it. */
async function presentAtOnce(token: string, count: number): Promise<TokenResponse[]> {
  rig.gate = { token: key(token), count, waiting: [] };
  try {
    return await Promise.all(Array.from({ length: count }, () => refresh(token)));
  } finally {
    rig.gate = undefined;
  }
}

/** The key a refresh token's row is stored under (its hash: `stored-id.ts`). */
const key = (token: string) => storedId('RefreshToken', token);

/** The grant's refresh tokens as stored, by their keys: which are unused, which were rotated from which. */
async function grantTokens(token: string) {
  const { rows } = await db.query<{ id: string; consumed: boolean; rotated_from: string | null }>(
    `select id, consumed_at is not null as consumed, rotated_from from idp_models
     where model = 'RefreshToken' and grant_id = (select payload->>'grantId' from idp_models where model = 'RefreshToken' and id = $1)`,
    [key(token)],
  );
  return rows;
}

describe('a failed save of the token a refresh rotates to (a 503 the client retries)', () => {
  // Was wrong: oidc-provider consumes the presented token, then saves its successor. The adapter took
  // the one reuse in `consume`, so a reuse whose save failed had spent it: the client's honest retry
  // of that 500 (the retry of a retry: the first answer was lost too) was a third use and revoked the
  // grant, signing the user out over two database errors in which no token was ever issued.
  it('a failed reuse spends nothing: its retry is answered, and one line of tokens lives on', async () => {
    const { used, successor } = await rotatedOnce();
    rig.failSaves = 1;
    const failed = await refresh(used);
    expect(rig.failSaves).toBe(0);
    expect(failed.status).toBe(503);
    const retry = await refresh(used);
    expect(retry.status, JSON.stringify(retry.body)).toBe(200);
    const renewed = retry.body.refresh_token as string;
    expect((await refresh(renewed)).status).toBe(200);
    // The first use's successor is superseded by the answered reuse, as after any reuse.
    expect((await refresh(successor)).body.error).toBe('invalid_grant');
  });

  // Was wrong: a failed save of the first use's successor left the token consumed (the client got a
  // 500 and no token), its retry took the one reuse, and when that save failed too, the next retry
  // revoked the grant.
  it('two failed saves in a row: the third try is answered, the grant intact', async () => {
    const token = await signedIn();
    rig.failSaves = 2;
    expect((await refresh(token)).status).toBe(503);
    expect((await refresh(token)).status).toBe(503);
    expect(rig.failSaves).toBe(0);
    const third = await refresh(token);
    expect(third.status, JSON.stringify(third.body)).toBe(200);
    const next = await refresh(third.body.refresh_token as string);
    expect(next.status, JSON.stringify(next.body)).toBe(200);
    // And the token of that third try, which a failed save never issued, has its own reuse still.
    expect((await refresh(third.body.refresh_token as string)).status).toBe(200);
  });

  // Was wrong: a refresh that asks for no API scope gets an opaque access token, which oidc-provider
  // stores after the refresh token it rotated to. A failed save of that access token was a 500 after
  // the rotation committed: the retry took the one reuse, and when that access token's save failed too,
  // the next retry revoked the grant, though no token ever reached the client. The rotation is undone.
  it('a failed save of the opaque access token spends nothing either: two in a row, the third try answered', async () => {
    const { tokens } = await codeFlow(running.authUrl, app, alice, { scope: 'openid offline_access' });
    expect(tokens.status).toBe(200);
    const token = tokens.body.refresh_token as string;
    rig.failAccessTokenSaves = 2;
    try {
      expect((await refresh(token)).status).toBe(503);
      expect((await refresh(token)).status).toBe(503);
      expect(rig.failAccessTokenSaves).toBe(0);
    } finally {
      rig.failAccessTokenSaves = 0;
    }
    const third = await refresh(token);
    expect(third.status, JSON.stringify(third.body)).toBe(200);
  });

  it('a failed save of the opaque access token after a reuse: the reuse is still ahead, the first successor not superseded', async () => {
    const { tokens } = await codeFlow(running.authUrl, app, alice, { scope: 'openid offline_access' });
    expect(tokens.status).toBe(200);
    const used = tokens.body.refresh_token as string;
    const first = await refresh(used);
    expect(first.status).toBe(200);
    const successor = first.body.refresh_token as string;
    rig.failAccessTokenSaves = 1;
    try {
      expect((await refresh(used)).status).toBe(503);
      expect(rig.failAccessTokenSaves).toBe(0);
    } finally {
      rig.failAccessTokenSaves = 0;
    }
    const tokensAfter = await grantTokens(used);
    // No token of the failed reuse is left, and the first use's successor is unused, as before it.
    expect(tokensAfter.map((row) => row.id).sort()).toEqual([key(used), key(successor)].sort());
    expect(tokensAfter.find((row) => row.id === key(successor))?.consumed).toBe(false);
    const reuse = await refresh(used);
    expect(reuse.status, JSON.stringify(reuse.body)).toBe(200);
    expect((await refresh(reuse.body.refresh_token as string)).status).toBe(200);
  });

  // Was wrong, the same way: the token was consumed before its successor's save was tried.
  it('a failed save leaves the presented token as it was: unused, its one reuse still ahead', async () => {
    const token = await signedIn();
    rig.failSaves = 1;
    expect((await refresh(token)).status).toBe(503);
    const [row] = (await grantTokens(token)).filter((stored) => stored.id === key(token));
    expect(row?.consumed).toBe(false);
  });
});

describe('startReferenceApp (what `npm start` runs) and the interval', () => {
  // Was wrong: `startReferenceApp` took no `refreshTokenReuseSeconds`, so `npm start` always ran with
  // the default 30 (REFRESH_TOKEN_REUSE_SECONDS, which `main.ts` reads, passes it on).
  it('passes refreshTokenReuseSeconds on to the provider: 0 is the strict rule', async () => {
    // A database of its own: starting seeds the app's client with this start's redirect URI.
    const own = await openTestDatabase('refresh_reuse_start');
    const strict = await startReferenceApp({
      db: own,
      authPort: 0,
      appPort: 0,
      baseUrl: resource,
      refreshTokenReuseSeconds: 0,
    });
    try {
      const client = strict.clients.app;
      const { tokens } = await codeFlow(strict.authUrl, client, alice);
      const used = tokens.body.refresh_token as string;
      const refreshHere = (token: string) =>
        tokenRequest(strict.authUrl, { grant_type: 'refresh_token', refresh_token: token }, client);
      expect((await refreshHere(used)).status).toBe(200);
      expect((await refreshHere(used)).body.error).toBe('invalid_grant');
    } finally {
      await strict.close();
      await own.close();
    }
  });
});

describe('refreshTokenReuseSeconds out of range', () => {
  // Was wrong: any safe integer was taken. The database measures the interval (`now() - interval`),
  // and one of ten million years or so is out of a timestamp's range: every refresh then failed with a
  // 500 (every read of a refresh token computes it), instead of the start refusing the value. Longer
  // than a refresh token lives (14 days) the interval means nothing anyway.
  it.each([14 * 24 * 3600 + 1, 10 ** 15])('refuses %s with a TypeError', async (seconds) => {
    await expect(createIdp({ db, issuer: rigged.url, resource, refreshTokenReuseSeconds: seconds })).rejects.toThrow(
      TypeError,
    );
  });

  it('Held: takes the refresh token lifetime itself', async () => {
    await expect(
      createIdp({ db, issuer: rigged.url, resource, refreshTokenReuseSeconds: 14 * 24 * 3600 }),
    ).resolves.toBeDefined();
  });
});

describe('concurrent presentations of one used token within the interval', () => {
  // The docs: once more only, and "a third use, still within the interval, revokes the grant". Of a
  // crowd of reuses one is the once more; every other one is a third use or later.
  it.each([2, 10])(
    'Held: of %i at once, exactly one is answered, the rest refused, and the grant ends revoked: no line lives',
    async (count) => {
      const { used, successor } = await rotatedOnce();
      const results = await presentAtOnce(used, count);
      const statuses = results.map((result) => result.status).sort();
      expect(statuses).toEqual([200, ...Array.from({ length: count - 1 }, () => 400)]);
      for (const refused of results.filter((result) => result.status !== 200)) {
        expect(refused.body.error).toBe('invalid_grant');
      }
      const answered = results.find((result) => result.status === 200)!.body.refresh_token as string;
      expect((await refresh(answered)).body.error).toBe('invalid_grant');
      expect((await refresh(successor)).body.error).toBe('invalid_grant');
      expect((await grantTokens(used)).filter((row) => !row.consumed)).toEqual([]);
    },
  );

  it('Held: the first use and its reuse at once: both answered, one line of tokens lives on', async () => {
    const token = await signedIn();
    const results = await presentAtOnce(token, 2);
    expect(results.map((result) => result.status)).toEqual([200, 200]);
    const issued = results.map((result) => result.body.refresh_token as string);
    const unused = (await grantTokens(token)).filter((row) => !row.consumed).map((row) => row.id);
    expect(unused).toHaveLength(1);
    const live = issued.find((one) => key(one) === unused[0]);
    expect(live).toEqual(expect.any(String));
    expect((await refresh(live!)).status).toBe(200);
  });
});

describe('the deletion of expired rows (purgeExpiredModels) and the reuse interval', () => {
  /** Moves the expiry of `token` into the past, as waiting for it would. */
  async function expire(token: string) {
    const { rowCount } = await db.query(
      `update idp_models set expires_at = now() - interval '1 second' where model = 'RefreshToken' and id = $1`,
      [key(token)],
    );
    expect(rowCount).toBe(1);
  }

  it('Held: a reuse, then a purge: the token the reuse issued still refreshes, the superseded one is still a replay', async () => {
    const { used, successor } = await rotatedOnce();
    const again = await refresh(used);
    expect(again.status).toBe(200);
    await expire(used);
    expect(await purgeExpiredModels(db)).toBeGreaterThanOrEqual(1);
    expect((await refresh(again.body.refresh_token as string)).status).toBe(200);
    expect((await refresh(successor)).body.error).toBe('invalid_grant');
  });

  it('Held: a used token, purged once expired, is not found: no reuse, no revival', async () => {
    const { used, successor } = await rotatedOnce();
    await expire(used);
    await purgeExpiredModels(db);
    const late = await refresh(used);
    expect(late.body.error).toBe('invalid_grant');
    // Unknown now, so it revokes nothing: the line it started lives on (oidc-provider refuses an
    // expired token the same way, without revoking, before it is purged).
    expect((await refresh(successor)).status).toBe(200);
  });

  // Was wrong: when the first use's successor was saved after a racing reuse had run (oidc-provider
  // consumes, then saves, and a reuse could come in between), that successor was marked superseded
  // only as it was read, by the reused token's row. Once that row expired (it always expires first) and
  // the purge deleted it, the superseded token read as unused again: a second line of tokens lived on,
  // in the hands of whoever held it (a thief's, if the thief had used the token first).
  it('the first use saved after its racing reuse: the token it issued stays superseded once the used token is purged', async () => {
    const token = await signedIn();
    let reached!: () => void;
    const atSave = new Promise<void>((resolve) => {
      reached = resolve;
    });
    let release!: () => void;
    rig.holdSave = {
      released: new Promise<void>((resolve) => {
        release = resolve;
      }),
      reached,
    };
    const held = refresh(token);
    await atSave;
    const other = await refresh(token);
    release();
    const first = await held;
    expect([first.status, other.status], JSON.stringify([first.body, other.body])).toEqual([200, 200]);
    // The token rotated from the presented one is the first use's; the reuse superseded it.
    const { rows } = await db.query<{ id: string }>(
      `select id from idp_models where model = 'RefreshToken' and rotated_from = $1`,
      [key(token)],
    );
    expect(rows).toHaveLength(1);
    const issued = [first.body.refresh_token as string, other.body.refresh_token as string];
    const superseded = issued.find((one) => key(one) === rows[0]!.id)!;
    expect(superseded).toEqual(expect.any(String));
    const live = issued.find((id) => id !== superseded)!;
    await expire(token);
    await purgeExpiredModels(db);
    expect((await refresh(live)).status).toBe(200);
    expect((await refresh(superseded)).body.error).toBe('invalid_grant');
  });
});

// The undo of a rotation whose opaque access token failed to save (`undoneOnFailure` in
// src/idp/adapter.ts), against a second presentation of the same token in flight (two tabs of an app
// refreshing at once): the interleaving is made by statements that wait for each other, no timer.
function signal() {
  let fire!: () => void;
  const fired = new Promise<void>((resolve) => {
    fire = resolve;
  });
  return { fired, fire };
}

const firstUse = (text: string) => /^\s*with used as \(/.test(text);
const reuse = (text: string) => /^\s*with successor as \(/.test(text);
const undo = (text: string) => /^\s*with issued as \(/.test(text);
const savesAccessToken = (text: string, params?: readonly unknown[]) =>
  params?.[0] === 'AccessToken' && /\binsert into idp_models\b/.test(text);

describe('the undo of a rotation whose opaque access token failed to save, against a second presentation', () => {
  // Was wrong: request A rotated the token (first use) and its access token's save failed; request B,
  // with the same token, tried a first use while A's rotation stood (refused: used), then A undid the
  // rotation (the token unused again), then B tried the reuse, which needs the token used: refused
  // too, B took itself for a replay and revoked the grant, signing the user out. Without the undo,
  // B's reuse was answered.
  it('B, whose first use came before the undo and reuse after it, is answered; the grant lives on', async () => {
    const { tokens } = await codeFlow(running.authUrl, app, alice, { scope: 'openid offline_access' });
    expect(tokens.status).toBe(200);
    const token = tokens.body.refresh_token as string;
    const aRotated = signal();
    const bFirstUseRefused = signal();
    const undone = signal();
    let failed = 0;
    rig.before = async (text, params) => {
      if (savesAccessToken(text, params) && failed === 0) {
        failed++;
        aRotated.fire();
        await bFirstUseRefused.fired;
        return 'fail';
      }
      if (reuse(text)) await undone.fired;
      return undefined;
    };
    rig.after = (text, _params, rows) => {
      if (firstUse(text) && rows === 0) bFirstUseRefused.fire();
      if (undo(text)) undone.fire();
    };
    try {
      const a = refresh(token);
      await aRotated.fired;
      const b = refresh(token);
      expect((await a).status).toBe(503);
      const answered = await b;
      expect(answered.status, JSON.stringify(answered.body)).toBe(200);
      const next = await refresh(answered.body.refresh_token as string);
      expect(next.status, JSON.stringify(next.body)).toBe(200);
    } finally {
      rig.before = undefined;
      rig.after = undefined;
      bFirstUseRefused.fire();
      undone.fire();
    }
  });
});

// Review of the undo of a refresh rotation whose opaque access token failed to save (`undoneOnFailure`
// in src/idp/adapter.ts), against a second presentation of the same token in flight (two tabs of an
// app refreshing at once). The interleaving is made by a provider whose statements wait for each other
// (`Database.query` wrapped, the adapter's one door to the database): no timer decides the order.
// PGlite when DATABASE_URL is unset (the embedded default), PostgreSQL when it is set.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../src/db.js';
import { createIdp } from '../src/idp/server.js';
import { listen } from '../src/listen.js';
import { demoUsers } from '../src/seed.js';
import { type RunningReferenceApp, startReferenceApp } from '../src/start.js';
import { type Credentials, codeFlow, type TokenResponse, tokenRequest } from './flow.js';
import { openTestDatabase } from './services.js';

const resource = 'http://localhost:8080';
const alice = { username: 'alice', password: demoUsers[0].password };

let db: Database;
let running: RunningReferenceApp;
let app: Required<Credentials>;
let rigged: Awaited<ReturnType<typeof listen>>;

/** What the rigged provider's statements do around the real query: wait before, tell after, or fail. */
type Hook = (text: string, params: readonly unknown[] | undefined) => Promise<'fail' | undefined> | undefined;
type After = (text: string, params: readonly unknown[] | undefined, rows: number) => void;
const rig: { before?: Hook | undefined; after?: After | undefined } = {};

beforeAll(async () => {
  db = await openTestDatabase('refresh_undo_review');
  running = await startReferenceApp({ db, authPort: 0, appPort: 0, baseUrl: resource });
  app = { ...running.clients.app };
  const riggedDb: Database = {
    ...db,
    async query<Row>(text: string, params?: readonly unknown[]) {
      if ((await rig.before?.(text, params)) === 'fail') throw new Error('Connection terminated unexpectedly');
      const result = await db.query<Row>(text, params);
      rig.after?.(text, params, result.rows.length);
      return result;
    },
  };
  rigged = await listen(0);
  const idp = await createIdp({ db: riggedDb, issuer: rigged.url, resource });
  rigged.use(idp.app);
});

afterAll(async () => {
  await rigged?.close();
  await running?.close();
  await db?.close();
});

const refresh = (token: string): Promise<TokenResponse> =>
  tokenRequest(rigged.url, { grant_type: 'refresh_token', refresh_token: token }, app);

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
      expect((await a).status).toBe(500);
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

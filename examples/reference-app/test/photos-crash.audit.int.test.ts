// Crash audit of `POST /photos`, the API's create that is not transactional: its insert commits on its
// own, and the key's record completes after it in another statement (in Redis, or here in the
// database's plain table). The app is killed between the two, and the client sends the same request
// with the same key again once the killed execution's lease is over, as @idem/client does.
//
// The window between the two writes is a millisecond; to kill the process inside it every time, a
// trigger holds the key's completion (it waits, then fails, so it never lands): exactly what a crash
// there leaves behind, a photo and a key still in progress.
import { randomBytes, randomUUID } from 'node:crypto';
import { createClient } from '@idem/client';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { demoUsers } from '../src/seed.js';
import { codeFlow } from './flow.js';
import { databaseUrl, inSchema, killableApp, postgresForCrashAudit, waitForRow } from './killable-app.js';

const alice = { username: 'alice', password: demoUsers.find((user) => user.username === 'alice')?.password ?? '' };
const available = await postgresForCrashAudit('the reference-app photos crash audit');

describe.runIf(available)('POST /photos killed between its insert and its key completing (crash audit)', () => {
  const schema = `refapp_photocrash_${randomBytes(5).toString('hex')}`;
  let admin: pg.Pool;
  let app: Awaited<ReturnType<typeof killableApp>>;

  beforeAll(async () => {
    admin = new pg.Pool({ connectionString: inSchema(databaseUrl, schema), max: 3 });
    admin.on('error', () => undefined);
    await admin.query(`create schema ${schema}`);
    app = await killableApp(schema);
  });

  afterAll(async () => {
    await app?.close();
    await admin?.query(`drop schema if exists ${schema} cascade`).catch(() => undefined);
    await admin?.end();
  });

  it('the retry with the same key after the restart answers the photo the killed execution made: one photo', {
    timeout: 90_000,
  }, async () => {
    let run = await app.running();
    const { rows: clients } = await admin.query<{ secret: string }>(
      `select payload->>'client_secret' as secret from idp_models where model = 'Client' and id = 'photo-app'`,
    );
    const photoApp = {
      clientId: 'photo-app',
      clientSecret: clients[0]?.secret ?? '',
      redirectUri: `${app.appUrl}/callback`,
    };
    const flow = await codeFlow(app.authUrl, photoApp, alice, { scope: 'openid photos:write' });
    expect(flow.tokens.status).toBe(200);
    const accessToken = flow.tokens.body.access_token as string;

    await admin.query(`
      create function audit_hold_completion() returns trigger language plpgsql as $$
      begin
        perform pg_sleep(3);
        raise exception 'crash audit: this completion never lands';
      end $$;
      create trigger audit_hold_completion before update on api_plain_idempotency_records
        for each row when (new.state = 'completed') execute function audit_hold_completion();
    `);
    const key = randomUUID();
    const title = `Crash ${randomBytes(4).toString('hex')}`;
    const send = () =>
      fetch(`${app.baseUrl}/photos`, {
        method: 'POST',
        headers: {
          authorization: `Bearer ${accessToken}`,
          'content-type': 'application/json',
          'idempotency-key': `"${key}"`,
        },
        body: JSON.stringify({ title }),
      });
    const cut = send().catch(() => undefined);
    // The photo is committed; the key's completion waits in the trigger: kill now.
    const inserted = await waitForRow(admin, 'select 1 from api_photos where title = $1', {
      ms: 10_000,
      params: [title],
    });
    await app.kill(run);
    await cut;
    expect(inserted).toBe(true);
    // Dropping the trigger waits for the held completion to fail and roll back.
    await admin.query('drop trigger audit_hold_completion on api_plain_idempotency_records');
    await admin.query('drop function audit_hold_completion()');
    const { rows: open } = await admin.query(`select 1 from api_plain_idempotency_records where state = 'in_progress'`);
    expect(open).toHaveLength(1);

    run = app.start();
    await run.ready;
    // The client's retry: the same key and body, 409 until the killed execution's lease is over.
    const client = createClient({
      baseUrl: app.baseUrl,
      getToken: () => accessToken,
      retry: { maxAttempts: 100, baseDelay: '100ms', maxDelay: '1s', deadline: '40s' },
    });
    const retried = await client.post<{ id: string; title: string }>('/photos', { title }, { idempotencyKey: key });
    expect(retried.status).toBe(201);
    const { rows: photos } = await admin.query<{ id: string }>('select id from api_photos where title = $1', [title]);
    expect(photos.map((photo) => photo.id)).toEqual([retried.body.id]);
  });
});

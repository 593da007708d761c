// Crash audit of the creates whose keys are not transactional: `POST /photos` (the API) and
// `POST /webhook-events/<id>/notes` (the receiver's admin API). Each insert commits on its own, and
// the key's record completes after it in another statement (in Redis, or here in the database's plain
// table). The app is killed between the two, and the client sends the same request with the same key
// again once the killed execution's lease is over, as @idem/client does.
//
// The window between the two writes is a millisecond; to kill the process inside it every time, a
// trigger holds the key's completion (it waits on an advisory lock this test holds until the kill,
// then fails, so it never lands): exactly what a crash there leaves behind, the created row and a key
// still in progress.
import { randomBytes, randomUUID } from 'node:crypto';
import { createClient } from '@idem/client';
import { describe, expect, it } from 'vitest';
import { codeFlow } from './flow.js';
import { postgresForCrashAudit, useCrashSchema, waitForRow } from './killable-app.js';
import { alice } from './test-idp.js';

const available = await postgresForCrashAudit('the reference-app crash audit of plain-store creates');

describe.runIf(available)('creates killed between their insert and their key completing (crash audit)', () => {
  const crash = useCrashSchema('refapp_createcrash');

  it('the retry of each with the same key after the restart answers what the killed run made: one photo, one note', {
    timeout: 90_000,
  }, async () => {
    let run = await crash.app.running();
    // The operators' public client: alice's token for it acts with her admin role on the notes.
    const flow = await codeFlow(
      crash.app.authUrl,
      { clientId: 'cli-pkce', redirectUri: 'http://127.0.0.1/callback' },
      alice,
      {
        scope: 'openid photos:write charges:write events:read events:write',
      },
    );
    expect(flow.tokens.status).toBe(200);
    const accessToken = flow.tokens.body.access_token as string;
    const client = createClient({
      baseUrl: crash.app.baseUrl,
      getToken: () => accessToken,
      retry: { maxAttempts: 100, baseDelay: '100ms', maxDelay: '1s', deadline: '40s' },
    });
    // An event at the receiver to take a note on: a charge's payment.succeeded, once delivered.
    const charge = await client.post<{ id: string }>('/charges', { amount: 100, currency: 'EUR' });
    const eventId = `evt_${charge.body.id}`;
    expect(
      await waitForRow(crash.admin, 'select 1 from receiver_events where id = $1 and applied = 1', {
        ms: 20_000,
        params: [eventId],
      }),
    ).toBe(true);

    // Held by this test until the process is killed: the completions wait on it exactly as long as
    // needed (a fixed pg_sleep was either too short on a busy box or seconds too long).
    const lockKey = Number.parseInt(randomBytes(6).toString('hex'), 16);
    const holder = await crash.admin.connect();
    await holder.query('select pg_advisory_lock($1)', [lockKey]);
    await crash.admin.query(`
      create function audit_hold_completion() returns trigger language plpgsql as $$
      begin
        perform pg_advisory_xact_lock(${lockKey});
        raise exception 'crash audit: this completion never lands';
      end $$;
      create trigger audit_hold_completion before update on api_plain_idempotency_records
        for each row when (new.state = 'completed') execute function audit_hold_completion();
    `);
    const tag = randomBytes(4).toString('hex');
    const creates = [
      {
        path: '/photos',
        body: { title: `Crash ${tag}` },
        rows: 'select id from api_photos where title = $1',
        value: `Crash ${tag}`,
      },
      {
        path: `/webhook-events/${eventId}/notes`,
        body: { text: `Crash note ${tag}` },
        rows: 'select id from receiver_event_notes where text = $1',
        value: `Crash note ${tag}`,
      },
    ].map((create) => ({ ...create, key: randomUUID() }));
    const cut = creates.map((create) =>
      fetch(`${crash.app.baseUrl}${create.path}`, {
        method: 'POST',
        headers: {
          authorization: `Bearer ${accessToken}`,
          'content-type': 'application/json',
          'idempotency-key': `"${create.key}"`,
        },
        body: JSON.stringify(create.body),
      }).catch(() => undefined),
    );
    // Both rows are committed; both keys' completions wait in the trigger: kill now.
    for (const create of creates) {
      expect(await waitForRow(crash.admin, create.rows, { ms: 10_000, params: [create.value] }), create.path).toBe(
        true,
      );
    }
    await crash.app.kill(run);
    await Promise.all(cut);
    await holder.query('select pg_advisory_unlock($1)', [lockKey]);
    holder.release();
    // Dropping the trigger waits for the held completions to fail and roll back.
    await crash.admin.query('drop trigger audit_hold_completion on api_plain_idempotency_records');
    await crash.admin.query('drop function audit_hold_completion()');
    const { rows: open } = await crash.admin.query(
      `select 1 from api_plain_idempotency_records where state = 'in_progress'`,
    );
    expect(open).toHaveLength(2);

    run = crash.app.start();
    await run.ready;
    // The client's retries: the same key and body, 409 until the killed execution's lease is over.
    const retried = await Promise.all(
      creates.map((create) =>
        client.post<{ id: string | number }>(create.path, create.body, { idempotencyKey: create.key }),
      ),
    );
    for (const [index, create] of creates.entries()) {
      expect(retried[index]?.status).toBe(201);
      const { rows } = await crash.admin.query<{ id: string }>(create.rows, [create.value]);
      expect(
        rows.map((row) => String(row.id)),
        create.path,
      ).toEqual([String(retried[index]?.body.id)]);
    }
  });
});

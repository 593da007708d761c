// Crash consistency of the reference app's start-up (audit; the rest of the crash audit is
// crash.audit.int.test.ts, this part a file of its own so the two integration workers run them side
// by side): `npm start`'s script as a child process on PostgreSQL (a schema of this file's own), on an
// empty schema, SIGKILLed as soon as each step of its start has committed something (the provider's
// tables, the seeded client, the API's tables, the outbox): each next start must finish what the
// killed one began, and the schema and seed rows are whole.
import { describe, expect, it } from 'vitest';
import { postgresForCrashAudit, useCrashSchema, waitForRow } from './killable-app.js';

const available = await postgresForCrashAudit('the reference-app start-up crash audit');

describe.runIf(available)('the reference app killed with SIGKILL during its start-up (crash audit)', () => {
  const crash = useCrashSchema('refapp_startcrash');
  const { schema } = crash;

  it('start-up killed after each of its steps: the next start finishes it, and the schema and seed rows are whole', {
    timeout: 90_000,
  }, async () => {
    // Each condition is a step of the first start that commits on its own; the start is killed the
    // moment the step shows, before the steps after it. A condition met by an earlier start (or
    // never met before the start is ready) kills a start that got further, which is fine too.
    const steps = [
      `select 1 from pg_tables where schemaname = '${schema}' and tablename = 'idp_users'`,
      `select 1 from ${schema}.idp_models where model = 'Client' and id = 'photo-app'`,
      `select 1 from pg_tables where schemaname = '${schema}' and tablename = 'api_charges'`,
      `select 1 from pg_tables where schemaname = '${schema}' and tablename = 'api_webhook_outbox'`,
    ];
    const hits: string[] = [];
    for (const step of steps) {
      const run = crash.app.start();
      const hit = await waitForRow(crash.admin, step, {
        ms: 30_000,
        until: () => run.isReady() || run.child.exitCode !== null,
      }).catch(() => false);
      await crash.app.kill(run);
      expect(run.output()).not.toMatch(/Error|error/);
      hits.push(`${hit && !run.isReady() ? 'killed at' : 'passed'}: ${step.split(' where ')[1] ?? step}`);
    }
    const run = crash.app.start();
    await run.ready;
    // What a start leaves, whole: both demo users with argon2id hashes, both clients, the provider's
    // keys, the API's tables with their seed rows and the webhook secret.
    const count = async (sql: string) => Number((await crash.admin.query<{ n: string }>(sql)).rows[0]?.n);
    expect(await count(`select count(*) as n from idp_users where password_hash like '$argon2id$%'`)).toBe(2);
    expect(await count(`select count(*) as n from idp_models where model = 'Client'`)).toBe(2);
    expect(
      await count(`select count(*) as n from idp_secrets where name in ('signing-keys', 'cookie-keys', 'csrf-key')`),
    ).toBe(3);
    expect(await count('select count(*) as n from api_stock')).toBe(120);
    expect(await count('select count(*) as n from api_photos')).toBe(5);
    expect(await count('select count(*) as n from api_webhook_secrets')).toBe(1);
    console.log(`start-up kills:\n  ${hits.join('\n  ')}`);
  });
});

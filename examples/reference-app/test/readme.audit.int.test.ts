// Audit of examples/reference-app/README.md against the app: each claim about behaviour that no other
// test file pinned, checked against the real app (the resource stack on the file's database and Redis
// prefix, the identity provider, `npm start` itself). A check marked "Was wrong" failed when the audit
// wrote it.
import type { ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { connect } from 'node:net';
import { networkInterfaces, tmpdir } from 'node:os';
import { join } from 'node:path';
import { exportJWK, generateKeyPair } from 'jose';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { type RunningResourceStack, startResourceStack } from '../src/api/resource-stack.js';
import { type Database, openDatabase } from '../src/db.js';
import { apiTables } from '../src/schema/api-schema.js';
import { type RunningReferenceApp, startReferenceApp } from '../src/start.js';
import { codeFlow } from './flow.js';
import { openTestDatabase } from './services.js';
import { portVariables, runScript, startScript } from './start-script.js';
import { alice } from './test-idp.js';
import { startTestStack, type TestStack } from './test-stack.js';

/** `text` encoded as bytes fetch sends as they are (a string it would send as UTF-8, and as text/plain). */
const bytes = (text: string, encoding: BufferEncoding = 'utf8') => new Uint8Array(Buffer.from(text, encoding));

describe('README "Errors": 415 unsupported_media_type for a body that is not JSON in UTF-8', () => {
  let test: TestStack;
  let eventId: string;

  beforeAll(async () => {
    test = await startTestStack('readme_media');
    // One delivered payment event, for the receiver's notes route.
    const charge = await send('POST', '/charges', JSON.stringify({ amount: 100, currency: 'EUR' }));
    expect(charge.status).toBe(201);
    eventId = `evt_${((await charge.json()) as { id: string }).id}`;
    expect((await test.stack.api.relayOnce()).delivered).toBe(1);
  }, 60_000);

  afterAll(async () => {
    await test?.close();
  });

  async function send(
    method: string,
    path: string,
    body: string | Uint8Array<ArrayBuffer>,
    headers: Record<string, string> = { 'content-type': 'application/json' },
    key = `"${randomUUID()}"`,
  ): Promise<Response> {
    const token = await test.token({ roles: ['admin'] });
    return fetch(new URL(path, test.stack.gateway.url), {
      method,
      headers: { authorization: `Bearer ${token}`, 'idempotency-key': key, ...headers },
      body,
    });
  }

  const routes = () =>
    [
      ['POST', '/charges', { amount: 100, currency: 'EUR' }],
      ['POST', '/photos', { title: 'Harbour' }],
      ['PUT', '/settings', { theme: 'dark' }],
      ['PUT', '/stock/item-1', { level: 3 }],
      ['POST', '/stock/batch', { items: ['item-1'] }],
      ['POST', `/webhook-events/${eventId}/notes`, { text: 'Customer called' }],
    ] as const;

  // Was missing from the README's table: the refusals of the two stock reads besides a single
  // unknown item.
  it('the stock reads answer as the table says: 422 for a bad ?item, 404 naming every unknown id of a batch, 422 over 100', async () => {
    const token = await test.token({ scope: 'stock:read' });
    const get = (path: string, init: RequestInit = {}) =>
      fetch(new URL(path, test.stack.gateway.url), {
        ...init,
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      });
    for (const query of ['', '?item=item-1&item=item-2', '?item=no%20such']) {
      const refused = await get(`/stock${query}`);
      expect(refused.status, query).toBe(422);
      expect(await refused.json(), query).toMatchObject({ code: 'validation_failed', invalid: ['item'] });
    }
    expect(await (await get('/stock?item=nope')).json()).toMatchObject({ status: 404, code: 'unknown_item' });
    const batch = (items: string[]) => get('/stock/batch', { method: 'POST', body: JSON.stringify({ items }) });
    const unknown = await batch(['item-1', 'nope-1', 'nope-2']);
    expect(unknown.status).toBe(404);
    expect(await unknown.json()).toMatchObject({ code: 'unknown_item', unknownItems: ['nope-1', 'nope-2'] });
    const tooMany = await batch(Array.from({ length: 101 }, () => 'item-1'));
    expect(tooMany.status).toBe(422);
    expect(await tooMany.json()).toMatchObject({ code: 'too_many_items', maxItems: 100 });
  });

  // Was wrong: body-parser takes any charset that starts with `utf-` (RFC 8259 allowed UTF-16 and
  // UTF-32 once), so `application/json; charset=utf-16` with UTF-16 bytes made a charge (201), saved
  // settings and added a photo; the README says a charset other than UTF-8 is 415, and RFC 8259 has
  // JSON between systems in UTF-8 only. `charset=utf-32` was 400 body_malformed.
  it.each(['utf-16', 'utf-16le', 'UTF-32'])(
    'refuses JSON in charset=%s with 415 on every route that reads a body, before its key is claimed',
    async (charset) => {
      for (const [method, path, json] of routes()) {
        const key = `"${randomUUID()}"`;
        const encoding = charset.toLowerCase().startsWith('utf-16') ? 'utf16le' : 'utf8';
        const refused = await send(
          method,
          path,
          bytes(JSON.stringify(json), encoding),
          { 'content-type': `application/json; charset=${charset}` },
          key,
        );
        expect(refused.status, `${method} ${path}`).toBe(415);
        expect(refused.headers.get('content-type')).toContain('application/problem+json');
        expect(await refused.json()).toMatchObject({ status: 415, code: 'unsupported_media_type' });
        // The key was not used up: the same key with the body in UTF-8 runs.
        const sent = await send(method, path, JSON.stringify(json), { 'content-type': 'application/json' }, key);
        expect(sent.status, `${method} ${path}`).toBeLessThan(300);
      }
    },
  );

  it.each(['application/json; charset=utf-8', 'application/json; charset="UTF-8"', 'application/json'])(
    'takes %s',
    async (contentType) => {
      for (const [method, path, json] of routes()) {
        const sent = await send(method, path, JSON.stringify(json), { 'content-type': contentType });
        expect(sent.status, `${method} ${path}`).toBeLessThan(300);
      }
    },
  );

  // Was wrong: `charset=utf8` (no hyphen: a label of UTF-8 in the WHATWG Encoding standard, which
  // Node's Buffer and @idem/core's fingerprint both take for UTF-8, and which some clients send) was
  // 415 on every route: the API's body-parser takes only `utf-` charsets, and the receiver's notes
  // route took `utf-8` only. Decided: `utf8` is UTF-8 everywhere.
  it('takes application/json; charset=utf8, UTF-8 under its other name', async () => {
    for (const [method, path, json] of routes()) {
      const sent = await send(method, path, JSON.stringify(json), { 'content-type': 'application/json; charset=utf8' });
      expect(sent.status, `${method} ${path}`).toBeLessThan(300);
    }
  });

  // Was wrong: the receiver's notes route read any body as JSON whatever its Content-Type (text/plain,
  // a form, none at all, JSON in latin1), and added the note (201); the README's 415 for a body that
  // is not JSON held for the API's routes only.
  it.each([['text/plain'], ['application/x-www-form-urlencoded'], ['application/json; charset=latin1'], [undefined]])(
    'refuses a note sent as %s (undefined: no Content-Type) with 415, and adds nothing',
    async (contentType) => {
      const path = `/webhook-events/${eventId}/notes`;
      const before = await notesOf(eventId);
      const refused = await send(
        'POST',
        path,
        // Bytes, not a string: fetch would make a string text/plain by itself.
        bytes(JSON.stringify({ text: `sent as ${contentType}` })),
        contentType === undefined ? {} : { 'content-type': contentType },
      );
      expect(refused.status).toBe(415);
      expect(await refused.json()).toMatchObject({ status: 415, code: 'unsupported_media_type' });
      expect(await notesOf(eventId)).toEqual(before);
    },
  );

  // "A role says who the user is; a scope says what the user let this client do. The admin routes need
  // both": a token with every scope but without the admin role gets 403 insufficient_scope, in the
  // realm and with the metadata of the gateway's 401s, and no `scope` to step up to (none would help).
  it.each([
    ['PUT', '/stock/item-1', '{"level":2}'],
    ['GET', '/webhook-events', undefined],
    ['POST', '/webhook-events/evt_x/notes', '{"text":"x"}'],
  ])('refuses %s %s to a token without the admin role with 403, naming no scope', async (method, path, body) => {
    const token = await test.token({ roles: [] });
    const refused = await fetch(new URL(path, test.stack.gateway.url), {
      method,
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', 'idempotency-key': '"k"' },
      ...(body === undefined ? {} : { body }),
    });
    expect(refused.status).toBe(403);
    expect(await refused.json()).toMatchObject({ status: 403, code: 'insufficient_scope' });
    const challenge = refused.headers.get('www-authenticate') ?? '';
    expect(challenge).toMatch(/^Bearer realm="reference-api", error="insufficient_scope"/);
    expect(challenge).toContain(`resource_metadata="${test.audience}/.well-known/oauth-protected-resource"`);
    expect(challenge).not.toContain('scope="');
  });

  async function notesOf(id: string): Promise<unknown[]> {
    const token = await test.token({ roles: ['admin'] });
    const shown = await fetch(new URL(`/webhook-events/${id}`, test.stack.gateway.url), {
      headers: { authorization: `Bearer ${token}` },
    });
    expect(shown.status).toBe(200);
    return ((await shown.json()) as { notes: unknown[] }).notes;
  }
});

// A non-loopback address of this machine, where one exists: what another machine would connect to.
const outsideAddress = Object.values(networkInterfaces())
  .flat()
  .find((address) => address !== undefined && !address.internal && address.family === 'IPv4')?.address;

function connects(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ host, port });
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
  });
}

/** The rows `sql` reads from the app's database in `dataDir`, opened for this query alone. */
async function rowsIn<Row>(dataDir: string, sql: string): Promise<Row[]> {
  const db = await openDatabase({ dataDir });
  try {
    return (await db.query<Row>(sql)).rows;
  } finally {
    await db.close();
  }
}

describe('README: what `npm start` prints, where it listens, and Ctrl-C', () => {
  const { spawnApp } = startScript('idem-readme-audit-');
  let child: ChildProcess;
  let ports: Record<string, number>;
  let output = '';
  let exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  let dataDir: string;

  beforeAll(async () => {
    const spawned = await spawnApp(process.execPath, ['examples/reference-app/start.mjs']);
    child = spawned.child;
    dataDir = spawned.dir;
    ports = Object.fromEntries(portVariables.map((name, index) => [name, spawned.ports[index] as number]));
    exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
    await new Promise<void>((resolve, reject) => {
      const onData = (chunk: Buffer) => {
        output += chunk.toString();
        if (output.includes('Ctrl-C stops everything.')) resolve();
      };
      child.stdout?.on('data', onData);
      child.stderr?.on('data', onData);
      void exited.then(() => reject(new Error(`npm start exited early:\n${output}`)));
    });
  }, 60_000);

  // "`npm start` prints every URL and the demo logins": the table's URLs on the ports given.
  it('prints the URL of every component of the table, and the demo logins with their roles', () => {
    const lines = output.split('\n').map((line) => line.trim().replace(/\s+/g, ' '));
    expect(lines).toContain(`identity provider http://localhost:${ports.AUTH_PORT}`);
    expect(lines).toContain(`third-party app http://localhost:${ports.APP_PORT} <- open this`);
    expect(lines).toContain(`gateway (API) http://localhost:${ports.GATEWAY_PORT}`);
    expect(lines).toContain(`API (loopback) http://127.0.0.1:${ports.API_PORT}`);
    expect(
      lines.some((line) => line.startsWith(`webhook receiver http://localhost:${ports.RECEIVER_PORT}/?token=`)),
    ).toBe(true);
    expect(lines).toContain('alice / alice-demo-password (admin)');
    expect(lines).toContain('bob / bob-demo-password');
  });

  // "The receiver's page (the link `npm start` prints, with a token ...; 403 without it)".
  it("opens the receiver's page with the printed link, and answers 403 without its token", async () => {
    const link = /webhook receiver\s+(\S+)/.exec(output)?.[1] ?? '';
    const page = await fetch(link);
    expect(page.status).toBe(200);
    expect(await page.text()).toContain('<h1>');
    const bare = new URL(link);
    bare.search = '';
    expect((await fetch(bare)).status).toBe(403);
    bare.searchParams.set('token', 'x'.repeat(43));
    expect((await fetch(bare)).status).toBe(403);
  });

  // "API (loopback only)": nothing of the demo answers on another address of the machine.
  it.runIf(outsideAddress !== undefined)('binds every component to loopback only', async () => {
    for (const [name, port] of Object.entries(ports)) {
      expect(await connects('127.0.0.1', port), name).toBe(true);
      expect(await connects(outsideAddress as string, port), name).toBe(false);
    }
  });

  // "stops cleanly on Ctrl-C": SIGINT as on SIGTERM (which npm-start.int.test.ts pins), exit 0.
  it('stops on SIGINT (Ctrl-C) with status 0, its ports closed', async () => {
    process.kill(child.pid as number, 'SIGINT');
    expect(await exited).toEqual({ code: 0, signal: null });
    expect(output).toContain('SIGINT: stopping');
    for (const [name, port] of Object.entries(ports)) expect(await connects('127.0.0.1', port), name).toBe(false);
  }, 30_000);

  // "`npm run seed` seeds without starting" and "`npm run rotate ... -- <step>` rotates one of these
  // secrets", of the database `npm start` uses: with DATA_DIR, that folder.
  // Was wrong: both opened examples/reference-app/data/ whatever DATA_DIR said, so an operator who
  // runs the demo from DATA_DIR rotated the secret of another database (or made a new one there) and
  // was told "done"; the seed likewise went to the default folder.
  it('runs `npm run rotate` and `npm run seed` on the folder DATA_DIR names', async () => {
    await exited;
    const secret = async () =>
      (await rowsIn<{ secret: string }>(dataDir, 'select secret from api_webhook_secrets'))[0]?.secret;
    const before = await secret();
    expect(before).toMatch(/^whsec_/);
    const rotated = await runScript('src/rotate-secrets.ts', ['webhook'], { DATA_DIR: dataDir });
    expect(rotated.code, rotated.output).toBe(0);
    expect(rotated.output).toContain('webhook: done');
    const after = await secret();
    expect(after).toMatch(/^whsec_/);
    expect(after).not.toBe(before);

    const fresh = await mkdtemp(join(tmpdir(), 'idem-readme-seed-'));
    try {
      const seeded = await runScript('src/seed.ts', [], { DATA_DIR: fresh });
      expect(seeded.code, seeded.output).toBe(0);
      const rows = await rowsIn<{ username: string }>(fresh, 'select username from idp_users order by username');
      expect(rows.map((row) => row.username)).toEqual(['alice', 'bob']);
    } finally {
      await rm(fresh, { recursive: true, force: true });
      await rm(`${fresh}.lock`, { force: true });
    }
  }, 60_000);
});

describe('README "Storage": the outbox keeps dead-lettered events 30 days', () => {
  let db: Database;
  let stack: RunningResourceStack;

  beforeAll(async () => {
    db = await openTestDatabase('readme_purge');
    const pair = await generateKeyPair('ES256');
    const jwk = { ...(await exportJWK(pair.publicKey)), kid: 'readme-purge', alg: 'ES256' };
    stack = await startResourceStack({
      db,
      gatewayPort: 0,
      apiPort: 0,
      receiverPort: 0,
      baseUrl: 'http://gateway.readme-purge-test',
      issuers: [{ issuer: 'https://issuer.readme-purge-test.example', jwks: { keys: [jwk] }, algorithms: ['ES256'] }],
      relay: false,
      seed: false,
      // A pass every 50 ms, so the test sees one without waiting ten minutes.
      purgeEveryMs: 50,
    });
  }, 60_000);

  afterAll(async () => {
    await stack?.close();
    await db?.close();
  });

  const statusOf = async (id: string) =>
    (await db.query<{ status: string }>(`select status from ${apiTables.outbox} where id = $1`, [id])).rows[0]?.status;

  // Was wrong: "dead-lettered ones after 30 [days]" read as 30 days after an event was dead-lettered,
  // the time an operator has to requeue it. The purge counts from the event's creation (or last
  // requeue), and the API's sender retries for 365 days (webhookSchedule.horizon), so an event
  // dead-lettered at its horizon, the usual way to die here, was already 365 days old: the next pass,
  // within ten minutes, deleted it unseen. Decided: dead rows are kept the horizon and 30 days
  // (outboxKept.dead '395d'). Now the outbox counts from when a row died (dead_at), and dead rows
  // are kept 30 days after that (outboxKept.dead '30d'), as the README says.
  it('keeps an event dead-lettered at its horizon a moment ago', async () => {
    const dead = 'evt_readme_horizon';
    // Attempted once, added 366 days ago: its next claim dead-letters it (past the 365-day horizon).
    await db.query(
      `insert into ${apiTables.outbox} (id, url, body, status, attempts, created_at, next_attempt_at)
       values ($1, 'http://127.0.0.1:9/webhooks', '\\x7b7d', 'pending', 1, now() - interval '366 days', now())`,
      [dead],
    );
    expect((await stack.api.relayOnce()).dead).toBe(1);
    expect(await statusOf(dead)).toBe('dead');
    // A row the purge deletes, added after the dead-lettering: once it is gone, a pass ran since.
    const witness = 'evt_readme_delivered_8d';
    await db.query(
      `insert into ${apiTables.outbox} (id, url, body, status, delivered_at)
       values ($1, 'http://127.0.0.1:9/webhooks', '\\x7b7d', 'delivered', now() - interval '8 days')`,
      [witness],
    );
    await vi.waitFor(async () => expect(await statusOf(witness)).toBeUndefined(), { timeout: 10_000, interval: 25 });
    expect(await statusOf(dead)).toBe('dead');
  });
});

describe('README "What the identity provider enforces": refresh tokens', () => {
  let db: Database;
  let running: RunningReferenceApp;

  beforeAll(async () => {
    db = await openTestDatabase('readme_idp');
    running = await startReferenceApp({ db, authPort: 0, appPort: 0, baseUrl: 'http://gateway.readme-idp-test' });
  }, 60_000);

  afterAll(async () => {
    await running?.close();
    await db?.close();
  });

  // "A refresh token needs `offline_access` and `prompt=consent`": idp.int.test.ts pins the first half
  // (no offline_access, no refresh token); this is the second.
  it.each(['login', 'consent'])(
    'gives a refresh token for offline_access only with prompt=consent (prompt=%s)',
    async (prompt) => {
      const { tokens } = await codeFlow(running.authUrl, running.clients.app, alice, {
        scope: 'openid offline_access photos:read',
        prompt,
      });
      expect(tokens.status).toBe(200);
      expect(typeof tokens.body.access_token).toBe('string');
      if (prompt === 'consent') expect(typeof tokens.body.refresh_token).toBe('string');
      else expect(tokens.body.refresh_token).toBeUndefined();
    },
  );
});

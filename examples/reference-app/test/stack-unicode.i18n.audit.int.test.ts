// Audit (internationalisation): a user whose subject, name and email are not ASCII, through the whole
// stack: the third-party app shows them escaped in a UTF-8 page, the gateway and API take their
// token, their charges replay under their key (a non-ASCII subject in the idempotency scope), and
// text outside ASCII in keys, headers and bodies gets a clear 4xx problem, never a 500.
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createUser } from '../src/idp/users.js';
import { codeFlow, loginAndConsent } from './flow.js';
import { startWholeStack, type WholeStack } from './test-stack.js';
import { createUserAgent } from './user-agent.js';

const scope = 'openid profile email offline_access photos:read charges:write';
const zoe = {
  id: 'zoë-åström',
  username: 'zoë',
  password: 'Grüße aus Köln ☕',
  name: 'Zoë <Åström> & "日本"',
  email: 'zoë@bücher.example',
};

let whole: WholeStack;
let accessToken = '';

beforeAll(async () => {
  whole = await startWholeStack('i18n_audit');
  await createUser(whole.db, zoe);
  const flow = await codeFlow(whole.running.authUrl, whole.running.clients.app, zoe, { scope });
  expect(flow.tokens.status).toBe(200);
  accessToken = flow.tokens.body.access_token as string;
}, 120_000);

afterAll(async () => {
  await whole?.close();
});

function post(path: string, body: string, headers: Record<string, string> = {}) {
  return fetch(new URL(path, whole.stack.gateway.url), {
    method: 'POST',
    headers: { authorization: `Bearer ${accessToken}`, 'content-type': 'application/json', ...headers },
    body,
  });
}

async function problem(response: Response) {
  expect(response.headers.get('content-type')).toMatch(/^application\/problem\+json/);
  return (await response.json()) as { code?: string; status: number; detail: string };
}

describe('a user whose identity is not ASCII', () => {
  it('is shown by the third-party app escaped, in a page that declares UTF-8', async () => {
    const agent = createUserAgent();
    const app = (path: string) => new URL(path, whole.running.appUrl).href;
    const callback = await loginAndConsent(
      agent,
      whole.running.authUrl,
      app('/signin'),
      new URL('/callback', whole.running.appUrl).href,
      zoe,
    );
    const landed = await agent.request(callback.href);
    const page = await agent.request(app(landed.response.headers.get('location') ?? '/'));
    expect(page.response.headers.get('content-type')).toBe('text/html; charset=utf-8');
    expect(page.body).toContain('<meta charset="utf-8">');
    expect(page.body).toContain('<strong id="user-name">Zoë &lt;Åström&gt; &amp; &quot;日本&quot;</strong>');
    expect(page.body).toContain('<span id="user-email">zoë@bücher.example</span>');
    expect(page.body).toContain('<code>zoë-åström</code>');
  });

  it('charges once under a key, and the retry replays (the scope holds a non-ASCII subject)', async () => {
    const key = randomUUID();
    const body = JSON.stringify({ amount: 700, currency: 'EUR' });
    const first = await post('/charges', body, { 'idempotency-key': key });
    expect(first.status).toBe(201);
    const firstBody = await first.text();
    const again = await post('/charges', body, { 'idempotency-key': key });
    expect(again.status).toBe(201);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(await again.text()).toBe(firstBody);
    const { rows } = await whole.db.query<{ n: string }>(
      'select count(*)::text as n from api_charges where owner = $1 and idempotency_key = $2',
      [zoe.id, key],
    );
    expect(rows[0]?.n).toBe('1');
  });

  it('a key outside ASCII, sent through the gateway, is a 400 key_invalid problem', async () => {
    const response = await post('/charges', JSON.stringify({ amount: 700, currency: 'EUR' }), {
      'idempotency-key': 'clé-1',
    });
    expect(response.status).toBe(400);
    expect((await problem(response)).code).toBe('key_invalid');
  });

  it('a currency or a member outside ASCII is a 422 problem (how the API refuses a body), in UTF-8 JSON', async () => {
    for (const json of [
      { amount: 700, currency: 'ÉUR' },
      { amount: 700, currency: 'EUR', mémo: '日本' },
    ]) {
      const response = await post('/charges', JSON.stringify(json), { 'idempotency-key': randomUUID() });
      expect(response.status).toBe(422);
      expect((await problem(response)).status).toBe(422);
    }
  });

  it('a latin1 byte in another request header is passed on without harm', async () => {
    const response = await post('/charges', JSON.stringify({ amount: 700, currency: 'EUR' }), {
      'idempotency-key': randomUUID(),
      'x-note': 'café',
    });
    expect(response.status).toBe(201);
  });
});

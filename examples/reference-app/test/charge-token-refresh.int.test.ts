// A charge whose access token the API refuses while the session still holds it for valid: the app's
// client asks getToken for a fresh token once (`{ refresh: true }`, after a 401 invalid_token), and
// the app must refresh the session then, once per session however many requests ask at the same
// time, instead of handing back the token just refused. The home page's reads and the theme, which
// call the API without @idem/client, do the same. The whole app on real PostgreSQL and Redis.
//
// A JWT access token cannot be recalled at the provider, so the token is made one the API refuses
// in the session's row: its signature broken, its expiry left as it was. The gateway answers it
// 401 `invalid_token`, as it answers a token of a retired key or one an API clock ahead calls expired.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createSessionStore, type SessionTokens } from '../src/app/sessions.js';
import { storedId } from '../src/idp/stored-id.js';
import { loginAndConsent, tokenRequest } from './flow.js';
import { writeSession } from './store-write.js';
import { alice } from './test-idp.js';
import { startWholeStack, type WholeStack } from './test-stack.js';
import { createUserAgent, formField, type UserAgent } from './user-agent.js';

let whole: WholeStack;

beforeAll(async () => {
  whole = await startWholeStack('charge_token_refresh');
}, 120_000);

afterAll(async () => {
  await whole?.close();
});

const appUrl = (path: string) => new URL(path, whole.running.appUrl).href;
const sessions = () => createSessionStore(whole.db, { ttlSeconds: 3600 });
const sessionId = (agent: UserAgent) => agent.jar.cookies.get('app_session')?.value ?? '';

async function signIn(): Promise<UserAgent> {
  const agent = createUserAgent();
  const callback = await loginAndConsent(agent, whole.running.authUrl, appUrl('/signin'), appUrl('/callback'), alice);
  await agent.request(callback.href);
  return agent;
}

/** The session's tokens, with the access token replaced by one the API refuses (a broken signature). */
async function refuseAccessToken(agent: UserAgent): Promise<SessionTokens> {
  const tokens = (await sessions().get(sessionId(agent)))?.tokens;
  expect(tokens?.refreshToken).toEqual(expect.any(String));
  const [header, payload, signature = ''] = tokens!.accessToken.split('.');
  const broken = `${header}.${payload}.${signature.startsWith('A') ? 'B' : 'A'}${signature.slice(1)}`;
  await writeSession(sessions(), sessionId(agent), { tokens: { ...tokens!, accessToken: broken } });
  return { ...tokens!, accessToken: broken };
}

/** How many refresh tokens the grant of `refreshToken` has had: one more per refresh. */
async function refreshTokensOfGrant(refreshToken: string): Promise<number> {
  const { rows } = await whole.db.query<{ count: number }>(
    `select count(*)::int as count from idp_models where model = 'RefreshToken' and grant_id =
       (select grant_id from idp_models where model = 'RefreshToken' and id = $1)`,
    [storedId('RefreshToken', refreshToken)],
  );
  return rows[0]?.count ?? 0;
}

/** Posts the charge form of `page`: loaded before the token is broken, as the home page refreshes too. */
async function postCharge(agent: UserAgent, page: { body: string }, amount: string) {
  const posted = await agent.postForm(appUrl('/charges'), {
    csrf: formField(page.body, 'csrf'),
    amount,
    currency: 'EUR',
  });
  expect(posted.response.status).toBe(303);
  return agent.request(appUrl(posted.response.headers.get('location') ?? '/'));
}

describe('a charge whose access token the API refuses (401 invalid_token)', () => {
  it('goes through after one refresh of the session, with the refreshed token', async () => {
    const agent = await signIn();
    const page = await agent.request(appUrl('/'));
    const refused = await refuseAccessToken(agent);
    const before = await refreshTokensOfGrant(refused.refreshToken!);
    const shown = await postCharge(agent, page, '700');
    expect(shown.body).toContain('Charge created.');
    expect(shown.body).toContain('Attempts: 2');
    const after = (await sessions().get(sessionId(agent)))?.tokens;
    expect(after?.accessToken).not.toBe(refused.accessToken);
    expect(after?.refreshToken).not.toBe(refused.refreshToken);
    expect(await refreshTokensOfGrant(refused.refreshToken!)).toBe(before + 1);
    // The grant is whole: no refresh token was presented twice.
    const check = await tokenRequest(
      whole.running.authUrl,
      { grant_type: 'refresh_token', refresh_token: after!.refreshToken! },
      whole.running.clients.app,
    );
    expect(check.status, JSON.stringify(check.body)).toBe(200);
  });

  it('refreshes once for two charges of one session refused at the same time', async () => {
    const agent = await signIn();
    const pages = [await agent.request(appUrl('/')), await agent.request(appUrl('/'))];
    const refused = await refuseAccessToken(agent);
    const before = await refreshTokensOfGrant(refused.refreshToken!);
    const shown = await Promise.all([postCharge(agent, pages[0]!, '710'), postCharge(agent, pages[1]!, '720')]);
    for (const page of shown) expect(page.body).toContain('Charge created.');
    expect(await refreshTokensOfGrant(refused.refreshToken!)).toBe(before + 1);
    const after = (await sessions().get(sessionId(agent)))?.tokens;
    const check = await tokenRequest(
      whole.running.authUrl,
      { grant_type: 'refresh_token', refresh_token: after!.refreshToken! },
      whole.running.clients.app,
    );
    expect(check.status, JSON.stringify(check.body)).toBe(200);
  });

  it('without a refresh token, gives no token: the charge fails as the API answered', async () => {
    const agent = await signIn();
    const page = await agent.request(appUrl('/'));
    const refused = await refuseAccessToken(agent);
    await writeSession(sessions(), sessionId(agent), { tokens: { ...refused, refreshToken: undefined } });
    const shown = await postCharge(agent, page, '730');
    expect(shown.body).toContain('The API refused: 401');
    expect(shown.body).toContain('Attempts: 1');
    // Still signed in: a refused token is no sign-out.
    expect((await agent.request(appUrl('/'))).body).toContain('Alice Liddell');
  });
});

describe('the home page and the theme when the API refuses the access token (401 invalid_token)', () => {
  it('the home page shows photos, stock and settings after one refresh shared by all its reads', async () => {
    const agent = await signIn();
    const refused = await refuseAccessToken(agent);
    const before = await refreshTokensOfGrant(refused.refreshToken!);
    // Five reads (photos, settings, three stock items) refused at once: one refresh, never five
    // presentations of one refresh token (the provider would revoke the grant at the second).
    const page = await agent.request(appUrl('/'));
    expect(page.response.status).toBe(200);
    expect(page.body).not.toContain('The API refused');
    expect(page.body).toContain('&quot;item&quot;: &quot;item-1&quot;');
    expect(page.body).toContain('&quot;theme&quot;: &quot;light&quot;');
    expect(await refreshTokensOfGrant(refused.refreshToken!)).toBe(before + 1);
    const after = (await sessions().get(sessionId(agent)))?.tokens;
    expect(after?.accessToken).not.toBe(refused.accessToken);
    const check = await tokenRequest(
      whole.running.authUrl,
      { grant_type: 'refresh_token', refresh_token: after!.refreshToken! },
      whole.running.clients.app,
    );
    expect(check.status, JSON.stringify(check.body)).toBe(200);
  });

  it('the theme is set after one refresh, with the refreshed token', async () => {
    const agent = await signIn();
    const page = await agent.request(appUrl('/'));
    const refused = await refuseAccessToken(agent);
    const before = await refreshTokensOfGrant(refused.refreshToken!);
    const posted = await agent.postForm(appUrl('/theme'), { csrf: formField(page.body, 'csrf'), theme: 'dark' });
    expect(posted.response.status).toBe(303);
    expect(await refreshTokensOfGrant(refused.refreshToken!)).toBe(before + 1);
    const shown = await agent.request(appUrl(posted.response.headers.get('location') ?? '/'));
    expect(shown.body).toContain('Theme set to dark.');
    expect(shown.body).toContain('&quot;theme&quot;: &quot;dark&quot;');
    // The page that showed it used the refreshed token: still one refresh.
    expect(await refreshTokensOfGrant(refused.refreshToken!)).toBe(before + 1);
  });

  it('without a refresh token, the home page and the theme show the 401 and refresh nothing', async () => {
    const agent = await signIn();
    const page = await agent.request(appUrl('/'));
    const refused = await refuseAccessToken(agent);
    const before = await refreshTokensOfGrant(refused.refreshToken!);
    await writeSession(sessions(), sessionId(agent), { tokens: { ...refused, refreshToken: undefined } });
    const home = await agent.request(appUrl('/'));
    expect(home.body.match(/The API refused: 401/g)).toHaveLength(3);
    const posted = await agent.postForm(appUrl('/theme'), { csrf: formField(page.body, 'csrf'), theme: 'dark' });
    const shown = await agent.request(appUrl(posted.response.headers.get('location') ?? '/'));
    expect(shown.body).toContain('<title>Theme: The API refused: 401 ');
    expect(shown.body).toContain('<li>The API refused: 401 ');
    expect(shown.body).not.toContain('Theme set to dark.');
    expect(await refreshTokensOfGrant(refused.refreshToken!)).toBe(before);
    // Still signed in, still holding the token it had: a refused token is no sign-out.
    expect(shown.body).toContain('Alice Liddell');
    expect((await sessions().get(sessionId(agent)))?.tokens?.accessToken).toBe(refused.accessToken);
  });
});

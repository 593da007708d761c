// Audit (internationalisation): people whose names and passwords are not ASCII sign in at the
// provider as anyone else does, whichever Unicode normalisation form their keyboard produced.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../src/db.js';
import { createUser, maxPasswordLength } from '../src/idp/users.js';
import type { RunningReferenceApp } from '../src/start.js';
import { type Credentials, openLoginForm, tokenRequest } from './flow.js';
import { startTestIdp, type TestIdp } from './test-idp.js';
import { decodeJwt, formAction, formField } from './user-agent.js';

// Composed (NFC) as most keyboards type them; macOS file names, some input methods and copy-paste
// from decomposed sources give the NFD spelling of the very same text.
const nfc = {
  username: 'zoë.åström',
  password: 'Grüße aus Köln, café ☕',
  name: 'Zoë Åström <b>&amp;',
  email: 'zoë@bücher.example',
};
const nfd = { username: nfc.username.normalize('NFD'), password: nfc.password.normalize('NFD') };

let started: TestIdp;
let db: Database;
let running: RunningReferenceApp;
let app: Required<Credentials>;

beforeAll(async () => {
  // PGlite in memory: nothing shared with the other suites running on this machine.
  started = await startTestIdp('idp_unicode', { embedded: true });
  ({ db, running, app } = started);
  await createUser(db, { ...nfc, id: 'user-zoe' });
}, 60_000);

afterAll(() => started?.close());

/** Opens the login page for the app and posts the credentials; the login answer and the agent. */
async function signIn(credentials: { username: string; password: string }) {
  const { agent, action, csrf, verifier } = await openLoginForm(running.authUrl, app);
  const login = await agent.postForm(action, {
    csrf,
    username: credentials.username,
    password: credentials.password,
  });
  return { agent, login, verifier };
}

describe('sign-in with non-ASCII usernames and passwords', () => {
  it('signs in with the composed (NFC) spelling it was created with', async () => {
    const { login } = await signIn(nfc);
    expect(login.response.status).toBe(303);
  });

  it('signs in with the decomposed (NFD) spelling of the same username and password', async () => {
    const { login } = await signIn(nfd);
    expect(login.body).not.toContain('id="login-error"');
    expect(login.response.status).toBe(303);
  });

  it('still refuses a password that differs by more than its normalisation', async () => {
    const { login } = await signIn({ username: nfc.username, password: nfc.password.replace('ü', 'u') });
    expect(login.response.status).toBe(200);
    expect(login.body).toContain('id="login-error"');
  });

  // The password limit counts NFC characters at sign-up and at login alike: 'e' + U+0301 is two
  // characters as sent and one (é) once normalised. A password of exactly the limit once normalised,
  // sent decomposed (twice as long), is an account, and signs in decomposed or composed; one character
  // more is refused by both. Measured as sent at sign-up, the first would have been refused there
  // and signed in at the form; measured as sent at login, the form would have refused its owner.
  it('measures the password limit after NFC at sign-up and at login alike', async () => {
    const composed = '\u00e9'.repeat(maxPasswordLength);
    const decomposed = composed.normalize('NFD');
    expect([composed.length, decomposed.length]).toEqual([maxPasswordLength, 2 * maxPasswordLength]);
    const account = { name: 'Limit', email: 'limit@example.com' };
    await createUser(db, { ...account, username: 'nfc-limit', password: decomposed });
    const signedIn = [(await signIn({ username: 'nfc-limit', password: decomposed })).login.response.status];
    signedIn.push((await signIn({ username: 'nfc-limit', password: composed })).login.response.status);
    expect(signedIn).toEqual([303, 303]);
    await expect(
      createUser(db, { ...account, username: 'nfc-over-limit', password: `${decomposed}e\u0301` }),
    ).rejects.toThrow(/at most 1024 characters/);
    const over = await signIn({ username: 'nfc-limit', password: `${decomposed}e\u0301` });
    expect(over.login.response.status).toBe(200);
    expect(over.login.body).toContain('id="login-error"');
  });

  it('puts the name and email into the ID token exactly, and escapes them on the consent page', async () => {
    const { agent, login, verifier } = await signIn(nfc);
    const consent = await agent.follow(new URL(login.response.headers.get('location')!, running.authUrl).href, (url) =>
      url.startsWith(app.redirectUri),
    );
    expect(consent.response.headers.get('content-type')).toBe('text/html; charset=utf-8');
    expect(consent.body).toContain('<meta charset="utf-8">');
    expect(consent.body).toContain('Zoë Åström &lt;b&gt;&amp;amp;');
    const allow = await agent.postForm(new URL(formAction(consent.body, 'consent'), running.authUrl).href, {
      csrf: formField(consent.body, 'csrf'),
    });
    const callback = await agent.follow(new URL(allow.response.headers.get('location')!, running.authUrl).href, (url) =>
      url.startsWith(app.redirectUri),
    );
    const code = new URL(callback.url).searchParams.get('code')!;
    const tokens = await tokenRequest(
      running.authUrl,
      { grant_type: 'authorization_code', code, redirect_uri: app.redirectUri, code_verifier: verifier },
      app,
    );
    expect(tokens.status).toBe(200);
    const { payload } = decodeJwt(tokens.body.id_token);
    expect(payload.sub).toBe('user-zoe');
    expect(payload.name).toBe(nfc.name);
    expect(payload.email).toBe(nfc.email);
  });
});

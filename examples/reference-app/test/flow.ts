// Protocol helpers shared by the test files: drive the provider the way a client and a browser would.
import { expect } from 'vitest';
import { createUserAgent, formAction, formField, pkcePair, type Step, type UserAgent } from './user-agent.js';

export interface AuthorizeParams {
  clientId: string;
  redirectUri: string;
  scope?: string;
  state?: string;
  nonce?: string;
  challenge?: string | undefined;
  challengeMethod?: string | undefined;
  responseType?: string;
  prompt?: string;
  resource?: string;
  /** Who the client expects to sign in (OIDC Core 3.1.2.1); a hint for someone else asks for a switch. */
  idTokenHint?: string;
  /** Claims asked for one by one (OIDC Core 5.5), as JSON, e.g. `{"id_token":{"email":null}}`. */
  claims?: string;
}

export function authorizationUrl(authUrl: string, params: AuthorizeParams): string {
  const url = new URL('/auth', authUrl);
  url.searchParams.set('client_id', params.clientId);
  url.searchParams.set('redirect_uri', params.redirectUri);
  url.searchParams.set('response_type', params.responseType ?? 'code');
  url.searchParams.set('scope', params.scope ?? 'openid profile email offline_access photos:read charges:write');
  url.searchParams.set('state', params.state ?? 'state-123');
  url.searchParams.set('nonce', params.nonce ?? 'nonce-456');
  url.searchParams.set('prompt', params.prompt ?? 'consent');
  if (params.resource) url.searchParams.set('resource', params.resource);
  if (params.idTokenHint) url.searchParams.set('id_token_hint', params.idTokenHint);
  if (params.claims) url.searchParams.set('claims', params.claims);
  if (params.challenge !== undefined) url.searchParams.set('code_challenge', params.challenge);
  if (params.challengeMethod !== undefined) url.searchParams.set('code_challenge_method', params.challengeMethod);
  return url.href;
}

/**
 * Logs in on our login page, unless `agent` is signed in at the provider already, and allows on our
 * consent page; returns the redirect to the client.
 */
export async function loginAndConsent(
  agent: UserAgent,
  authUrl: string,
  startUrl: string,
  redirectUri: string,
  credentials: { username: string; password: string },
): Promise<URL> {
  const toClient = (url: string) => url.startsWith(redirectUri);
  let step: Step = await agent.follow(startUrl, toClient);
  // Anything but the consent page is the login page: a page that is neither fails on the line below.
  if (!toClient(step.url) && !step.body.includes('<h1>Allow access</h1>')) {
    expect(step.body).toContain('<h1>Sign in</h1>');
    const login = await agent.postForm(new URL(formAction(step.body, 'login'), authUrl).href, {
      csrf: formField(step.body, 'csrf'),
      username: credentials.username,
      password: credentials.password,
    });
    expect(login.response.status).toBe(303);
    step = await agent.follow(new URL(login.response.headers.get('location')!, authUrl).href, toClient);
  }
  if (!toClient(step.url)) {
    expect(step.body).toContain('<h1>Allow access</h1>');
    const consent = await agent.postForm(new URL(formAction(step.body, 'consent'), authUrl).href, {
      csrf: formField(step.body, 'csrf'),
    });
    expect(consent.response.status).toBe(303);
    step = await agent.follow(new URL(consent.response.headers.get('location')!, authUrl).href, toClient);
  }
  expect(toClient(step.url)).toBe(true);
  return new URL(step.url);
}

export interface TokenResponse {
  status: number;
  body: Record<string, any>;
}

export async function tokenRequest(
  authUrl: string,
  params: Record<string, string>,
  client: { clientId: string; clientSecret?: string },
): Promise<TokenResponse> {
  const headers: Record<string, string> = { 'content-type': 'application/x-www-form-urlencoded' };
  const body = new URLSearchParams(params);
  if (client.clientSecret !== undefined) {
    const basic = `${encodeURIComponent(client.clientId)}:${encodeURIComponent(client.clientSecret)}`;
    headers.authorization = `Basic ${Buffer.from(basic).toString('base64')}`;
  } else {
    body.set('client_id', client.clientId);
  }
  const response = await fetch(new URL('/token', authUrl), { method: 'POST', headers, body });
  return { status: response.status, body: (await response.json()) as Record<string, any> };
}

export interface Credentials {
  clientId: string;
  clientSecret?: string;
  redirectUri: string;
}

/** The start of a code flow with PKCE (S256) for `client`: the authorization URL and its verifier. */
function pkceStart(authUrl: string, client: Credentials, extra: Partial<AuthorizeParams>) {
  const { verifier, challenge } = pkcePair();
  const start = authorizationUrl(authUrl, {
    clientId: client.clientId,
    redirectUri: client.redirectUri,
    challenge,
    challengeMethod: 'S256',
    ...extra,
  });
  return { verifier, start };
}

/** A new sign-in's login page, opened as a browser opens it, and what its form posts to. */
export interface LoginForm {
  /** The browser it was opened in: it holds the interaction's cookies. */
  agent: UserAgent;
  page: Step;
  /** Where the login form posts, absolute. */
  action: string;
  /** The form's CSRF token. */
  csrf: string;
  /** The sign-in's PKCE verifier, to redeem the code it ends with. */
  verifier: string;
}

/**
 * Opens the login page of a new sign-in of `client` (a code flow with PKCE S256, `extra` on top) in
 * `agent`, a fresh browser unless given, and reads its form: where it posts and its CSRF token. Fails
 * the test on any other page (one where the user is signed in at the provider already gets consent).
 *
 * @example
 * ```ts
 * const { agent, action, csrf } = await openLoginForm(running.authUrl, running.clients.app);
 * await agent.postForm(action, { csrf, username: 'alice', password: 'wrong' });
 * ```
 */
export async function openLoginForm(
  authUrl: string,
  client: Credentials,
  extra: Partial<AuthorizeParams> = {},
  agent: UserAgent = createUserAgent(),
): Promise<LoginForm> {
  const { verifier, start } = pkceStart(authUrl, client, extra);
  const page = await agent.follow(start, (url) => url.startsWith(client.redirectUri));
  expect(page.body).toContain('<h1>Sign in</h1>');
  const action = new URL(formAction(page.body, 'login'), authUrl).href;
  return { agent, page, action, csrf: formField(page.body, 'csrf'), verifier };
}

/** Redeems the code the callback URL carries, with the flow's verifier. */
async function redeem(authUrl: string, client: Credentials, callback: URL, verifier: string) {
  const code = callback.searchParams.get('code');
  expect(code).toBeTruthy();
  return tokenRequest(
    authUrl,
    { grant_type: 'authorization_code', code: code!, redirect_uri: client.redirectUri, code_verifier: verifier },
    client,
  );
}

/**
 * One whole code flow with PKCE for `user`; returns the callback URL, the verifier and the tokens. In a
 * fresh browser unless `agent` is given (one where the user may be signed in at the provider already).
 */
export async function codeFlow(
  authUrl: string,
  client: Credentials,
  user: { username: string; password: string },
  extra: Partial<AuthorizeParams> = {},
  agent: UserAgent = createUserAgent(),
): Promise<{ callback: URL; verifier: string; tokens: TokenResponse; agent: UserAgent }> {
  const { verifier, start } = pkceStart(authUrl, client, extra);
  const callback = await loginAndConsent(agent, authUrl, start, client.redirectUri, user);
  const tokens = await redeem(authUrl, client, callback, verifier);
  return { callback, verifier, tokens, agent };
}

/**
 * "Switch account": in `agent`, where someone is signed in at the provider, `user` logs in to `client`
 * (`prompt=login` unless `extra` says otherwise, e.g. `prompt: 'consent'` with an `idTokenHint` for
 * `user`). The provider has the current user signed out first, on its "Switch account" page; this
 * confirms it, allows on `user`'s consent page and redeems the code. Returns both pages as they were
 * shown, for the caller to check, and `user`'s tokens.
 */
export async function switchAccount(
  agent: UserAgent,
  authUrl: string,
  client: Credentials,
  user: { username: string; password: string },
  extra: Partial<AuthorizeParams> = {},
): Promise<{ switching: Step; consent: Step; tokens: TokenResponse }> {
  const { verifier, start } = pkceStart(authUrl, client, { prompt: 'login consent', ...extra });
  const page = await agent.follow(start);
  expect(page.body).toContain('<h1>Sign in</h1>');
  const login = await agent.postForm(new URL(formAction(page.body, 'login'), authUrl).href, {
    csrf: formField(page.body, 'csrf'),
    ...user,
  });
  expect(login.response.status).toBe(303);
  // oidc-provider ends the current session first: its resume step answers with the logout to confirm.
  const switching = await agent.request(new URL(login.response.headers.get('location')!, authUrl).href);
  const confirmed = await agent.postForm(new URL(formAction(switching.body, 'confirm'), authUrl).href, {
    xsrf: formField(switching.body, 'xsrf'),
    logout: formField(switching.body, 'logout'),
  });
  expect(confirmed.response.status).toBe(303);
  // Back to the same sign-in, now as `user`: the consent, then the code.
  const consent = await agent.follow(new URL(confirmed.response.headers.get('location')!, authUrl).href);
  const allowed = await agent.postForm(new URL(formAction(consent.body, 'consent'), authUrl).href, {
    csrf: formField(consent.body, 'csrf'),
  });
  const back = await agent.follow(new URL(allowed.response.headers.get('location')!, authUrl).href, (url) =>
    url.startsWith(client.redirectUri),
  );
  const tokens = await redeem(authUrl, client, new URL(back.url), verifier);
  return { switching, consent, tokens };
}

/** RFC 7662 introspection with `client`'s credentials (a client sees only its own tokens). */
export async function introspect(
  authUrl: string,
  token: string,
  client: { clientId: string; clientSecret: string },
): Promise<Record<string, any>> {
  const basic = Buffer.from(
    `${encodeURIComponent(client.clientId)}:${encodeURIComponent(client.clientSecret)}`,
  ).toString('base64');
  const response = await fetch(new URL('/token/introspection', authUrl), {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: `Basic ${basic}` },
    body: new URLSearchParams({ token }),
  });
  expect(response.status).toBe(200);
  return (await response.json()) as Record<string, any>;
}

/**
 * Signs out of the third-party app in `agent` as a browser does: the app's sign-out, the provider's
 * logout confirmed ("Yes, sign me out"), then back at the app's root. Returns that page.
 */
export async function signOutOfApp(agent: UserAgent, appUrl: string, csrf: string): Promise<Step> {
  const out = await agent.postForm(new URL('/signout', appUrl).href, { csrf });
  expect(out.response.status).toBe(303);
  const confirm = await agent.request(out.response.headers.get('location') ?? '');
  expect(confirm.body).toContain('Yes, sign me out');
  const action = /<form id="op.logoutForm" method="post" action="([^"]+)"/.exec(confirm.body)?.[1] ?? '';
  const done = await agent.postForm(new URL(action, confirm.url).href, {
    xsrf: formField(confirm.body, 'xsrf'),
    logout: 'yes',
  });
  expect(done.response.status).toBe(303);
  return agent.follow(new URL(done.response.headers.get('location') ?? '', confirm.url).href);
}

/** One scope as the consent page lists it: its name, and whether the grant held it before this consent. */
export interface ConsentItem {
  scope: string;
  allowedBefore: boolean;
}

/**
 * The scopes a consent page lists, in its order (identity scopes first, then each resource's), each
 * read from its `<code>` name and its "(allowed before)" mark.
 *
 * @example
 * ```ts
 * expect(consentItems(page.body)).toContainEqual({ scope: 'email', allowedBefore: true });
 * ```
 */
export function consentItems(html: string): ConsentItem[] {
  return [...html.matchAll(/<li>[^<]*<code>([^<]*)<\/code>([^<]*)<\/li>/g)].map((match) => ({
    scope: match[1]!,
    allowedBefore: match[2]!.includes('(allowed before)'),
  }));
}

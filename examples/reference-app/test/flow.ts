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
  if (params.challenge !== undefined) url.searchParams.set('code_challenge', params.challenge);
  if (params.challengeMethod !== undefined) url.searchParams.set('code_challenge_method', params.challengeMethod);
  return url.href;
}

/** Logs in on our login page and allows on our consent page; returns the redirect to the client. */
export async function loginAndConsent(
  agent: UserAgent,
  authUrl: string,
  startUrl: string,
  redirectUri: string,
  credentials: { username: string; password: string },
): Promise<URL> {
  const toClient = (url: string) => url.startsWith(redirectUri);
  let step: Step = await agent.follow(startUrl, toClient);
  if (!toClient(step.url)) {
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

/** One whole code flow with PKCE for `user`; returns the callback URL, the verifier and the tokens. */
export async function codeFlow(
  authUrl: string,
  client: Credentials,
  user: { username: string; password: string },
  extra: Partial<AuthorizeParams> = {},
): Promise<{ callback: URL; verifier: string; tokens: TokenResponse; agent: UserAgent }> {
  const agent = createUserAgent();
  const { verifier, challenge } = pkcePair();
  const start = authorizationUrl(authUrl, {
    clientId: client.clientId,
    redirectUri: client.redirectUri,
    challenge,
    challengeMethod: 'S256',
    ...extra,
  });
  const callback = await loginAndConsent(agent, authUrl, start, client.redirectUri, user);
  const code = callback.searchParams.get('code');
  expect(code).toBeTruthy();
  const tokens = await tokenRequest(
    authUrl,
    { grant_type: 'authorization_code', code: code!, redirect_uri: client.redirectUri, code_verifier: verifier },
    client,
  );
  return { callback, verifier, tokens, agent };
}

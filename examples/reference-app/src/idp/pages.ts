import { escapeHtml, htmlPage } from '../html.js';

/** The only text a failed login ever shows: it must not tell an unknown user from a wrong password. */
export const invalidLoginMessage = 'Invalid username or password';

/** What the login page needs. */
export interface LoginPageInput {
  uid: string;
  csrf: string;
  clientName: string;
  username?: string;
  error?: string;
}

/**
 * The login form: labelled fields, one `main`, the error (if any) announced by `role="alert"`.
 *
 * @example
 * ```ts
 * res.send(loginPage({ uid, csrf, clientName: 'Photo app' }));
 * ```
 */
export function loginPage(input: LoginPageInput): string {
  const error = input.error ? `<p class="error" role="alert">${escapeHtml(input.error)}</p>` : '';
  return htmlPage(
    'Sign in',
    `<h1>Sign in</h1>
<p>to continue to <strong>${escapeHtml(input.clientName)}</strong></p>
${error}
<form method="post" action="/interaction/${escapeHtml(input.uid)}/login">
<input type="hidden" name="csrf" value="${escapeHtml(input.csrf)}">
<label for="username">Username</label>
<input id="username" name="username" autocomplete="username" required value="${escapeHtml(input.username ?? '')}">
<label for="password">Password</label>
<input id="password" name="password" type="password" autocomplete="current-password" required>
<button type="submit">Sign in</button>
</form>
<form method="post" action="/interaction/${escapeHtml(input.uid)}/abort">
<input type="hidden" name="csrf" value="${escapeHtml(input.csrf)}">
<button type="submit">Cancel</button>
</form>`,
  );
}

/** What the consent page needs. */
export interface ConsentPageInput {
  uid: string;
  csrf: string;
  clientName: string;
  userName: string;
  scopes: readonly string[];
  resources: ReadonlyArray<{ resource: string; scopes: readonly string[] }>;
}

const scopeText: Record<string, string> = {
  openid: 'Know who you are',
  profile: 'See your name',
  email: 'See your email address',
  offline_access: 'Stay signed in (refresh tokens)',
  'photos:read': 'See your photos',
  'photos:write': 'Add and delete your photos',
  'stock:read': 'See stock levels',
  'charges:write': 'Create charges',
  'settings:write': 'Change your settings',
};

function scopeItem(scope: string): string {
  const text = scopeText[scope];
  return `<li>${escapeHtml(text ?? scope)} <code>${escapeHtml(scope)}</code></li>`;
}

/**
 * The consent form: what the client asks for, in words and by scope name, per resource.
 *
 * @example
 * ```ts
 * res.send(consentPage({ uid, csrf, clientName, userName, scopes: ['openid'], resources: [] }));
 * ```
 */
export function consentPage(input: ConsentPageInput): string {
  const resources = input.resources
    .map((entry) => `<h2>At ${escapeHtml(entry.resource)}</h2>\n<ul>${entry.scopes.map(scopeItem).join('')}</ul>`)
    .join('\n');
  const identity = input.scopes.length ? `<h2>About you</h2>\n<ul>${input.scopes.map(scopeItem).join('')}</ul>` : '';
  return htmlPage(
    'Allow access',
    `<h1>Allow access</h1>
<p>Signed in as <strong>${escapeHtml(input.userName)}</strong>. <strong>${escapeHtml(input.clientName)}</strong> asks to:</p>
${identity}
${resources}
<form method="post" action="/interaction/${escapeHtml(input.uid)}/consent">
<input type="hidden" name="csrf" value="${escapeHtml(input.csrf)}">
<button type="submit">Allow</button>
</form>
<form method="post" action="/interaction/${escapeHtml(input.uid)}/abort">
<input type="hidden" name="csrf" value="${escapeHtml(input.csrf)}">
<button type="submit">Deny</button>
</form>`,
  );
}

/**
 * A plain error page. `message` is shown as given, so callers pass fixed, generic text only.
 *
 * @example
 * ```ts
 * res.status(400).send(errorPage('This sign-in link has expired', 'Start again from the application.'));
 * ```
 */
export function errorPage(title: string, message: string): string {
  return htmlPage(title, `<h1>${escapeHtml(title)}</h1>\n<p>${escapeHtml(message)}</p>`);
}

import { escapeHtml, htmlPage } from '../html.js';

/** The only text a failed login ever shows: it must not tell an unknown user from a wrong password. */
export const invalidLoginMessage = 'Invalid username or password';

/** The login page's message while a name and address wait after too many wrong passwords. */
export const tooManyLogins = (seconds: number): string =>
  `Too many failed sign-ins. Try again in ${seconds < 60 ? `${seconds} seconds` : `${Math.ceil(seconds / 60)} minutes`}.`;

/** What the login page needs. */
export interface LoginPageInput {
  uid: string;
  csrf: string;
  clientName: string;
  username?: string;
  error?: string;
}

/**
 * The login form: labelled fields, one `main`, the error (if any) announced by `role="alert"` and
 * read as the description of each field.
 *
 * @example
 * ```ts
 * res.send(loginPage({ uid, csrf, clientName: 'Photo app' }));
 * ```
 */
export function loginPage(input: LoginPageInput): string {
  // The cursor starts where typing goes: the username, or the password when the name is kept (after
  // a wrong password), so a keyboard user need not hunt for the field. A screen reader reads the
  // field that takes the focus, not the page: the error is each field's description, so it is heard
  // there (an alert already on the page when it loads is not announced everywhere).
  const error = input.error ? `<p class="error" id="login-error" role="alert">${escapeHtml(input.error)}</p>` : '';
  const describedBy = input.error ? ' aria-describedby="login-error"' : '';
  return htmlPage(
    'Sign in',
    `<h1>Sign in</h1>
<p>to continue to <strong>${escapeHtml(input.clientName)}</strong></p>
${error}
<form method="post" action="/interaction/${escapeHtml(input.uid)}/login">
<input type="hidden" name="csrf" value="${escapeHtml(input.csrf)}">
<label for="username">Username</label>
<input id="username" name="username" autocomplete="username" required value="${escapeHtml(input.username ?? '')}"${describedBy}${
      input.username ? '' : ' autofocus'
    }>
<label for="password">Password</label>
<input id="password" name="password" type="password" autocomplete="current-password" required${describedBy}${
      input.username ? ' autofocus' : ''
    }>
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
  /** Every identity scope the request asks for, those the grant holds already too. */
  scopes: readonly string[];
  /** Of {@link ConsentPageInput.scopes}, those the grant holds already: marked "(allowed before)". */
  scopesAllowedBefore?: readonly string[];
  /**
   * Of {@link ConsentPageInput.scopes}, those the grant refused before: Allow does not give them, and
   * they are marked "(refused before, not given)".
   */
  scopesRefusedBefore?: readonly string[];
  /** Per resource, every scope the request asks for there, those the grant holds already, and those it refused. */
  resources: ReadonlyArray<{
    resource: string;
    scopes: readonly string[];
    allowedBefore?: readonly string[];
    refusedBefore?: readonly string[];
  }>;
}

/** Each scope in words. The administrators' scopes say that they act with the user's admin role. */
const scopeText: Record<string, string> = {
  openid: 'Know who you are',
  profile: 'See your name',
  email: 'See your email address',
  offline_access: 'Stay signed in (refresh tokens)',
  'photos:read': 'See your photos',
  'photos:write': 'Add and delete your photos',
  'stock:read': 'See stock levels',
  'stock:write': 'Set stock levels, with your administrator role',
  'charges:write': 'Create charges',
  'settings:read': 'See your settings',
  'settings:write': 'Change your settings',
  'events:read': 'See the payment events the webhook receiver got, with your administrator role',
  'events:write': 'Add notes to the payment events the webhook receiver got, with your administrator role',
};

/**
 * One scope in words and by name; one the grant holds already says so, and one it refused says that
 * Allow does not give it, in words a screen reader reads too.
 */
function scopeList(
  scopes: readonly string[],
  allowedBefore: readonly string[] = [],
  refusedBefore: readonly string[] = [],
): string {
  const items = scopes.map((scope) => {
    const mark = allowedBefore.includes(scope)
      ? ' (allowed before)'
      : refusedBefore.includes(scope)
        ? ' (refused before, not given)'
        : '';
    return `<li>${escapeHtml(scopeText[scope] ?? scope)} <code>${escapeHtml(scope)}</code>${mark}</li>`;
  });
  return `<ul>${items.join('')}</ul>`;
}

/**
 * The consent form: everything the client asks for, in words and by scope name, per resource; what
 * the person allowed before is listed too, marked so, and what they refused before, marked as not given. A re-consent (the client asks again for what it
 * holds) thus shows what Allow lets the client have, never an empty list.
 *
 * @example
 * ```ts
 * res.send(consentPage({ uid, csrf, clientName, userName, scopes: ['openid'], resources: [] }));
 * ```
 */
export function consentPage(input: ConsentPageInput): string {
  const resources = input.resources
    .filter((entry) => entry.scopes.length)
    .map(
      (entry) =>
        `<h2>At ${escapeHtml(entry.resource)}</h2>\n${scopeList(entry.scopes, entry.allowedBefore, entry.refusedBefore)}`,
    )
    .join('\n');
  const identity = input.scopes.length
    ? `<h2>About you</h2>\n${scopeList(input.scopes, input.scopesAllowedBefore, input.scopesRefusedBefore)}`
    : '';
  const client = `<strong>${escapeHtml(input.clientName)}</strong>`;
  // A request that names no scope at all (none the provider knows) still comes here: said in words.
  const asks = identity || resources ? `${client} asks to:` : `${client} asks for no access beyond this sign-in.`;
  return htmlPage(
    'Allow access',
    `<h1>Allow access</h1>
<p>Signed in as <strong>${escapeHtml(input.userName)}</strong>. ${asks}</p>
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

/** What the logout confirmation page needs. */
export interface LogoutPageInput {
  /**
   * oidc-provider's hidden form (`id="op.logoutForm"`, its action and its `xsrf` token), inserted as
   * given: the provider builds it and escapes its values. The page's buttons submit it.
   */
  form: string;
  /** The client that sent the user here, when the request named one. */
  clientName?: string | undefined;
}

/**
 * The RP-initiated logout confirmation (oidc-provider's `logoutSource`): "Yes, sign me out" submits
 * the provider's form with `logout=yes`; the other button submits it without, which keeps the session.
 *
 * @example
 * ```ts
 * ctx.body = logoutPage({ form, clientName: ctx.oidc.client?.clientName });
 * ```
 */
export function logoutPage(input: LogoutPageInput): string {
  // No button here (nor on the switch-account page) takes the focus on its own: a hostile page that
  // opens it (framing is refused, a new tab is not) could then act for the user on one key press
  // meant for that page (Enter, Space), signing them out or switching their account.
  const from = input.clientName ? `<p>You are leaving <strong>${escapeHtml(input.clientName)}</strong>.</p>\n` : '';
  return htmlPage(
    'Sign out',
    `<h1>Sign out?</h1>
${from}<p>Do you want to sign out of the identity provider?</p>
${input.form}
<button type="submit" form="op.logoutForm" name="logout" value="yes">Yes, sign me out</button>
<button type="submit" form="op.logoutForm">No, stay signed in</button>`,
  );
}

/** What the logout page for a visitor with no session needs. */
export interface NotSignedInLogoutPageInput {
  /** Where the logout is confirmed (oidc-provider's `end_session_confirm`). */
  action: string;
  /** The provider's `xsrf` token for that confirmation. */
  xsrf: string;
  /** The client that sent the visitor here, when the request named one. */
  clientName?: string | undefined;
}

/**
 * The RP-initiated logout page for a visitor with no session at the provider. oidc-provider answers
 * this case with its own page, which submits the logout by script; ours has no script (the CSP allows
 * none), so "Continue" submits it: the provider then ends the (empty) session and sends the visitor on,
 * to the client's post-logout URI when the request named one.
 *
 * @example
 * ```ts
 * ctx.body = notSignedInLogoutPage({ action: ctx.oidc.urlFor('end_session_confirm'), xsrf: secret });
 * ```
 */
export function notSignedInLogoutPage(input: NotSignedInLogoutPageInput): string {
  const from = input.clientName ? `<p>You are leaving <strong>${escapeHtml(input.clientName)}</strong>.</p>\n` : '';
  return htmlPage(
    'Sign out',
    `<h1>Sign out</h1>
${from}<p>You are not signed in at the identity provider: there is nothing to sign out of.</p>
<form id="op.logoutForm" method="post" action="${escapeHtml(input.action)}">
<input type="hidden" name="xsrf" value="${escapeHtml(input.xsrf)}">
<input type="hidden" name="logout" value="yes">
<button autofocus type="submit">Continue</button>
</form>`,
  );
}

/** What the account switch page needs. */
export interface SwitchAccountPageInput {
  /** Where the logout is confirmed (oidc-provider's `end_session_confirm`). */
  action: string;
  /** The provider's `xsrf` token for that confirmation. */
  xsrf: string;
  /** Who is signed in at the provider now. */
  currentName: string;
  /** Who just signed in on the login page. */
  nextName: string;
  /** The client the sign-in is for. */
  clientName: string;
}

/**
 * The page shown when someone signs in as another account than the one signed in at the provider
 * (`prompt=login`, an `id_token_hint` for someone else). oidc-provider first ends the current session
 * (revoking the grants given in it, except those with `offline_access`, which outlive a logout) and
 * answers this step with its own page, which submits that logout by script; ours asks, with no script:
 * "Continue" submits the logout, the provider then resumes the sign-in as the new account.
 *
 * @example
 * ```ts
 * ctx.body = switchAccountPage({ action, xsrf, currentName: 'Alice', nextName: 'Bob', clientName: 'Photo app' });
 * ```
 */
export function switchAccountPage(input: SwitchAccountPageInput): string {
  const current = `<strong>${escapeHtml(input.currentName)}</strong>`;
  const next = `<strong>${escapeHtml(input.nextName)}</strong>`;
  return htmlPage(
    'Switch account',
    `<h1>Switch account</h1>
<p>You are signed in as ${current}. To continue to <strong>${escapeHtml(input.clientName)}</strong> as ${next}, ${current} is signed out of the identity provider first.</p>
<form id="op.logoutForm" method="post" action="${escapeHtml(input.action)}">
<input type="hidden" name="xsrf" value="${escapeHtml(input.xsrf)}">
<input type="hidden" name="logout" value="yes">
<button type="submit">Continue as ${escapeHtml(input.nextName)}</button>
</form>
<p>To stay signed in as ${current}, close this page and start again from the application.</p>`,
  );
}

/** What the form_post response page needs. */
export interface FormPostPageInput {
  /** The client's redirect URI, where the response is posted. */
  action: string;
  /** The authorization response: `code`, `state`, `iss`, or `error` and `error_description`. */
  fields: ReadonlyArray<readonly [name: string, value: string]>;
  clientName: string;
}

/**
 * The authorization response for a client that asked for `response_mode=form_post`. oidc-provider's own
 * page submits it by script; ours has no script (the CSP allows none), so "Continue" posts it.
 *
 * @example
 * ```ts
 * ctx.body = formPostPage({ action: redirectUri, fields: [['code', code], ['state', state]], clientName });
 * ```
 */
export function formPostPage(input: FormPostPageInput): string {
  const fields = input.fields
    .map(([name, value]) => `<input type="hidden" name="${escapeHtml(name)}" value="${escapeHtml(value)}">`)
    .join('\n');
  return htmlPage(
    'Back to the application',
    `<h1>Back to the application</h1>
<p>Continue to return to <strong>${escapeHtml(input.clientName)}</strong>.</p>
<form method="post" action="${escapeHtml(input.action)}">
${fields}
<button autofocus type="submit">Continue</button>
</form>`,
  );
}

/**
 * The page after a logout that has no client to return to (oidc-provider's `postLogoutSuccessSource`).
 *
 * @example
 * ```ts
 * ctx.body = signedOutPage({ clientName: ctx.oidc.client?.clientName });
 * ```
 */
export function signedOutPage(input: { clientName?: string | undefined } = {}): string {
  const from = input.clientName ? ` from <strong>${escapeHtml(input.clientName)}</strong>` : '';
  return htmlPage('Signed out', `<h1>Signed out</h1>\n<p>You are signed out${from}.</p>`);
}

import { escapeHtml, htmlPage } from '../html.js';
import type { ApiResult } from './api-client.js';
import type { Flash, OpenCharge, SignedInUser } from './sessions.js';

/**
 * The page for a visitor who is not signed in.
 *
 * @example
 * ```ts
 * res.send(signedOutPage());
 * ```
 */
export function signedOutPage(message?: string): string {
  const note = message ? `<p role="status">${escapeHtml(message)}</p>` : '';
  return htmlPage(
    'Photo app',
    `<h1>Photo app</h1>
${note}
<p>A third-party app. It never sees your password: you sign in at the identity provider.</p>
<p><a href="/signin">Sign in</a></p>`,
  );
}

function apiSection(heading: string, id: string, result: ApiResult, extra = ''): string {
  let content: string;
  if (result.kind === 'unavailable') {
    content = `<p class="error" role="alert">API unavailable (${escapeHtml(result.reason)}). Try again later.</p>`;
  } else if (result.kind === 'redirected') {
    content = `<p class="error">The API answered ${escapeHtml(result.status)} (a redirect the app does not follow): nothing to show.</p>`;
  } else if (result.kind === 'refused') {
    content = `<p class="error">The API refused: ${escapeHtml(result.status)} ${escapeHtml(result.title)}</p>`;
  } else {
    content = `<pre>${escapeHtml(JSON.stringify(result.body, null, 2))}</pre>`;
  }
  return `<section aria-labelledby="${id}">\n<h2 id="${id}">${escapeHtml(heading)}</h2>\n${content}\n${extra}</section>`;
}

/** What the signed-in page shows. */
export interface HomePageInput {
  user: SignedInUser;
  csrf: string;
  /**
   * The key of the charge this page's form makes: the open charge's while there is one, else one per
   * rendered form.
   */
  chargeKey: string;
  /**
   * A charge sent from this session whose outcome no page has shown: the form comes back with its
   * details, and says what is known of it (unless the flash on this page is about it already).
   */
  openCharge?: OpenCharge | undefined;
  photos: ApiResult;
  stock: ApiResult;
  settings: ApiResult;
  flash?: Flash;
}

/**
 * What the charge form says of an open charge: a headline (the page's title names it too) and what to
 * do. A lost answer is the usual cause, so the person may well have seen nothing of it.
 */
function openChargeNotice(open: OpenCharge): { headline: string; detail: string } {
  const charge = `Your charge of ${open.amount} ${open.currency}`;
  if (open.outcome === 'created')
    return {
      headline: `${charge} went through.`,
      detail:
        'Its answer did not reach this page. The form below is still that charge: sent as it is, it shows the charge and charges nothing more. The form after it is a new charge.',
    };
  if (open.outcome === 'refused')
    return {
      headline: `${charge} was refused: nothing was charged.`,
      detail: 'Its answer did not reach this page. Send the form below as it is to see why.',
    };
  return {
    headline: `${charge} was sent; it may have gone through.`,
    detail:
      'Its answer did not reach this page. The form below is still that charge: send it as it is to find out. It is charged at most once.',
  };
}

/**
 * The signed-in page: who you are (from the ID token) and the API sections. Each section renders its
 * own outcome, so a missing API shows "API unavailable" and the rest of the page still works.
 *
 * @example
 * ```ts
 * res.send(homePage({ user, csrf, chargeKey: randomUUID(), photos, stock, settings }));
 * ```
 */
export function homePage(input: HomePageInput): string {
  const { user, csrf } = input;
  const hidden = `<input type="hidden" name="csrf" value="${escapeHtml(csrf)}">`;
  const repeat = input.flash?.repeat;
  // The same charge with the same key: the API answers with the stored 201 instead of charging twice.
  const repeatForm = repeat
    ? `<form method="post" action="/charges">${hidden}
<input type="hidden" name="key" value="${escapeHtml(repeat.key)}">
<input type="hidden" name="amount" value="${escapeHtml(repeat.amount)}">
<input type="hidden" name="currency" value="${escapeHtml(repeat.currency)}">
<button type="submit">Send the same charge again (same key)</button>
</form>`
    : '';
  const flash = input.flash
    ? `<section aria-labelledby="flash" role="status"><h2 id="flash">${escapeHtml(input.flash.title)}</h2>\n<ul>${input.flash.lines
        .map((line) => `<li>${escapeHtml(line)}</li>`)
        .join('')}</ul>${repeatForm}</section>`
    : '';
  // The saved theme (GET /settings) is what the page wears and what the select starts on.
  const dark = input.settings.kind === 'ok' && (input.settings.body as { theme?: unknown } | null)?.theme === 'dark';
  const themeForm = `<form method="post" action="/theme">${hidden}
<label for="theme">Theme</label>
<select id="theme" name="theme"><option value="light">Light</option><option value="dark"${dark ? ' selected' : ''}>Dark</option></select>
<button type="submit">Save theme</button>
</form>`;
  // The title names the outcome of the form this page answers: it is what a screen reader reads first,
  // and the status region below, there from the start, is not announced when the page loads.
  // The flash of this very charge says more than the notice would.
  const open = input.openCharge;
  const notice = open && open.key !== input.flash?.charge?.key ? openChargeNotice(open) : undefined;
  const outcome = input.flash
    ? `${input.flash.title}: ${input.flash.lines[0] ?? ''}`.trim()
    : notice
      ? `Create charge: ${notice.headline}`
      : undefined;
  return htmlPage(
    outcome ? `${outcome} - Photo app` : 'Photo app',
    `<div class="theme-${dark ? 'dark' : 'light'}">
<h1>Photo app</h1>
<p>Signed in as <strong id="user-name">${escapeHtml(user.name ?? user.sub)}</strong>${
      user.email ? ` (<span id="user-email">${escapeHtml(user.email)}</span>)` : ''
    }, subject <code>${escapeHtml(user.sub)}</code>.</p>
<form method="post" action="/signout">${hidden}<button type="submit">Sign out</button></form>
${flash}
${apiSection('Your photos', 'photos', input.photos)}
${apiSection('Stock', 'stock', input.stock)}
${apiSection('Theme', 'settings', input.settings, themeForm)}
<section aria-labelledby="charge">
<h2 id="charge">Create charge</h2>
${
  notice
    ? `<div role="status"><p><strong>${escapeHtml(notice.headline)}</strong></p>
<p>${escapeHtml(notice.detail)}</p></div>
`
    : ''
}<form method="post" action="/charges">${hidden}
<input type="hidden" name="key" value="${escapeHtml(input.chargeKey)}">
<label for="amount">Amount (smallest currency unit)</label>
<input id="amount" name="amount" type="number" min="1" step="1" required value="${escapeHtml(open?.amount ?? 1000)}">
<label for="currency">Currency</label>
<input id="currency" name="currency" required value="${escapeHtml(open?.currency ?? 'EUR')}" maxlength="3">
<button type="submit">Create charge</button>
</form>
</section>
</div>`,
  );
}

/**
 * What `GET /signin` shows someone already signed in: signing in again ends this session and revokes
 * its grant, so it takes a form with the session's CSRF token, never a link another site could send.
 *
 * @example
 * ```ts
 * res.send(signInAgainPage({ user, csrf, returnTo: '/' }));
 * ```
 */
export function signInAgainPage(input: { user: SignedInUser; csrf: string; returnTo: string }): string {
  return htmlPage(
    'Sign in again',
    `<h1>Sign in again</h1>
<p>You are signed in as <strong>${escapeHtml(input.user.name ?? input.user.sub)}</strong>. Signing in again ends this session and revokes what you allowed it at the identity provider.</p>
<form method="post" action="/signin"><input type="hidden" name="csrf" value="${escapeHtml(input.csrf)}">
<input type="hidden" name="return_to" value="${escapeHtml(input.returnTo)}">
<button type="submit">Sign in again</button>
</form>
<p><a href="/">Back</a></p>`,
  );
}

/**
 * An error page of the app with the way back to its start. The title and heading name what happened
 * to the request the person made: they are what a screen reader reads first (a refused "Create
 * charge" titled "Sign-in failed" tells someone their sign-in broke when nobody was signing in).
 * The text is fixed by the caller: nothing from the request or a provider is echoed.
 *
 * @example
 * ```ts
 * res.status(403).send(appErrorPage('Request refused', 'Nothing was done: go back to the app and send it again.'));
 * ```
 */
export function appErrorPage(title: string, detail: string): string {
  return htmlPage(title, `<h1>${escapeHtml(title)}</h1>\n<p>${escapeHtml(detail)}</p>\n<p><a href="/">Back</a></p>`);
}

/**
 * The page of a charge that was sent to the API when the app's database failed (503): it may have gone
 * through, and the app could not keep or show what came of it. Spec 2.1 wants the same key on every
 * retry, so the page does not leave the person to find it: it names the key, and its form sends the
 * very same charge (key, amount, currency), which the API charges at most once: its stored answer
 * comes back when the first went through. The CSRF token is the session's, which takes no database
 * to make. The text is fixed; the charge's fields are escaped.
 *
 * @example
 * ```ts
 * res.status(503).send(chargeOutcomeUnknownPage({ key, amount: 1000, currency: 'EUR', csrf }));
 * ```
 */
export function chargeOutcomeUnknownPage(charge: {
  key: string;
  amount: number;
  currency: string;
  csrf: string;
}): string {
  const title = 'Outcome not known';
  return htmlPage(
    title,
    `<h1>${title}</h1>
<p>Your charge of ${escapeHtml(charge.amount)} ${escapeHtml(charge.currency)} was sent to the API, but the app could not reach its database to show what came of it: it may have gone through.</p>
<p>In a moment, send it again with the button below. It is the same charge with the same key, so it is charged at most once, and the page that follows shows what came of it.</p>
<p>Idempotency-Key: <code>${escapeHtml(charge.key)}</code></p>
<form method="post" action="/charges"><input type="hidden" name="csrf" value="${escapeHtml(charge.csrf)}">
<input type="hidden" name="key" value="${escapeHtml(charge.key)}">
<input type="hidden" name="amount" value="${escapeHtml(charge.amount)}">
<input type="hidden" name="currency" value="${escapeHtml(charge.currency)}">
<button type="submit">Send the same charge again (same key)</button>
</form>
<p><a href="/">Back</a></p>`,
  );
}

/**
 * The page of a charge the API answered 2xx (created, or its stored 201 replayed) when the app's
 * database failed after that (503): the charge went through, and the app could not keep or show its
 * page. It says so, with the amount, currency and key, and offers nothing to send again: sending the
 * form again is not needed. The text is fixed; the charge's fields are escaped.
 *
 * @example
 * ```ts
 * res.status(503).send(chargeCreatedPage({ key, amount: 1000, currency: 'EUR' }));
 * ```
 */
export function chargeCreatedPage(charge: { key: string; amount: number; currency: string }): string {
  const title = 'Charge created';
  return htmlPage(
    title,
    `<h1>${title}</h1>
<p>Your charge of ${escapeHtml(charge.amount)} ${escapeHtml(charge.currency)} went through: the API created it. The app could not reach its database to keep or show it.</p>
<p>There is no need to send the form again.</p>
<p>Idempotency-Key: <code>${escapeHtml(charge.key)}</code></p>
<p><a href="/">Back</a></p>`,
  );
}

/**
 * The page of a theme form that was sent to the API when the app's database failed (503): the theme
 * may or may not have been set, and the app could not keep or show what came of it. Setting the
 * theme is a PUT /settings that replaces the whole document, so the same form sent again is safe
 * (run twice, it leaves the same theme): the page offers it, with the session's CSRF token, which
 * takes no database to make. The text is fixed; the form's fields are escaped.
 *
 * @example
 * ```ts
 * res.status(503).send(themeOutcomeUnknownPage({ theme: 'dark', csrf }));
 * ```
 */
export function themeOutcomeUnknownPage(form: { theme: 'light' | 'dark'; csrf: string }): string {
  const title = 'Outcome not known';
  return htmlPage(
    title,
    `<h1>${title}</h1>
<p>Your theme was sent to the API, but the app could not reach its database to show what came of it: it may or may not have been set to ${escapeHtml(form.theme)}.</p>
<p>Setting the theme again does no harm: in a moment, send it again with the button below.</p>
<form method="post" action="/theme"><input type="hidden" name="csrf" value="${escapeHtml(form.csrf)}">
<input type="hidden" name="theme" value="${escapeHtml(form.theme)}">
<button type="submit">Set the theme to ${escapeHtml(form.theme)} again</button>
</form>
<p><a href="/">Back</a></p>`,
  );
}

/**
 * The page for a failed or refused sign-in. The text is fixed: no provider message is echoed.
 *
 * @example
 * ```ts
 * res.status(400).send(signInFailedPage());
 * ```
 */
export function signInFailedPage(detail = 'The sign-in could not be completed.'): string {
  return appErrorPage('Sign-in failed', detail);
}

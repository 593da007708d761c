import type { Request, Response } from 'express';
import type { ApiResult } from './api-client.js';
import type { AppContext } from './app-context.js';
import type { SessionData } from './sessions.js';

/**
 * The theme each POST /theme is about to set, with the session's CSRF token: what the 503 page of a
 * database that failed after it went out offers again (PUT /settings replaces the whole document, so
 * sending it twice is safe; see `storeUnavailablePage`). Keyed by the request, so it goes with it.
 */
export const themeOf: WeakMap<Request, { theme: 'light' | 'dark'; csrf: string }> = new WeakMap();

/** POST /theme (behind `withSession`): sets the theme, and says what came of it on the next page. */
export function setTheme(ctx: AppContext) {
  const { csrf, callApiAs, showOnce } = ctx;
  return async (req: Request, res: Response, id: string, data: SessionData): Promise<void> => {
    const theme = req.body?.theme === 'dark' ? 'dark' : 'light';
    themeOf.set(req, { theme, csrf: csrf.issue(req, res, id) });
    // A write, sent again after a refresh when the first was refused 401 invalid_token: that answer
    // comes from the gateway's guard (or the API's check of the gateway's token), before the route
    // ran, so the repeat is the first time it runs. And PUT /settings replaces the whole document:
    // even run twice, it leaves the same theme.
    const result = await callApiAs(req, data.tokens!.accessToken, {
      method: 'PUT',
      path: '/settings',
      body: { theme },
    });
    const lines = describe(result, theme);
    await showOnce(res, id, { title: 'Theme', lines });
  };
}

/** What came of a theme sent to the API, in words for the next page. */
function describe(result: ApiResult, theme: 'light' | 'dark'): string[] {
  if (result.kind === 'unavailable') return [`API unavailable (${result.reason}).`];
  if (result.kind === 'refused') return [`The API refused: ${result.status} ${result.title}`];
  // No refusal and no 2xx: the theme may or may not be set. Said so, as the 503 page of a theme that
  // went out says it (themeOutcomeUnknownPage), the same form being safe again (a PUT of the whole
  // settings document).
  if (result.kind === 'redirected') {
    return [
      `The API answered ${result.status} and not whether the theme was set: it may or may not have been set to ${theme}.`,
      'Setting the theme again does no harm: send the form again.',
    ];
  }
  return [`Theme set to ${theme}.`, `Status ${result.status}`, JSON.stringify(result.body)];
}

import { authorize } from '@idem/express';
import { requireScopes } from '@idem/guard';
import type { Express, Request, Response } from 'express';
import type { Database } from '../db.js';
import { principalOf } from './internal-auth.js';
import { jsonObjectBody, refuseInvalid, unknownFields } from './validation.js';

/** The themes `PUT /settings` accepts. */
export const themes = ['light', 'dark'] as const;

/** A user's settings: the whole document `PUT /settings` replaces. */
export interface Settings {
  theme: (typeof themes)[number];
}

/** What a user without saved settings sees. */
export const defaultSettings: Settings = { theme: 'light' };

/**
 * The settings routes:
 * - `GET /settings` (scope `settings:read`): the caller's settings, or the defaults.
 * - `PUT /settings` (scope `settings:write`): the full new content, `{ "theme": "light" | "dark" }`.
 *   It replaces the document (unknown members are refused, not merged), so sending it twice leaves
 *   the same state.
 *
 * @example
 * ```ts
 * registerSettingsRoutes(app, { db });
 * ```
 */
export function registerSettingsRoutes(app: Express, options: { db: Database }): void {
  const { db } = options;

  app.get('/settings', authorize(requireScopes('settings:read')), async (req: Request, res: Response) => {
    const { rows } = await db.query<Settings>('select theme from api_settings where owner = $1', [
      principalOf(req).sub,
    ]);
    res.set('Cache-Control', 'private, no-store').json(rows[0] ? { theme: rows[0].theme } : defaultSettings);
  });

  app.put(
    '/settings',
    authorize(requireScopes('settings:write')),
    ...jsonObjectBody('4kb'),
    async (req: Request, res: Response) => {
      const body = req.body as Record<string, unknown>;
      const extra = unknownFields(body, ['theme']);
      const themeOk = themes.includes(body.theme as Settings['theme']);
      if (!themeOk || extra.length > 0) {
        refuseInvalid(res, {
          ok: false,
          detail: `theme must be one of ${themes.join(', ')}; the body is the whole settings document.`,
          invalid: themeOk ? extra : ['theme', ...extra],
        });
        return;
      }
      const theme = body.theme as Settings['theme'];
      await db.query(
        `insert into api_settings (owner, theme) values ($1, $2)
         on conflict (owner) do update set theme = excluded.theme, updated_at = now()`,
        [principalOf(req).sub, theme],
      );
      res.set('Cache-Control', 'private, no-store').json({ theme });
    },
  );
}

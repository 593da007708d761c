import { authorize } from '@idem/express';
import { requireScopes } from '@idem/guard';
import type { Express, Request, Response } from 'express';
import type { Database } from '../db.js';
import { principalOf } from './internal-auth.js';
import { sendProblem } from './problem.js';

/** A photo as the API returns it. */
export interface Photo {
  id: string;
  title: string;
  url: string;
}

/**
 * The photo routes:
 * - `GET /photos` (scope `photos:read`): the caller's photos only, never another user's.
 * - `DELETE /photos/<id>` (scope `photos:write`): the owner's photo. Deletion leaves a tombstone, so a
 *   second DELETE of the same photo by its owner is a no-op answered 204 like the first (spec part 4).
 *   Another user's photo and an id that never existed are both 404: existence is not disclosed.
 *
 * @example
 * ```ts
 * registerPhotoRoutes(app, { db });
 * ```
 */
export function registerPhotoRoutes(app: Express, options: { db: Database }): void {
  const { db } = options;

  app.get('/photos', authorize(requireScopes('photos:read')), async (req: Request, res: Response) => {
    const { rows } = await db.query<Photo>(
      'select id, title, url from api_photos where owner = $1 and deleted_at is null order by id',
      [principalOf(req).sub],
    );
    res.set('Cache-Control', 'private, no-store').json({ photos: rows });
  });

  app.delete('/photos/:id', authorize(requireScopes('photos:write')), async (req: Request, res: Response) => {
    // coalesce keeps the first deletion time: the second DELETE changes nothing at all.
    const { rowCount } = await db.query(
      'update api_photos set deleted_at = coalesce(deleted_at, now()) where id = $1 and owner = $2',
      [String(req.params.id), principalOf(req).sub],
    );
    if (rowCount === 0) {
      sendProblem(res, 'photo_not_found', 'You have no photo with this id.');
      return;
    }
    res.status(204).end();
  });
}

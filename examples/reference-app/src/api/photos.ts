import { type Duration, type IdempotencyEvent, principalScope, type Store } from '@idem/core';
import { authorize, idempotency } from '@idem/express';
import { requireScopes } from '@idem/guard';
import type { Express, Request, Response } from 'express';
import type { Database } from '../db.js';
import { hasControlCharacters } from '../text.js';
import { principalOf } from './internal-auth.js';
import { releaseServerErrors } from './outcome.js';
import { sendProblem } from './problem.js';
import { jsonObjectBody, refuseInvalid, resourceId, unknownFields } from './validation.js';

/** The longest photo title `POST /photos` accepts, in characters. */
export const maxPhotoTitle = 100;

/** A photo as the API returns it. */
export interface Photo {
  id: string;
  title: string;
  url: string;
}

/**
 * The photo routes:
 * - `GET /photos` (scope `photos:read`): the caller's photos only, never another user's.
 * - `POST /photos` (scope `photos:write`), body `{ "title": "..." }` (1 to {@link maxPhotoTitle}
 *   characters, no control characters): adds a photo, 201 with a `Location`. A create is not
 *   idempotent, so an `Idempotency-Key` is required (400 without one), scoped to the user and the
 *   OAuth client acting for them (`principalScope` with `perClient`). Nothing else must commit with
 *   the photo, so the key lives in a plain (non-transactional) store: Redis when `REDIS_URL` is set, the
 *   SQL database otherwise. A 5xx means the insert failed, so nothing was created: the key is released
 *   and a retry runs, instead of replaying the failure for 24 hours. The photo's id derives from the
 *   key's record and the request (`keyFor`), so a run after a crash between the insert and the key's
 *   completion finds the photo the killed run made and answers it, instead of adding a second one
 *   (and makes it again if it was deleted since: the same key after its retention executes fresh).
 * - `DELETE /photos/<id>` (scope `photos:write`): the owner's photo. Deletion leaves a tombstone, so a
 *   second DELETE of the same photo by its owner is a no-op answered 204 like the first (spec part 4).
 *   Another user's photo, an id that never existed and an id no photo can have ({@link resourceId}) are
 *   all 404: existence is not disclosed.
 *
 * @example
 * ```ts
 * registerPhotoRoutes(app, { db, store: redisStore({ client: redis, prefix: 'idem:reference-api:' }) });
 * ```
 */
export function registerPhotoRoutes(
  app: Express,
  options: {
    db: Database;
    store: Store;
    onEvent?: ((event: IdempotencyEvent) => void) | undefined;
    /** The claim's lease (the API's `idempotencyLease`). Default the core's, `'10s'`. */
    lease?: Duration | undefined;
  },
): void {
  const { db } = options;

  app.post(
    '/photos',
    authorize(requireScopes('photos:write')),
    ...jsonObjectBody('4kb'),
    (req: Request, res: Response, next: () => void) => {
      const body = req.body as Record<string, unknown>;
      const title = typeof body.title === 'string' ? body.title.trim() : '';
      const extra = unknownFields(body, ['title']);
      const titleOk = title.length > 0 && title.length <= maxPhotoTitle && !hasControlCharacters(title);
      if (!titleOk || extra.length > 0) {
        refuseInvalid(res, {
          ok: false,
          detail: `title must be 1 to ${maxPhotoTitle} characters, none of them a control character; no other members.`,
          invalid: titleOk ? extra : ['title', ...extra],
        });
        return;
      }
      next();
    },
    idempotency({
      store: options.store,
      scope: (req) => principalScope(req.auth, { perClient: true }),
      // The insert is the only effect and a single statement: a 5xx means it did not happen.
      storeOutcome: releaseServerErrors,
      ...(options.onEvent ? { onEvent: options.onEvent } : {}),
      ...(options.lease === undefined ? {} : { lease: options.lease }),
    }),
    async (req: Request, res: Response) => {
      const context = req.idempotency;
      if (!context) throw new Error('POST /photos runs only behind its idempotency middleware');
      // The insert commits on its own, before the key's record completes in another store. A process
      // killed between the two leaves the photo and a key in progress; once the lease is over, the
      // client's retry runs this again. The id is the same on every run of this request (it derives
      // from the caller, the route, the key and the body), so that run finds the photo and answers it.
      // A run that finds it deleted makes it again: the same key after its retention (spec 3.1, it
      // executes fresh) would otherwise answer 201 with a photo no GET lists.
      const id = `photo-${context.keyFor('photo')}`;
      const title = String((req.body as { title: string }).title).trim();
      const photo: Photo = { id, title, url: `/photos/${id}.jpg` };
      await db.query(
        `insert into api_photos (id, owner, title, url) values ($1, $2, $3, $4)
         on conflict (id) do update set deleted_at = null where api_photos.deleted_at is not null`,
        [id, principalOf(req).sub, title, photo.url],
      );
      res.status(201).location(`/photos/${id}`).json(photo);
    },
  );

  app.get('/photos', authorize(requireScopes('photos:read')), async (req: Request, res: Response) => {
    const { rows } = await db.query<Photo>(
      'select id, title, url from api_photos where owner = $1 and deleted_at is null order by id',
      [principalOf(req).sub],
    );
    res.set('Cache-Control', 'private, no-store').json({ photos: rows });
  });

  app.delete('/photos/:id', authorize(requireScopes('photos:write')), async (req: Request, res: Response) => {
    const id = String(req.params.id);
    if (!resourceId.test(id)) {
      sendProblem(res, 'photo_not_found', 'You have no photo with this id.');
      return;
    }
    // coalesce keeps the first deletion time: the second DELETE changes nothing at all.
    const { rowCount } = await db.query(
      'update api_photos set deleted_at = coalesce(deleted_at, now()) where id = $1 and owner = $2',
      [id, principalOf(req).sub],
    );
    if (rowCount === 0) {
      sendProblem(res, 'photo_not_found', 'You have no photo with this id.');
      return;
    }
    res.status(204).end();
  });
}

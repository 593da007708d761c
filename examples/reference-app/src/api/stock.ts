import { authorize } from '@idem/express';
import { requireRoles, requireScopes } from '@idem/guard';
import type { Express, NextFunction, Request, Response } from 'express';
import type { Database } from '../db.js';
import { sendProblem } from './problem.js';
import { isIntegerIn, jsonObjectBody, refuseInvalid, resourceId, unknownFields } from './validation.js';

/** The most items one `POST /stock/batch` may ask for; more is 422 `too_many_items`. */
export const maxBatchItems = 100;

/** The highest stock level `PUT /stock/<item>` accepts. */
export const maxStockLevel = 1_000_000;

/** One item's level as the API returns it. */
export interface StockLevel {
  item: string;
  level: number;
}

/**
 * The stock routes:
 * - `GET /stock?item=<id>` (scope `stock:read`): one level; 404 `unknown_item`.
 * - `POST /stock/batch` (scope `stock:read`), body `{ "items": [ids] }`, 1 to {@link maxBatchItems}
 *   ids: every level in one response, in the order asked; any unknown id makes it 404 `unknown_item`
 *   with the unknown ids in `unknownItems`. A read, so no idempotency key is involved.
 * - `PUT /stock/<id>` (scope `stock:write` and role `admin`, both), body `{ "level": n }`: sets the
 *   absolute level (spec part 4), so sending it twice leaves the same state; 404 `unknown_item` for an
 *   unknown item, and for an id no item can have (see {@link resourceId}), before the body is read.
 *
 * @example
 * ```ts
 * registerStockRoutes(app, { db });
 * ```
 */
export function registerStockRoutes(app: Express, options: { db: Database }): void {
  const { db } = options;

  app.get('/stock', authorize(requireScopes('stock:read')), async (req: Request, res: Response) => {
    const item = req.query.item;
    if (typeof item !== 'string' || !resourceId.test(item)) {
      sendProblem(res, 'validation_failed', 'Give one item id as ?item=<id> (letters, digits, - and _).', {
        invalid: ['item'],
      });
      return;
    }
    const { rows } = await db.query<StockLevel>('select item, level from api_stock where item = $1', [item]);
    const row = rows[0];
    if (!row) {
      sendProblem(res, 'unknown_item', 'No stock item has this id.');
      return;
    }
    res.json({ item: row.item, level: row.level });
  });

  app.post(
    '/stock/batch',
    authorize(requireScopes('stock:read')),
    ...jsonObjectBody('16kb'),
    async (req: Request, res: Response) => {
      const body = req.body as Record<string, unknown>;
      const items = body.items;
      if (Array.isArray(items) && items.length > maxBatchItems) {
        sendProblem(res, 'too_many_items', `Ask for at most ${maxBatchItems} items per batch.`, {
          maxItems: maxBatchItems,
        });
        return;
      }
      const extra = unknownFields(body, ['items']);
      const itemsValid =
        Array.isArray(items) &&
        items.length > 0 &&
        items.every((item) => typeof item === 'string' && resourceId.test(item));
      if (!itemsValid || extra.length > 0) {
        // `invalid` names what is wrong: valid items beside an unknown member are not themselves invalid.
        sendProblem(res, 'validation_failed', `items must list 1 to ${maxBatchItems} item ids; no other members.`, {
          invalid: itemsValid ? extra : ['items', ...extra],
        });
        return;
      }
      const ids = items as string[];
      const unique = [...new Set(ids)];
      const { rows } = await db.query<StockLevel>('select item, level from api_stock where item = any($1::text[])', [
        unique,
      ]);
      const levels = new Map(rows.map((row) => [row.item, row.level]));
      const unknownItems = unique.filter((id) => !levels.has(id));
      if (unknownItems.length > 0) {
        sendProblem(res, 'unknown_item', 'Some of the items do not exist; nothing was read.', { unknownItems });
        return;
      }
      res.json({ levels: ids.map((item) => ({ item, level: levels.get(item) as number })) });
    },
  );

  const knownItemShape = (req: Request, res: Response, next: NextFunction) => {
    if (!resourceId.test(String(req.params.item))) {
      sendProblem(res, 'unknown_item', 'No stock item has this id.');
      return;
    }
    next();
  };

  app.put(
    '/stock/:item',
    // The role says who the user is; the scope says the user let this client act as an admin here.
    authorize(requireScopes('stock:write'), requireRoles('admin')),
    knownItemShape,
    ...jsonObjectBody('1kb'),
    async (req: Request, res: Response) => {
      const item = String(req.params.item);
      const body = req.body as Record<string, unknown>;
      const extra = unknownFields(body, ['level']);
      if (!isIntegerIn(body.level, 0, maxStockLevel) || extra.length > 0) {
        refuseInvalid(res, {
          ok: false,
          detail: `level must be an integer from 0 to ${maxStockLevel}; no other members.`,
          invalid: isIntegerIn(body.level, 0, maxStockLevel) ? extra : ['level', ...extra],
        });
        return;
      }
      const { rows } = await db.query<StockLevel>(
        'update api_stock set level = $2, updated_at = now() where item = $1 returning item, level',
        [item, body.level],
      );
      const row = rows[0];
      if (!row) {
        sendProblem(res, 'unknown_item', 'No stock item has this id.');
        return;
      }
      res.json({ item: row.item, level: row.level });
    },
  );
}

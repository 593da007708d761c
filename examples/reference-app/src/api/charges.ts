import { randomUUID } from 'node:crypto';
import { type Duration, type IdempotencyEvent, principalScope } from '@idem/core';
import { authorize, idempotency } from '@idem/express';
import { requireScopes } from '@idem/guard';
import type { PostgresStore, PostgresTransaction } from '@idem/postgres';
import type { Outbox } from '@idem/webhooks';
import type { Express, Request, Response } from 'express';
import { principalOf } from './internal-auth.js';
import { releaseServerErrors } from './outcome.js';
import { type Checked, isIntegerIn, jsonObjectBody, refuseInvalid, unknownFields } from './validation.js';

/** A charge as the API returns it. */
export interface Charge {
  id: string;
  amount: number;
  currency: string;
  status: 'succeeded';
  createdAt: string;
}

/** The largest amount one charge may carry, in the currency's smallest unit. */
export const maxChargeAmount = 100_000_000;

/** What `POST /charges` needs from the API. */
export interface ChargeRouteOptions {
  /** The transactional PostgreSQL/PGlite store of the charges' idempotency records. */
  store: PostgresStore;
  outbox: Outbox;
  /** Where the `payment.succeeded` event goes (the webhook receiver's endpoint). */
  webhookUrl: string;
  /** Told the idempotency events of the route (the API's `onIdempotencyEvent`). */
  onEvent?: ((event: IdempotencyEvent) => void) | undefined;
  /** The claim's lease (the API's `idempotencyLease`). Default the core's, `'10s'`. */
  lease?: Duration | undefined;
}

function checkCharge(body: Record<string, unknown>): Checked<{ amount: number; currency: string }> {
  const invalid: string[] = [];
  if (!isIntegerIn(body.amount, 1, maxChargeAmount)) invalid.push('amount');
  if (typeof body.currency !== 'string' || !/^[A-Z]{3}$/.test(body.currency)) invalid.push('currency');
  const extra = unknownFields(body, ['amount', 'currency']);
  if (invalid.length > 0 || extra.length > 0) {
    return {
      ok: false,
      detail: `amount must be an integer from 1 to ${maxChargeAmount} and currency three capital letters (ISO 4217); no other members.`,
      invalid: [...invalid, ...extra],
    };
  }
  return { ok: true, value: { amount: body.amount as number, currency: body.currency as string } };
}

/**
 * `POST /charges` (scope `charges:write`). The body is checked before the key is claimed, so an
 * invalid request never uses up a key. Then, in transactional mode, the charge row, the
 * `payment.succeeded` outbox row and the idempotency record commit in one transaction: a charge
 * without its event, or an event without its charge, cannot exist, and a retry after a crash either
 * replays the committed 201 or runs again from nothing. A request without `Idempotency-Key` gets one
 * minted by the server, returned with the 201 (spec part 3, rule 3). Keys are scoped to the user and
 * the OAuth client acting for them (`principalScope` with `perClient`).
 *
 * @example
 * ```ts
 * registerChargeRoutes(app, { store, outbox, webhookUrl: 'http://localhost:8084/webhooks/payments' });
 * ```
 */
export function registerChargeRoutes(app: Express, options: ChargeRouteOptions): void {
  const { outbox, webhookUrl } = options;
  const validate = (req: Request, res: Response, next: () => void) => {
    if (refuseInvalid(res, checkCharge(req.body as Record<string, unknown>))) return;
    next();
  };
  app.post(
    '/charges',
    authorize(requireScopes('charges:write')),
    ...jsonObjectBody('4kb'),
    validate,
    idempotency({
      store: options.store,
      transactional: true,
      mintKeys: true,
      // Keys belong to the user and the client acting for them: two apps of one user never collide.
      scope: (req) => principalScope(req.auth, { perClient: true }),
      // A 5xx rolls the whole transaction back (charge and event included): nothing happened.
      storeOutcome: releaseServerErrors,
      ...(options.onEvent ? { onEvent: options.onEvent } : {}),
      ...(options.lease === undefined ? {} : { lease: options.lease }),
    }),
    async (req: Request, res: Response) => {
      const context = req.idempotency;
      const tx = context?.tx as PostgresTransaction | undefined;
      if (!context || !tx) throw new Error('POST /charges runs only inside the idempotency transaction');
      const { amount, currency } = req.body as { amount: number; currency: string };
      const id = `ch_${randomUUID()}`;
      const { rows } = await tx.query<{ created_at: Date | string }>(
        `insert into api_charges (id, owner, amount, currency, idempotency_key)
         values ($1, $2, $3, $4, $5) returning created_at`,
        [id, principalOf(req).sub, amount, currency, context.key],
      );
      const createdAt = new Date(rows[0]?.created_at ?? Date.now()).toISOString();
      const charge: Charge = { id, amount, currency, status: 'succeeded', createdAt };
      // The event id derives from the charge: however often the relay delivers it, it is one event.
      await outbox.add(tx, {
        id: `evt_${id}`,
        url: webhookUrl,
        body: { type: 'payment.succeeded', timestamp: createdAt, data: charge },
      });
      res.status(201).json(charge);
    },
  );
}

import { randomUUID } from 'node:crypto';
import { createClient, isRequestFailedError } from '@idem/client';
import type { Request, Response } from 'express';
import { dbUnavailable } from '../db-unavailable.js';
import type { AppContext } from './app-context.js';
import { keyShape } from './key-shape.js';
import type { Flash } from './sessions.js';

/**
 * What a POST /charges knows of its charge, as it goes: what the 503 page of a database that fails
 * next says (see `storeUnavailablePage`). Each step is noted before the route's next database
 * statement, and replaces the one before it. Keyed by the request, so it goes with it.
 * - `sending`: a runnable charge about to go out, with the session's CSRF token for a form that sends
 *   it again under its key (only once it went out does the page offer it).
 * - `created`: the API answered 2xx on this request (created, or its stored 201 replayed).
 * - `refused`: the API refused it on every attempt (a 4xx each time: nothing ran, as the route's
 *   `mayHaveRun` says), with the last status.
 * - `key-taken`: the API refused it because its key stands for another charge (`fingerprint_mismatch`,
 *   `idempotency_error`): nothing ran for this one, and the same key would be refused again.
 */
export type ChargeSoFar =
  | { step: 'sending'; key: string; amount: number; currency: string; csrf: string }
  | { step: 'created'; key: string; amount: number; currency: string }
  | { step: 'refused'; status: number }
  | { step: 'key-taken'; status: number; code: string };
export const chargeSoFar: WeakMap<Request, ChargeSoFar> = new WeakMap();

/** POST /charges (behind `withSession`): creates the charge, retried under one key, and says what came of it. */
export function createCharge(ctx: AppContext) {
  const { sessions, csrf, signedIn, refreshedToken, sentToApi, showOnce, baseUrl, retryTiming } = ctx;
  return async (req: Request, res: Response, id: string): Promise<void> => {
    const amount = Number(req.body?.amount);
    const currency = String(req.body?.currency ?? '').toUpperCase();
    // "Send the same charge again" posts the key of the first one: the retry a user makes by hand
    // after a lost answer. Only the shape of a key the client itself makes is taken from the form.
    const repeatKey = typeof req.body?.key === 'string' && keyShape.test(req.body.key) ? req.body.key : undefined;
    // Kept before the API is called, so a Back or a reload that comes while it works finds the
    // charge (and its key) too. Only a charge that can run: one the API refuses on sight ran nothing,
    // and a new key for it is harmless. `open` is the session's open charge, this one's or not.
    const runnable = Number.isSafeInteger(amount) && amount > 0 && /^[A-Z]{3}$/.test(currency);
    const open =
      repeatKey !== undefined && runnable
        ? await sessions.openCharge(id, { key: repeatKey, amount, currency })
        : undefined;
    // What the API said, with this request's details: a kept form sent again after a refusal (which
    // ran nothing) may carry another amount, and that is the charge its key now stands for.
    const settle = async (outcome: 'created' | 'refused') => {
      if (repeatKey !== undefined && open?.key === repeatKey)
        await sessions.settleCharge(id, { key: repeatKey, amount, currency, outcome });
    };
    // @idem/client makes one key for this logical charge and reuses it on every retry (network
    // errors, 409 while the first attempt runs, 502-504), backing off about 1 s, 2 s, 4 s with
    // jitter. Each attempt reads the session's access token as it is then, refreshed if it is about
    // to expire (once per session, as for any request); none if the session ended meanwhile. After
    // a 401 invalid_token the client asks once for a token other than the one it sent
    // (`refresh: true`): the session is refreshed then, whatever its token's expiry says, or the
    // same refused token would go again.
    let given: string | undefined;
    const client = createClient({
      baseUrl,
      getToken: async ({ refresh }) => {
        given = refresh ? await refreshedToken(req, given) : (await signedIn(req))?.data.tokens?.accessToken;
        // With a token the charge goes out: from here on it may have run.
        if (given !== undefined) sentToApi.add(req);
        return given;
      },
      retry: { maxAttempts: 4, deadline: '15s', timeout: '5s' },
      ...retryTiming,
    });
    // The key is settled here, not left to the client to make, so that a database failing after the
    // charge went out can offer the same charge again under it (chargeSoFar, storeUnavailablePage).
    const key = repeatKey ?? randomUUID();
    if (runnable) chargeSoFar.set(req, { step: 'sending', key, amount, currency, csrf: csrf.issue(req, res, id) });
    const lines: string[] = [];
    let repeat: { key: string; amount: number; currency: string } | undefined;
    let charge: Flash['charge'];
    try {
      const result = await client.post('/charges', { amount, currency }, { idempotencyKey: key });
      // The client resolves on any status below 400, and does not follow a write's redirect: a 3xx
      // (the API, or a proxy in front of it, answering 303 or 307) is its answer. That is no 2xx,
      // and no refusal either: the charge may have run. Said so, and its key kept for the same
      // charge sent again, as after a lost answer; the 503 page's step stays `sending` (outcome unknown).
      if (result.status < 200 || result.status >= 300) {
        repeat = { key, amount, currency };
        charge = { key, settled: false };
        lines.push(
          `The API answered ${result.status} and not whether the charge was made: it may have gone through. Send it again with the same key to find out.`,
          `Idempotency-Key: ${key}`,
          `Attempts: ${result.attempts.length}`,
        );
      } else {
        // Before anything below meets the database: a 503 then says the charge was created, as the
        // API's 2xx on this request says.
        chargeSoFar.set(req, { step: 'created', key, amount, currency });
        await settle('created');
        if (result.key) {
          repeat = { key: result.key, amount, currency };
          charge = { key: result.key, settled: true };
        }
        lines.push(
          'Charge created.',
          `Idempotency-Key: ${result.key}`,
          `Status ${result.status}`,
          `Attempts: ${result.attempts.length}`,
          `Replayed: ${result.replayed ? 'yes' : 'no'}`,
          JSON.stringify(result.body),
        );
      }
    } catch (error) {
      if (!isRequestFailedError(error)) throw error;
      // The session's token could not be read (getToken): the app's database failed, not the API.
      // Its last error handler answers that, saying whether an earlier attempt went out.
      if (error.code === 'token_failed' && dbUnavailable(error.cause)) throw error.cause;
      const title =
        typeof error.body === 'object' && error.body !== null && 'title' in error.body ? String(error.body.title) : '';
      const code =
        typeof error.body === 'object' && error.body !== null && 'code' in error.body ? error.body.code : undefined;
      if (error.key && (code === 'fingerprint_mismatch' || code === 'idempotency_error')) {
        // Before the session is read: a 503 then says this charge was not made, offering no same key.
        if (error.status !== undefined) chargeSoFar.set(req, { step: 'key-taken', status: error.status, code });
        // Its key already stands for another charge (a kept form whose amount was changed, or an
        // old tab's form): this one never ran, whatever its earlier attempts met (had one run, its
        // record would hold this very request, and be replayed). Said in words, with that first
        // charge as far as this session knows it, and the way to make this one: the form below,
        // under a new key (the page that shows this ends the kept one).
        const first = (await sessions.get(id))?.openCharge;
        const known = first?.key === error.key ? first : undefined;
        lines.push(
          'Not charged: this form had already been sent with other details.',
          `Its key stands for that first charge only, so the API ran nothing for this one (${error.status} ${code}).`,
          known === undefined
            ? 'The first charge was shown on the page its own sending led to.'
            : known.outcome === 'created'
              ? `Your charge of ${known.amount} ${known.currency} went through: that is the first charge.`
              : `The first charge was of ${known.amount} ${known.currency}; whether it went through is not known here: send it again with its key to find out.`,
          `To charge ${amount} ${currency}, send the form below: it is a new charge.`,
          `Idempotency-Key: ${error.key}`,
        );
        if (known !== undefined && known.outcome !== 'created')
          repeat = { key: error.key, amount: known.amount, currency: known.currency };
        charge = { key: error.key, settled: true };
        await showOnce(res, id, { title: 'Create charge', lines, ...(repeat ? { repeat } : {}), charge });
        return;
      }
      // An attempt with no answer, a 5xx or a 409 (the first attempt still running) leaves the
      // outcome unknown, whatever came after it (a 401 once the session ended, a 429), and so does
      // a success whose answer could not be read: the charge may have gone through. Its key is kept
      // for the user's own retry (spec 2.1: the same key on every retry), never a new one. Refusals
      // alone (4xx on every attempt) ran nothing, and would be refused again.
      const unanswered = (status: number | undefined) => status === undefined || status >= 500 || status === 409;
      const mayHaveRun =
        error.attempts.some((attempt) => unanswered(attempt.status)) ||
        (error.status !== undefined && error.status < 400);
      if (mayHaveRun && error.key) repeat = { key: error.key, amount, currency };
      // Before anything below meets the database: a 503 then says nothing was charged.
      if (!mayHaveRun && error.status !== undefined) chargeSoFar.set(req, { step: 'refused', status: error.status });
      if (!mayHaveRun) await settle('refused');
      if (error.key) charge = { key: error.key, settled: !mayHaveRun };
      lines.push(
        error.status === undefined || error.status >= 500
          ? `API unavailable (${error.code}).`
          : error.status === 409
            ? 'Still in progress at the API (409): send it again with the same key in a moment.'
            : `The API refused: ${error.status} ${title}`.trim(),
        `Idempotency-Key: ${error.key ?? '(none)'}`,
        `Attempts: ${error.attempts.length}`,
      );
      // A refusal says what to change: "422 The request is not valid" alone leaves the person to
      // guess that the amount is over the limit. The API's problem detail (RFC 9457) says which.
      const detail =
        typeof error.body === 'object' && error.body !== null && 'detail' in error.body ? error.body.detail : undefined;
      if (!mayHaveRun && typeof detail === 'string' && detail !== '') lines.splice(1, 0, detail);
    }
    // The flash only: the charge may have taken 15 s, and a request of the same session may have
    // rotated the refresh token meanwhile; writing back the one read at the start would bring back a
    // used token, which the provider takes for reuse at the next refresh and revokes the grant.
    await showOnce(res, id, {
      title: 'Create charge',
      lines,
      ...(repeat ? { repeat } : {}),
      ...(charge ? { charge } : {}),
    });
  };
}

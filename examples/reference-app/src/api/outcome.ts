import { type Outcome, resolveOutcomePolicy } from '@idem/core';

const byDefault = resolveOutcomePolicy('all');

/**
 * The outcome policy of the API's creates: the default (`'all'`, which leaves 401, 403 and 429 out,
 * since those were refused before anything ran), except that a 5xx is released too. Each create's
 * effects are one transaction or one statement, so a 5xx means nothing happened: the retry runs,
 * instead of replaying the failure for 24 hours.
 *
 * @example
 * app.post('/photos', idempotency({ store, storeOutcome: releaseServerErrors }), handler);
 */
export const releaseServerErrors = (outcome: Outcome): boolean => outcome.status < 500 && byDefault(outcome) !== false;

/**
 * How the API's sender retries a payment event, and how long the receiver remembers event ids.
 *
 * Spec part 6: "The sender retries an event until it is acknowledged." The library's default gives up
 * after 24 hours (as Stripe does after 3 days), which would leave a receiver that was down for a day
 * without the event. Here the backoff grows to an hour between attempts and goes on for a year: any
 * outage short of that is bridged, at an attempt every half hour on average once the backoff is at
 * its cap (full jitter draws each wait from zero to the cap). Only an endpoint that answers 410
 * Gone, or stays dark for a year, ends in the outbox's dead letters; a row's history keeps the first
 * and the latest of its attempts, so a long outage does not grow it.
 *
 * The receiver must recognise the latest retry as one it has seen, so it keeps ids longer than the
 * sender retries (an id's record is a few hundred bytes; the purge clears them after that).
 *
 * @example
 * createSender({ secret, schedule: webhookSchedule });
 */
export const webhookSchedule = { cap: '1h', horizon: '365d' } as const;

/** How long the receiver remembers an event id: the sender's horizon, with a month of margin. */
export const webhookRetention = '395d';

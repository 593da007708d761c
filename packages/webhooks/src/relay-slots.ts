import { abortableSleep } from '@idem/client';

/** How many URLs without an answer the loop remembers (each then gets one slot). */
const maxUnanswered = 10_000;

/** How many claims in a row may come back empty, though rows were due, before the loop waits its poll. */
const maxEmptyClaims = 3;

/** What one claim of the slot loop gave. */
export interface SlotClaim<Row extends { url: string }> {
  /** Rows that take a slot (an attempt, or a takeover that puts the row back). */
  work: Row[];
  /** Rows the claim took, those that took no slot (dead-lettered by the claim itself) included. */
  claimed: number;
  /**
   * Due rows were left out (for their URL's share, the limit, or another relay's claim that took them
   * first): a claim made at once may find more.
   */
  moreDue: boolean;
}

/** What the slot loop needs from the relay. */
export interface SlotLoopOptions<Row extends { url: string }> {
  /** How many rows may be in flight at once. */
  slots: number;
  /** How many of them may be one URL's. */
  maxPerUrl: number;
  /** The pause when nothing more was due, or a claim failed. */
  pollMs: number;
  /** Claims up to `limit` rows; `room` says how many more of each URL in flight may come. */
  claim(limit: number, room: ReadonlyMap<string, number>): Promise<SlotClaim<Row>>;
  /**
   * Works one row to its end. It must settle within the row's lease (the relay races it against one).
   * Resolves to whether its endpoint answered: `false` (a timeout, a refused or broken connection)
   * leaves the URL one slot until an attempt of it is answered; `undefined` (no attempt was made, a
   * takeover) changes nothing.
   */
  work(row: Row): Promise<boolean | undefined>;
  /** Told what a claim or a row's work failed with. */
  onError(error: unknown): void;
}

/**
 * The `start()` loop of an outbox relay: up to `slots` rows in flight, each on its own, and a claim
 * again as soon as one ends. Rounds used to end together: the next claim waited for every attempt of
 * the last one, so a row whose endpoint hung held its round's other slots empty for the whole
 * timeout, and with a backlog for that endpoint, every round. Here a slot is taken again the moment
 * it is free, and no URL holds more than `maxPerUrl` of them, so the other endpoints' events go out
 * through the rest while one endpoint keeps its attempts waiting.
 *
 * Claims again at once while a claim left due rows out (for a URL's share: the next claim leaves
 * that URL out, and reaches the rows behind its backlog; or lost to another relay's claim: a few
 * times in a row at most when it took nothing). Otherwise waits for
 * `pollMs`, or for a slot to free (a URL that was at its share may have due rows): a free slot
 * costs at most one claim that finds nothing. After `signal` aborts it claims no more and resolves
 * once every row in flight has settled, each within its lease.
 */
export async function runSlots<Row extends { url: string }>(
  options: SlotLoopOptions<Row>,
  signal: AbortSignal,
): Promise<void> {
  const { slots, maxPerUrl, pollMs } = options;
  const inFlight = new Set<Promise<void>>();
  const perUrl = new Map<string, number>();
  // How many slots have freed so far, and the wait (at most one) to wake when the next one does.
  // Not one shared promise "a slot freed" that each wait races: it stays the same until a slot
  // frees, and Promise.race leaves a reaction on it per wait that only its settling releases, so
  // an idle loop (or one whose rows in flight are all slow) kept about 300 bytes more per poll,
  // for as long as it stayed so.
  let freedCount = 0;
  let wake: (() => void) | undefined;
  // URLs whose last attempt got no answer: one slot each, not maxPerUrl, until one is answered. A
  // share bounds what one dead endpoint takes, but two of them at half the slots each took them all,
  // and every other endpoint's events waited out the timeout again. An endpoint that answers, even
  // with an error, keeps its share. Oldest first, and bounded: dead URLs whose rows are all gone
  // would otherwise stay here for the life of the process.
  const unanswered = new Map<string, true>();
  const heard = (url: string, answered: boolean | undefined) => {
    if (answered === undefined) return;
    unanswered.delete(url);
    if (answered) return;
    unanswered.set(url, true);
    if (unanswered.size > maxUnanswered) unanswered.delete(unanswered.keys().next().value as string);
  };

  const begin = (row: Row) => {
    perUrl.set(row.url, (perUrl.get(row.url) ?? 0) + 1);
    const task = options
      .work(row)
      .then(
        (answered) => heard(row.url, answered),
        (error: unknown) => options.onError(error),
      )
      .finally(() => {
        inFlight.delete(task);
        const left = (perUrl.get(row.url) ?? 1) - 1;
        if (left === 0) perUrl.delete(row.url);
        else perUrl.set(row.url, left);
        freedCount++;
        wake?.();
      });
    inFlight.add(task);
  };

  // Waits until a slot has freed since `freedBefore` (at once if one already has), for `sleepMs`
  // if given, or for the loop's abort, whichever comes first. It leaves nothing behind: no listener
  // on `signal` (an idle loop waits many times; Node warns past 10), no reaction on a promise that
  // outlives it. abortableSleep takes a pollInterval longer than one timer holds in steps.
  const pause = async (freedBefore: number, sleepMs: number | undefined) => {
    if (freedCount !== freedBefore) return;
    const ended = new AbortController();
    const end = () => ended.abort();
    signal.addEventListener('abort', end, { once: true });
    wake = end;
    try {
      const waits = [new Promise<void>((resolve) => ended.signal.addEventListener('abort', () => resolve()))];
      if (sleepMs !== undefined) waits.push(abortableSleep(sleepMs, ended.signal).catch(() => undefined));
      await Promise.race(waits);
    } finally {
      wake = undefined;
      signal.removeEventListener('abort', end);
      ended.abort();
    }
  };

  let emptyButDue = 0;
  while (!signal.aborted) {
    // Taken before the claim: a slot that frees while it runs still ends the wait after it.
    const freed = freedCount;
    const free = slots - inFlight.size;
    let outcome: 'more' | 'idle' | 'failed' = 'idle';
    if (free > 0) {
      try {
        const room = new Map<string, number>();
        for (const url of unanswered.keys()) room.set(url, 1 - (perUrl.get(url) ?? 0));
        for (const [url, count] of perUrl) if (!unanswered.has(url)) room.set(url, maxPerUrl - count);
        const claimed = await options.claim(free, room);
        for (const row of claimed.work) begin(row);
        // A claim that took nothing though rows were due lost them to another relay's claim made at
        // the same moment: claim again at once, but not for ever (a row another statement holds
        // locked for a while would make every claim come back empty).
        emptyButDue = claimed.claimed === 0 && claimed.moreDue ? emptyButDue + 1 : 0;
        if (claimed.moreDue && emptyButDue <= maxEmptyClaims) outcome = 'more';
      } catch (error) {
        // The database is down: rows stay leased or pending; try again after the pause.
        options.onError(error);
        outcome = 'failed';
      }
    }
    if (signal.aborted) break;
    if (outcome === 'more' && inFlight.size < slots) continue;
    if (outcome === 'failed') await abortableSleep(pollMs, signal).catch(() => undefined);
    // Every slot taken: claim again when one frees. Else nothing more was due: claim again after
    // the poll, or when a slot frees (its URL, at its share, may have rows waiting).
    else await pause(freed, inFlight.size >= slots ? undefined : pollMs);
    emptyButDue = 0;
  }
  await Promise.allSettled([...inFlight]);
}

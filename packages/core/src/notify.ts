/**
 * Calls an observer (`onEvent`, `onEvict`, a metrics hook) and drops whatever it throws or rejects
 * with: an observer never changes an outcome, and an async one whose rejection went unheard would
 * end a Node process (unhandled rejections are fatal by default).
 *
 * @example
 * notify(options.onEvent, { type: 'replay', id, at: now() });
 */
export function notify<A extends unknown[]>(observer: ((...args: A) => unknown) | undefined, ...args: A): void {
  try {
    const result = observer?.(...args);
    if (typeof (result as PromiseLike<unknown> | undefined)?.then === 'function')
      Promise.resolve(result).catch(dropped);
  } catch {
    // Dropped: see above.
  }
}

function dropped() {
  // An observer's failure is not the caller's.
}

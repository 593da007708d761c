/**
 * Calls an observer (`onRetry`) and drops whatever it throws or rejects with: an observer never
 * changes an outcome, and an async one whose rejection went unheard would end a Node program.
 * (The client has no dependencies, so it keeps its own copy of @idem/core's helper.)
 *
 * @example
 * notify(onRetry, event);
 */
export function notify<E>(observer: (event: E) => unknown, event: E): void {
  try {
    const result = observer(event);
    if (typeof (result as PromiseLike<unknown> | undefined)?.then === 'function')
      Promise.resolve(result).catch(dropped);
  } catch {
    // Dropped: see above.
  }
}

function dropped() {
  // An observer's failure is not the caller's.
}

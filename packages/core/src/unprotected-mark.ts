// A request an idem middleware let through unprotected (`storeUnavailable: 'fail-open'`) carries no
// idempotency context, so a second instance stacked behind it could not tell it was taken, and would
// try the store again (a second claim, a second `store-error` event). The adapter marks the request
// (Express's `req`, Koa's `ctx`) instead, and the second instance steps aside as behind one that
// claimed. A registered symbol, so two copies of core in one app (two adapter versions) see one mark.
const unprotectedMark = Symbol.for('@idem/core.unprotected');

type Marked = { [unprotectedMark]?: true };

/** Marks `carrier` (the framework's request object) as run unprotected by an idem middleware. */
export function markUnprotected(carrier: object): void {
  (carrier as Marked)[unprotectedMark] = true;
}

/** True when an idem middleware already let `carrier`'s request through unprotected (see {@link markUnprotected}). */
export function ranUnprotected(carrier: object): boolean {
  return (carrier as Marked)[unprotectedMark] === true;
}

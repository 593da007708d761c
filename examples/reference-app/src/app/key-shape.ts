/** The keys `@idem/client` makes (UUIDs) and nothing else, when a key comes back in a form. */
export const keyShape = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** The slots a flash waits in (UUIDs the app makes), as the page's `shown` query names them. */
export const flashSlot = keyShape;

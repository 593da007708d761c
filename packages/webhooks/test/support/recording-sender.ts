import { createSender } from '../../src/index.js';

/** The secret the recording sender signs with. */
const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';

/**
 * A sender whose fetch answers 204 and keeps the headers of every request, for tests of what goes out.
 *
 * @example
 * const { sender, sent } = recordingSender({ 'x-tenant': 't1' });
 */
export function recordingSender(headers?: Record<string, string>) {
  const sent: Record<string, string>[] = [];
  const sender = createSender({
    secret: SECRET,
    ...(headers ? { headers } : {}),
    fetch: (async (_url: string | URL, init: RequestInit = {}) => {
      sent.push(init.headers as Record<string, string>);
      return new Response(null, { status: 204 });
    }) as typeof globalThis.fetch,
  });
  return { sender, sent };
}

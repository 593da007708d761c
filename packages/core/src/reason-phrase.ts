import type { ServerResponse } from 'node:http';
import { isFieldValue } from './header-syntax.js';
import { streamOf } from './response-state.js';

/**
 * The reason phrase `res` would go out with for `status` (its `statusMessage`: Express
 * `res.statusMessage`, Koa `ctx.message`, Fastify `reply.raw.statusMessage`), when it is the
 * handler's own rather than the one Node sends by default; undefined otherwise, for one Node cannot
 * write (idem drops it: see `IDEM_UNWRITABLE_REASON_PHRASE`), and over HTTP/2, which has none. An
 * adapter that settles an outcome from what the handler left calls
 * {@link ResponseCapture.completeAsWritten}, which takes the phrase so.
 *
 * @example
 * const phrase = ownReasonPhrase(res, 201); // 'Created Fine', or undefined for 'Created'
 */
export function ownReasonPhrase(res: ServerResponse, status: number): string | undefined {
  // Not read over HTTP/2: Node's Http2ServerResponse warns (UnsupportedWarning) when it is.
  if (streamOf(res) !== undefined) return undefined;
  return phraseOfOwn(res, res.statusMessage, status);
}

export function phraseOfOwn(res: ServerResponse, reason: unknown, status: number): string | undefined {
  if (streamOf(res) !== undefined) return undefined;
  // Node sends the default for an empty or missing one (`statusMessage ||= STATUS_CODES[status]`).
  if (typeof reason !== 'string' || reason === '' || reason === defaultReasonPhrases()[status]) return undefined;
  // One Node refuses to write never goes out (see dropUnwritablePhrase), so none is replayed either.
  return isFieldValue(reason) ? reason : undefined;
}

// Node's table of default phrases, looked up when a response is stored rather than imported: this
// module loads on runtimes without node:http (the engine on Workers).
let reasonPhrases: Readonly<Record<number, string | undefined>> | undefined;
function defaultReasonPhrases(): Readonly<Record<number, string | undefined>> {
  reasonPhrases ??=
    (process.getBuiltinModule?.('node:http') as typeof import('node:http') | undefined)?.STATUS_CODES ?? {};
  return reasonPhrases;
}

import type { ServerResponse } from 'node:http';
import { destroyedOf } from './response-state.js';

export const pipedKey = Symbol('idem piped');

// The last body stream piped into a response ('pipe' hands it over), kept on the response itself so
// that one listener serves every response, not a closure per request.
export type Piped = ServerResponse & { [pipedKey]?: PipedSource };

type PipedSource = { destroyed?: boolean; readableEnded?: boolean; errored?: unknown } | true;

export function markPiped(this: Piped, source: unknown) {
  this[pipedKey] = typeof source === 'object' && source !== null ? (source as PipedSource) : true;
}

// The source stays marked as once piped (a destroy after it is still a failed answer), but is no
// longer held: what `livePipeInto` asks is whether a body stream is piped into the response now.
// Only a response still open forgets it: the unpipe a close brings (over HTTP/2 before the
// response's own 'close' is seen) is the pipe stopping with it, which `livePipeInto` is about.
export function markUnpiped(this: Piped, source: unknown) {
  if (this[pipedKey] === source && !destroyedOf(this)) this[pipedKey] = true;
}

/**
 * Whether a body stream piped into the response is still live: neither destroyed (failed, or torn
 * down by a pipeline) nor ended. One that failed before the close is over, and the handler may answer
 * whole after it (a cached file missing, the answer built instead); one that ended has ended the
 * response too, or handed it back to the handler (`{ end: false }`).
 */
export function livePipeInto(res: ServerResponse): boolean {
  const source = (res as Piped)[pipedKey];
  if (source === undefined || source === true) return false;
  return source.destroyed !== true && source.readableEnded !== true && (source.errored ?? null) === null;
}

import type { FetchFunction } from '@idem/client';

/** One request the fake fetch saw. */
export interface SeenRequest {
  url: string;
  method: string;
  headers: Headers;
  body: string | undefined;
}

/** What a scripted step does: answer with a response, or throw (a network error). */
export type Step = Response | Error | ((request: SeenRequest, signal: AbortSignal) => Response | Promise<Response>);

/**
 * A fetch that plays `steps` in order (the last one repeats) and records every request, so a test
 * can assert what each attempt carried.
 */
export function scriptedFetch(steps: Step[]) {
  const seen: SeenRequest[] = [];
  const fetch: FetchFunction = async (input, init) => {
    const headers = new Headers(init.headers);
    const body = init.body === undefined || init.body === null ? undefined : await new Response(init.body).text();
    const request: SeenRequest = { url: input, method: init.method ?? 'GET', headers, body };
    seen.push(request);
    const step = steps[Math.min(seen.length - 1, steps.length - 1)];
    if (step === undefined) throw new Error('no step scripted');
    if (step instanceof Error) throw step;
    if (typeof step === 'function') return step(request, init.signal as AbortSignal);
    return step.clone();
  };
  return { fetch, seen };
}

/** A JSON response. */
export function json(status: number, body: unknown, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(body), { status, headers: { 'content-type': 'application/json', ...headers } });
}

/** An empty response with headers. */
export function empty(status: number, headers: Record<string, string> = {}): Response {
  return new Response(null, { status, headers });
}

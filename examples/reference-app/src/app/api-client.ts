/** The outcome of one API call, as a value: pages render each kind, none of them throws. */
export type ApiResult =
  | { kind: 'ok'; status: number; body: unknown; headers: Headers }
  | { kind: 'refused'; status: number; title: string; body: unknown; headers: Headers }
  | { kind: 'redirected'; status: number; headers: Headers }
  | { kind: 'unavailable'; reason: string };

/** One request to the API. */
export interface ApiRequest {
  method: 'GET' | 'POST' | 'PUT' | 'DELETE';
  path: string;
  body?: unknown;
  headers?: Record<string, string>;
}

/**
 * Calls the API at `baseUrl` with the access token in the `Authorization` header (never in the URL).
 * A network failure, a timeout or a gateway error (502, 503, 504) is `unavailable`; a 3xx (the API,
 * or a proxy in front of it, sending the request elsewhere: never followed, a token goes nowhere but
 * the API) is `redirected`, which says nothing of whether a write was done; any other non-2xx is
 * `refused` with the problem's title when it sent one.
 *
 * @example
 * ```ts
 * const result = await callApi('http://localhost:8080', accessToken, { method: 'GET', path: '/photos' });
 * if (result.kind === 'unavailable') showApiUnavailable();
 * ```
 */
export async function callApi(baseUrl: string, accessToken: string, request: ApiRequest): Promise<ApiResult> {
  let response: Response;
  try {
    response = await fetch(new URL(request.path, baseUrl), {
      method: request.method,
      headers: {
        authorization: `Bearer ${accessToken}`,
        accept: 'application/json, application/problem+json',
        ...(request.body === undefined ? {} : { 'content-type': 'application/json' }),
        ...request.headers,
      },
      ...(request.body === undefined ? {} : { body: JSON.stringify(request.body) }),
      redirect: 'manual',
      signal: AbortSignal.timeout(5000),
    });
  } catch (error) {
    const reason = error instanceof Error && error.name === 'TimeoutError' ? 'timed out' : 'could not connect';
    return { kind: 'unavailable', reason };
  }
  const text = await response.text().catch(() => '');
  let body: unknown = text;
  if (/json/i.test(response.headers.get('content-type') ?? '')) {
    try {
      body = JSON.parse(text);
    } catch {
      body = text;
    }
  }
  if (response.ok) return { kind: 'ok', status: response.status, body, headers: response.headers };
  if (response.status >= 300 && response.status < 400) {
    return { kind: 'redirected', status: response.status, headers: response.headers };
  }
  if (response.status === 502 || response.status === 503 || response.status === 504) {
    return { kind: 'unavailable', reason: `answered ${response.status}` };
  }
  const title =
    typeof body === 'object' && body !== null && 'title' in body && typeof body.title === 'string'
      ? body.title
      : `HTTP ${response.status}`;
  return { kind: 'refused', status: response.status, title, body, headers: response.headers };
}

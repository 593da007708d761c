// The guard's 401s as a server under test sends them, and a client whose getToken records what it
// was asked, for the test files on how the client treats them (certificate-401, retryable-401). The
// answers are the guard's (packages/guard/src/errors.ts: GuardError's wwwAuthenticate and toProblem).
import type { ServerResponse } from 'node:http';
import { createClient, type RetryOptions, type TokenContext } from '@idem/client';
import { fakeTime } from './fake-time.js';

/** One of the guard's refusals: its problem code and title, its challenge's error and description. */
export interface GuardRefusal {
  code: string;
  title: string;
  error: string;
  description: string;
  retryable: boolean;
}

/** Answers as the guard's glue does: 401, its challenge (DPoP for a proof's fault), its problem. */
export function refuseAsGuard(res: ServerResponse, refusal: GuardRefusal): void {
  const scheme = refusal.error === 'invalid_dpop_proof' ? 'DPoP' : 'Bearer';
  res
    .writeHead(401, {
      'content-type': 'application/problem+json',
      'www-authenticate': `${scheme} realm="api", error="${refusal.error}", error_description="${refusal.description}"`,
    })
    .end(
      JSON.stringify({
        type: `https://idem.dev/problems/${refusal.code.replaceAll('_', '-')}`,
        title: refusal.title,
        status: 401,
        detail: refusal.description,
        code: refusal.code,
        retryable: refusal.retryable,
      }),
    );
}

/**
 * A client on fake time (waits recorded, none real), and a getToken that records what it was asked
 * and gives a new token on each refresh: `token-0` first, `token-1` after one refresh, and so on.
 */
export function clientWithTokens(url: string, retry?: RetryOptions) {
  const time = fakeTime();
  const asked: TokenContext[] = [];
  let issued = 0;
  const client = createClient({
    baseUrl: url,
    sleep: time.sleep,
    now: time.now,
    random: () => 0.5,
    ...(retry === undefined ? {} : { retry }),
    getToken: (context) => {
      asked.push(context);
      if (context.refresh) issued++;
      return `token-${issued}`;
    },
  });
  return { client, time, asked };
}

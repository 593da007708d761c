// A claim on a session's refresh (sessions.ts, claimRefresh) is taken over once its time passes, as
// the claim of a process that died. A live refresh still talking to the provider past that time
// would then present its refresh token alongside the one that took over: reuse, and the grant is
// revoked. The claim must outlast the longest refresh the provider client allows, whatever that
// client's request timeout is set to; it was tied to oidc-client.ts's 5 s by a comment only.
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { providerRequestsPerRefresh, providerTimeoutMs } from '../src/app/oidc-client.js';
import { refreshLeaseSeconds } from '../src/app/sessions.js';

describe('the refresh claim and the provider client', () => {
  it("a claim lasts twice the longest refresh: the refresh's requests, each given up at the client's timeout", () => {
    expect(providerTimeoutMs).toBeGreaterThan(0);
    expect(providerRequestsPerRefresh).toBe(3); // discovery, the token request, the provider's keys
    expect(refreshLeaseSeconds * 1000).toBe(2 * providerRequestsPerRefresh * providerTimeoutMs);
  });

  // The README tells operators how long a process that died keeps a session from refreshing; the
  // number was written out there by hand, while the code computes it from the provider timeout.
  it('is as long as the README says: "for <n> seconds at most (twice the longest a refresh can take)"', () => {
    const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8').replace(/\s+/g, ' ');
    const stated =
      /claimed on the session's row first, for (\d+) seconds at most \(twice the longest a refresh can take\)/.exec(
        readme,
      );
    expect(stated, 'examples/reference-app/README.md states the claim time').not.toBeNull();
    expect(Number(stated?.[1])).toBe(refreshLeaseSeconds);
    // "the claim of a process that died mid-refresh ends with its <n> seconds": the same number.
    expect(readme).toContain(
      `the claim of a process that died mid-refresh ends with its ${refreshLeaseSeconds} seconds`,
    );
  });
});

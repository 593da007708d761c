// A claim on a session's refresh (sessions.ts, claimRefresh) is taken over once its time passes, as
// the claim of a process that died. A live refresh still talking to the provider past that time
// would then present its refresh token alongside the one that took over: reuse, and the grant is
// revoked. The claim must outlast the longest refresh the provider client allows, whatever that
// client's request timeout is set to; it was tied to oidc-client.ts's 5 s by a comment only.
import { describe, expect, it } from 'vitest';
import { providerRequestsPerRefresh, providerTimeoutMs } from '../src/app/oidc-client.js';
import { refreshLeaseSeconds } from '../src/app/sessions.js';

describe('the refresh claim and the provider client', () => {
  it("a claim lasts twice the longest refresh: the refresh's requests, each given up at the client's timeout", () => {
    expect(providerTimeoutMs).toBeGreaterThan(0);
    expect(providerRequestsPerRefresh).toBe(3); // discovery, the token request, the provider's keys
    expect(refreshLeaseSeconds * 1000).toBe(2 * providerRequestsPerRefresh * providerTimeoutMs);
  });
});

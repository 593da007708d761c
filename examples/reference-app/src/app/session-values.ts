/** One sign-in in progress: everything the callback must check, used once and then deleted. */
export interface PendingSignIn {
  state: string;
  nonce: string;
  codeVerifier: string;
  returnTo: string;
}

/** What the user sees from the ID token. */
export interface SignedInUser {
  sub: string;
  name?: string | undefined;
  email?: string | undefined;
}

/** Tokens, kept on the server only. `expiresAt` is epoch milliseconds by the app's clock. */
export interface SessionTokens {
  accessToken: string;
  refreshToken?: string | undefined;
  expiresAt: number;
  scope?: string | undefined;
}

export { type ApiRequest, type ApiResult, callApi } from './api-client.js';
export { createOidcClient, type OidcClient, type OidcClientOptions, type SignInResult } from './oidc-client.js';
export { homePage, signedOutPage, signInAgainPage, signInFailedPage } from './pages.js';
export { migrateApp } from './schema.js';
export {
  appScope,
  createThirdPartyApp,
  safeReturnTo,
  type ThirdPartyApp,
  type ThirdPartyAppEvent,
  type ThirdPartyAppOptions,
} from './server.js';
export {
  createSessionStore,
  type Flash,
  type PendingSignIn,
  type SessionData,
  type SessionStore,
  type SessionTokens,
  type SignedInUser,
} from './sessions.js';

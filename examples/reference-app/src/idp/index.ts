export { errorPage } from '../html.js';
export { apiScopes, roleScopes } from '../scopes.js';
export {
  defaultRefreshTokenReuseSeconds,
  purgeExpiredModels,
  type SqlAdapterOptions,
  sqlAdapterFactory,
} from './adapter.js';
export { assertRedirectUris, findClient, saveClient } from './clients.js';
export { type ProviderRoute, providerMethods, providerRouteAt, providerRoutes } from './methods.js';
export {
  consentPage,
  invalidLoginMessage,
  loginPage,
  logoutPage,
  notSignedInLogoutPage,
  signedOutPage,
} from './pages.js';
export { createPasswordChecker, hashPassword, type PasswordChecker, passwordHashOptions } from './passwords.js';
export { createProvider, oidcScopes, type ProviderOptions, tokenLifetimes } from './provider.js';
export { migrateIdp } from './schema.js';
export { loadCookieKeys, loadCsrfKey, loadSigningKeys, type SigningJwk } from './secrets.js';
export { createIdp, type Idp, type IdpOptions } from './server.js';
export { createUser, findUserById, findUserByUsername, type NewUser, type User } from './users.js';

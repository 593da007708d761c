import type { ClientOptions } from '@idem/client';
import type { Request, Response } from 'express';
import type { Csrf } from '../csrf.js';
import type { ApiRequest, ApiResult } from './api-client.js';
import type { ThirdPartyAppEvent } from './events.js';
import type { OidcClient } from './oidc-client.js';
import type { Refresher } from './refresh.js';
import type { Flash, SessionData, SessionStore, SessionTokens } from './sessions.js';

/**
 * What the app's routes share, built once by `createThirdPartyApp`: its settings, its stores and
 * clients, and the steps every route takes (the signed-in session, the API call, the form's session,
 * the page). One object, so a route module names what it uses and no more.
 */
export interface AppContext {
  /** The API through the gateway ({base_url}). */
  readonly baseUrl: string;
  /** The app's own public URL; the callback is `<appUrl>/callback`. */
  readonly appUrl: string;
  /** How "Create charge" waits between retries and draws its jitter (see `ThirdPartyAppOptions.retryTiming`). */
  readonly retryTiming: Pick<ClientOptions, 'sleep' | 'random'> | undefined;
  /** Where the provider's logout sends the browser back (registered as the client's post-logout URI). */
  readonly postLogoutRedirectUri: string;
  /** Items whose stock the home page shows. */
  readonly stockItems: readonly string[];
  /** The session cookie's name (see `cookieNames`). */
  readonly sessionCookie: string;
  readonly sessions: SessionStore;
  readonly csrf: Csrf;
  readonly oidc: OidcClient;
  readonly refresher: Refresher;
  /** The requests that sent a write to the API: a database failing after that cannot say the form did nothing. */
  readonly sentToApi: WeakSet<Request>;
  /**
   * The requests that ended a signed-in session ("Sign in" again): a database that fails after that
   * cannot say nothing was done.
   */
  readonly signedOutBy: WeakSet<Request>;
  /** Answers a page, with the headers every page carries. */
  send(res: Response, status: number, html: string): Response;
  setSession(res: Response, id: string): Response;
  clearSession(res: Response): Response;
  /** The signed-in session with fresh tokens, or undefined (signed out, or the grant is gone). */
  signedIn(req: Request): Promise<{ id: string; data: SessionData } | undefined>;
  /** A new access token for the session of `req`, whose token `refused` the API refused (see createThirdPartyApp). */
  refreshedToken(req: Request, refused: string | undefined): Promise<string | undefined>;
  /** Calls the API as the session of `req`, refreshing once after a 401 invalid_token (see createThirdPartyApp). */
  callApiAs(req: Request, token: string, request: ApiRequest): Promise<ApiResult>;
  /** Revokes the tokens of a session that ended; a failure is reported, never thrown. False when one failed. */
  revokeTokens(
    tokens: SessionTokens | undefined,
    during: Extract<ThirdPartyAppEvent, { type: 'revocation-failed' }>['during'],
  ): Promise<boolean>;
  /** The session a form was posted from, its CSRF token checked; `undefined` once the request is answered. */
  formSession(req: Request, res: Response): string | undefined;
  /** A form's handler, run with the signed-in session it was posted from (see createThirdPartyApp). */
  withSession(
    handler: (req: Request, res: Response, id: string, data: SessionData) => Promise<void>,
  ): (req: Request, res: Response) => Promise<void>;
  /** Post/redirect/get: the flash waits in its own slot, which the page it redirects to names. */
  showOnce(res: Response, id: string, flash: Flash): Promise<void>;
}

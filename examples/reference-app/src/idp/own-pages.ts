import type Provider from 'oidc-provider';
import type { KoaContextWithOIDC } from 'oidc-provider';
import type { Database } from '../db.js';
import { errorPage, pageHeaders } from '../html.js';
import { formPostPage, notSignedInLogoutPage, switchAccountPage } from './pages.js';
import { findUserById } from './users.js';

type ProviderMiddleware = Parameters<Provider['use']>[0];

const entities: Record<string, string> = { '&amp;': '&', '&lt;': '<', '&gt;': '>', '&quot;': '"', '&#39;': "'" };
const unescapeHtml = (value: string) =>
  value.replace(/&(?:amp|lt|gt|quot|#39);/g, (entity) => entities[entity] ?? entity);

/**
 * Reads back the form of oidc-provider's form_post page (`response_modes/form_post.js`): its action and
 * its hidden inputs, whose values it escapes with its `htmlSafe`. Undefined when the page is not that one.
 */
function readProviderFormPost(html: string): { action: string; fields: Array<[string, string]> } | undefined {
  const form = /<form method="post" action="([^"]*)">([\s\S]*?)<\/form>/.exec(html);
  if (!form) return undefined;
  const fields = [...(form[2] ?? '').matchAll(/<input type="hidden" name="([^"]*)" value="([^"]*)"\/>/g)].map(
    ([, name = '', value = '']) => [name, unescapeHtml(value)] as [string, string],
  );
  if (fields.length === 0) return undefined;
  return { action: unescapeHtml(form[1] ?? ''), fields };
}

/**
 * A page none of our hooks produced: HTML without our Content-Security-Policy. A redirect is no page
 * (Koa gives it a one-link HTML body that browsers do not show).
 */
function isProviderPage(ctx: KoaContextWithOIDC): boolean {
  if (ctx.status >= 300 && ctx.status < 400) return false;
  return (
    typeof ctx.body === 'string' && ctx.response.is('html') !== false && !ctx.response.get('Content-Security-Policy')
  );
}

async function nameOf(db: Database, accountId: unknown): Promise<string> {
  const user = typeof accountId === 'string' ? await findUserById(db, accountId) : undefined;
  return user?.name ?? 'another account';
}

/**
 * Puts our pages in the place of the ones oidc-provider builds itself, where no configuration hook
 * (`logoutSource`, `postLogoutSuccessSource`, `renderError`, `interactions.url`) reaches. Its own pages
 * run a script, can be framed and carry none of our headers. As a `provider.use` middleware it runs
 * after the provider has answered and rewrites:
 *
 * - the logout page of a visitor with no session (`end_session`), which submits the logout by script;
 * - the account switch (`resume`): someone signed in as alice logs in as bob (`prompt=login`, an
 *   `id_token_hint` for bob); the provider must end alice's session first and answers with a page that
 *   posts that logout by script, which comes back to the same `resume` once it is done;
 * - the `form_post` response mode (`authorization`, `resume`): the code or the error for a client that
 *   asked for it, posted to its redirect URI by script.
 *
 * Each becomes our page with a button instead of the script. Any other page of the provider's own, which
 * this configuration never produces, becomes an error page rather than reach a user as it is.
 *
 * @example
 * ```ts
 * provider.use(ownPages(db));
 * ```
 */
export function ownPages(db: Database): ProviderMiddleware {
  return async (koa, next) => {
    await next();
    // Set once the request reached one of the provider's routes; a request that did not has no page.
    const ctx = koa as KoaContextWithOIDC;
    if (!ctx.oidc || !isProviderPage(ctx)) return;
    // Whichever page takes its place below, it goes out with our headers.
    ctx.set(pageHeaders);
    const { route, session } = ctx.oidc;
    const secret = session?.state?.secret;

    if (route === 'end_session' && !session?.accountId && typeof secret === 'string') {
      ctx.body = notSignedInLogoutPage({
        action: ctx.oidc.urlFor('end_session_confirm'),
        xsrf: secret,
        clientName: ctx.oidc.client?.clientName,
      });
      return;
    }

    const interaction = ctx.oidc.entities.Interaction;
    const switching =
      route === 'resume' &&
      interaction !== undefined &&
      typeof secret === 'string' &&
      session?.accountId !== undefined &&
      session.state?.postLogoutRedirectUri === ctx.oidc.urlFor('resume', { uid: interaction.uid });
    if (switching) {
      const clientId = interaction.params.client_id;
      const client = typeof clientId === 'string' ? await ctx.oidc.provider.Client.find(clientId) : undefined;
      ctx.body = switchAccountPage({
        action: ctx.oidc.urlFor('end_session_confirm'),
        xsrf: secret,
        currentName: await nameOf(db, session.accountId),
        nextName: await nameOf(db, interaction.result?.login?.accountId),
        clientName: client?.clientName ?? (typeof clientId === 'string' ? clientId : 'the application'),
      });
      return;
    }

    const form = route === 'authorization' || route === 'resume' ? readProviderFormPost(ctx.body as string) : undefined;
    if (form) {
      ctx.body = formPostPage({
        ...form,
        clientName: ctx.oidc.client?.clientName ?? ctx.oidc.client?.clientId ?? 'the application',
      });
      return;
    }

    ctx.status = 500;
    ctx.body = errorPage('Something went wrong', 'Please start again from the application.');
  };
}

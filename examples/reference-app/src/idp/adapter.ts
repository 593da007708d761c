import { AsyncLocalStorage } from 'node:async_hooks';
import type { Adapter, AdapterPayload } from 'oidc-provider';
import Provider, { errors } from 'oidc-provider';
import type { Database } from '../db.js';
import { defaultRefreshTokenReuseSeconds, maxRefreshTokenReuseSeconds, refreshTokenReuse } from './reuse-interval.js';
import { sessionIdle, sessionLifetime } from './session-lifetime.js';
import { payloadAsRead, payloadAtRest, storedId } from './stored-id.js';

/**
 * An oidc-provider storage adapter on the shared database (PGlite or PostgreSQL): one row per stored
 * model instance in `idp_models`, keyed by model name and id, with the grant id, session uid and user
 * code pulled out into indexed columns for the lookups oidc-provider makes by them.
 *
 * `consume` is a compare-and-set (`where consumed_at is null`): oidc-provider checks `consumed` and then
 * calls `consume`, so two truly concurrent redemptions of one code (or one refresh token) would both pass
 * that check. Only one of them wins the update; the other is refused with `invalid_grant`, and, being a
 * replay, revokes the grant as oidc-provider does for one it notices (OAuth 2.1 §4.1.3, RFC 9700 §4.14).
 *
 * An Interaction's `destroy` is one too. oidc-provider resumes a finished sign-in by reading its
 * interaction, then destroying it, then issuing the code, so two concurrent resumes of one sign-in
 * would both issue one. The row is kept as a tombstone (`consumed_at`, until it expires): only the
 * resume that sets it goes on, the other gets `SessionNotFound`, a read no longer finds it, and a
 * login or consent posted meanwhile cannot save it back to life (its save is refused the same way).
 *
 * The save of an Interaction that finishes a consent is one as well, when made within
 * {@link finishConsentRead}: stored only while the interaction names the consent's grant it named when
 * the consent read it (none, or a grant deleted since) and holds the error it held then (a Cancel's),
 * or names the same grant as this save. Two POSTs of one consent form (a double click) each save a
 * grant of their own and finish the interaction; without it, the later finish overwrote the first's
 * result, and the first's grant was named by nothing (or the browser that followed the first answer
 * resumed with the second's grant).
 * The later one is refused with {@link ConsentedByAnother} instead; so is an Allow that read the
 * interaction before a Cancel was stored: the finish stored first wins.
 *
 * A rotated refresh token presented again within `refreshTokenReuseSeconds` (30 by default) of its
 * first use is answered once more instead of revoking the grant: the reuse interval, Auth0's name
 * (Okta's "grace period for token rotation"). The presented token is used up when the one it is rotated
 * to is stored, before the answer is sent; when the process dies then, or the answer is lost on the way
 * (a proxy timeout, a dropped connection), the client holds only the used token, and its retry is no
 * theft. Here `find` reads such a token as unused and the rotation takes it a second time (a
 * compare-and-set on `reused_at`), so oidc-provider rotates it again. The bounds, each of them needed:
 *
 * - once more only, within the interval counted from the first use (a third use, or a second one
 *   later, is a replay as before);
 * - only while the token it was rotated to is unused (Auth0's "only the previous token"): a token two
 *   rotations back is a replay even within the interval;
 * - one line of tokens lives on: the token the first use issued is superseded by the reuse, and
 *   presented later it is a replay that revokes the grant. Whoever holds it, a client whose answer came
 *   late after all or a thief who used the token first, gives the fork away at its next refresh.
 *
 * A rotation is one statement: the use of the presented token (first use or reuse) and the save of the
 * token it is rotated to commit together. oidc-provider calls `consume` and then `upsert`; `consume`
 * of a refresh token in a request only notes the token, and its `upsert` does both. A save that fails
 * (a dropped connection, a statement timeout) then leaves the presented token as it was, unused or with
 * its one reuse still ahead: the client's retry of that 500, which issued no token, is no replay, and
 * a token issued by a first use always exists before a reuse can supersede it. The save of an opaque
 * access token, which oidc-provider makes after the rotation (for a client that asked for no API),
 * fails the request after the rotation committed: the rotation is then undone in a second statement
 * before the error goes on (see `undoneOnFailure`), best effort.
 *
 * The price: a stolen refresh token used within the interval after its owner's refresh goes unnoticed
 * until the owner's next refresh (which then revokes the grant), and its access token stays good for
 * its 5 minutes. `refreshTokenReuseSeconds: 0` turns the interval off: every reuse revokes the grant.
 * The database's clock measures the interval, as it sets every expiry.
 *
 * A row is keyed by {@link storedId} of the model's id: a SHA-256 of it for every model whose id is a
 * value a client or browser presents (a refresh token, a code, the session cookie...), and its payload
 * keeps no copy of it (see `stored-id.ts`). Each call hashes the id it is given, so every lookup, every
 * compare-and-set and `rotated_from` work on the hashes alone; `find` puts the id back in the payload.
 *
 * PostgreSQL holds no NUL character in text or jsonb, and a client can put one in any parameter
 * (`state=%00`). A lookup by such an id finds nothing, as for any unknown id, and storing a model that
 * carries one is refused with `invalid_request`, which oidc-provider answers as a 400 in the route's
 * own format, instead of the database error a 500 would be.
 *
 * @example
 * ```ts
 * const provider = new Provider(issuer, { adapter: sqlAdapterFactory(db), ... });
 * ```
 */
export function sqlAdapterFactory(db: Database, options: SqlAdapterOptions = {}): (model: string) => Adapter {
  // Bounded above too (see `reuse-interval.ts`).
  const reuseSeconds = refreshTokenReuse(options.refreshTokenReuseSeconds);
  const lifetimeSeconds = sessionLifetime(options.sessionLifetimeSeconds);
  const idleSeconds = sessionIdle(options.sessionIdleSeconds, lifetimeSeconds);
  return (model) =>
    createSqlAdapter(db, model, model === 'RefreshToken' ? reuseSeconds : 0, lifetimeSeconds, idleSeconds);
}

/** What {@link sqlAdapterFactory} takes besides the database. */
export interface SqlAdapterOptions {
  /**
   * Seconds after its first use during which a rotated refresh token is answered once more instead of
   * revoking the grant (see {@link sqlAdapterFactory}); 30 by default, 0 turns the interval off.
   */
  refreshTokenReuseSeconds?: number | undefined;
  /**
   * How long a sign-in session lives after the password (`session-lifetime.ts`), in seconds: a
   * Session whose `loginTs` is older is not read. 12 hours by default.
   */
  sessionLifetimeSeconds?: number | undefined;
  /**
   * How long a sign-in session lives without a visit (`session-lifetime.ts`), in seconds: a Session
   * whose row expires later than that from now was not saved under this limit, and is not read. 30
   * minutes by default, at most `sessionLifetimeSeconds`.
   */
  sessionIdleSeconds?: number | undefined;
}

export { defaultRefreshTokenReuseSeconds, maxRefreshTokenReuseSeconds };

/**
 * A consent's finish was not stored: another POST of the same form finished the interaction, naming
 * its own grant or cancelling it, after this one read it. The interaction is there, finished so.
 */
export class ConsentedByAnother extends errors.SessionNotFound {}

/**
 * The interaction's result as the POST finishing it now read it (see below): the grant its consent
 * named, and its error (a Cancel stored: `access_denied`).
 */
const consentRead = new AsyncLocalStorage<{ grantId: string | undefined; error: string | undefined }>();

/**
 * Runs `finish` (a consent's or a Cancel's `provider.interactionFinished`) so that the
 * Interaction's save in it is stored only while the interaction's result is as this POST read it,
 * `read` (`details.result`): its consent names the same grant (or none), and it holds the same error
 * (or none), so a Cancel stored since is not overwritten, nor an Allow. Or while it names the grant the
 * save names. Otherwise it throws {@link ConsentedByAnother}. The condition is checked in the save's own
 * statement, so of two concurrent finishes exactly one is stored.
 *
 * @example
 * ```ts
 * await finishConsentRead(details.result, () =>
 *   provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true }),
 * );
 * ```
 */
export function finishConsentRead<Result>(read: unknown, finish: () => Promise<Result>): Promise<Result> {
  const result = read as { consent?: { grantId?: unknown }; error?: unknown } | undefined;
  const error = typeof result?.error === 'string' ? result.error : undefined;
  return consentRead.run({ grantId: consentGrantId(result?.consent?.grantId), error }, finish);
}

/** A consent result's grant id as stored (`result.consent.grantId`): a non-empty string, or none. */
function consentGrantId(value: unknown): string | undefined {
  return typeof value === 'string' && value !== '' ? value : undefined;
}

/**
 * The refresh token each request (oidc-provider's request context) is rotating, by its row's key: noted
 * by `consume`, used by the `upsert` of the token it is rotated to, which does both in one statement.
 */
const rotating = new WeakMap<object, string>();

/**
 * The rotation each request made, for as long as the request may still fail: `used`, the presented
 * token's key; `issued`, the key of the one it was rotated to; `reuse`, whether that was the presented
 * token's one reuse.
 */
const rotated = new WeakMap<object, { used: string; issued: string; reuse: boolean }>();

/**
 * The models issued under a grant, which go with it (oidc-provider's memory adapter keeps the same
 * list). An Interaction names a grant too, the one a sign-in in progress will add to, but is no token:
 * an account switch revokes the first user's grants while its own interaction is still to be resumed.
 */
const issuedUnderGrant = [
  'AccessToken',
  'AuthorizationCode',
  'RefreshToken',
  'DeviceCode',
  'BackchannelAuthenticationRequest',
  'PreAuthorizedCode',
];

interface PayloadRow {
  payload: AdapterPayload;
}

/**
 * `reuseSeconds` is the refresh token reuse interval (0 for every other model). The SQL below names the
 * row read or consumed `m`; `$3` is the interval where it is read, `$9` where a rotation takes it.
 */
function createSqlAdapter(
  db: Database,
  model: string,
  reuseSeconds: number,
  sessionLifetimeSeconds: number,
  sessionIdleSeconds: number,
): Adapter {
  // A consumed Interaction is a tombstone (see above): never read, never saved back. A consumed
  // token is still read, with its `consumed` flag, which is how oidc-provider notices a code or
  // refresh token used twice.
  const tombstoned = model === 'Interaction';
  // A sign-in session past its lifetime from the sign-in (`session-lifetime.ts`) is not read, whatever
  // its row's expiry: one an earlier version extended on each visit would otherwise sign in once more.
  // `loginTs` is the provider's clock, the expiry the database's; seconds apart, against 12 hours.
  // `sessionLifetimeSeconds` is a whole number, checked by `sessionLifetime`: written in as it is.
  // Nor one idle too long. Each visit saves a session for the idle limit at most (`sessionTtl`), so a
  // row that expires later than that from now was saved otherwise. The released version before the
  // limits saved every visit for 14 days (oidc-provider's default), so its row was last visited 14
  // days before it expires: read while that is within the idle limit, as a session in use through
  // the upgrade is. Any other (a limit since lowered) is read as idle too long: the password once
  // more, at worst, where reading it could sign in a session idle for hours.
  const signInAged =
    model === 'Session'
      ? `and (m.payload ->> 'loginTs' is null or (m.payload ->> 'loginTs')::numeric > extract(epoch from now()) - ${sessionLifetimeSeconds})
         and (m.expires_at <= now() + make_interval(secs => ${sessionIdleSeconds})
              or m.expires_at - interval '14 days' > now() - make_interval(secs => ${sessionIdleSeconds}))`
      : '';
  const live = `${tombstoned ? 'and consumed_at is null' : ''} ${signInAged}`;
  const reusable = reuseSeconds > 0;
  // Used within the interval (in seconds, the parameter named) and not reused yet: the first half of
  // the one reuse a rotation may take.
  const usedWithin = (seconds: string) =>
    `m.consumed_at > now() - make_interval(secs => ${seconds}) and m.reused_at is null`;
  // The second half: the token it was rotated to unused. The same condition in both, so a token read
  // as unused is taken, unless a concurrent request took its one reuse first, or used that successor
  // (either is then a replay): `rotateOnReuse` reads the successor locked, not as `find` does.
  const withinReuse = `${usedWithin('$3')}
    and not exists (select 1 from idp_models successor
      where successor.model = m.model and successor.grant_id = m.grant_id and successor.rotated_from = m.id
        and successor.consumed_at is not null)`;
  // A token issued by the first use of one reused since: a replay from now on. The reuse marks it so
  // (see `rotateOnReuse`); this reads it so too for a row stored by an earlier version of this adapter,
  // which saved that token apart from the first use, so a reuse could come before it was there.
  const superseded = `exists (select 1 from idp_models predecessor
    where predecessor.model = m.model and predecessor.id = m.rotated_from and predecessor.reused_at is not null)`;
  const payloadAsStored = reusable
    ? `case
         when ${superseded} then jsonb_set(m.payload, '{consumed}', to_jsonb(extract(epoch from now())::bigint))
         when ${withinReuse} then m.payload - 'consumed'
         else m.payload
       end`
    : 'm.payload';
  // The row's key for id `id` (see `stored-id.ts`): every statement below is given keys, never ids.
  const key = (id: string) => storedId(model, id);
  const findOne = async (column: 'id' | 'uid' | 'user_code', value: string) => {
    if (holdsNul(value)) return undefined;
    const found = column === 'id' ? key(value) : value;
    const { rows } = await db.query<PayloadRow>(
      `select ${payloadAsStored} as payload from idp_models m
       where m.model = $1 and m.${column} = $2 and (m.expires_at is null or m.expires_at > now()) ${live}
       limit 1`,
      reusable ? [model, found, reuseSeconds] : [model, found],
    );
    const payload = rows[0]?.payload;
    // Found by its id, the model gets it back; found by a uid or user code, there is none to give.
    return payload && column === 'id' ? payloadAsRead(model, value, payload) : payload;
  };

  // What `upsert` stores, `$1` to `$7`, and the row's expiry computed from `$7` by the database's clock,
  // so a skewed app clock cannot stretch a stored token.
  const rowParams = (id: string, payload: AdapterPayload, expiresIn: number | undefined) => [
    model,
    key(id),
    JSON.stringify(payloadAtRest(model, id, payload)),
    payload.grantId ?? null,
    payload.uid ?? null,
    payload.userCode ?? null,
    typeof expiresIn === 'number' ? Math.ceil(expiresIn) : null,
  ];
  const expiresAt = 'case when $7::int is null then null else now() + make_interval(secs => $7::int) end';

  // The first use of refresh token `$8` (its key, as every `used` here), and the save of the token it
  // is rotated to, which records it (`rotated_from`: the reuse interval reads that link), in one
  // statement: false when it was used.
  const rotateOnFirstUse = async (used: string, id: string, payload: AdapterPayload, expiresIn?: number) => {
    const { rows } = await db.query(
      `with used as (
         update idp_models m
         set consumed_at = now(), payload = jsonb_set(m.payload, '{consumed}', to_jsonb($9::bigint))
         where m.model = $1 and m.id = $8 and m.consumed_at is null
         returning m.id
       )
       insert into idp_models (model, id, payload, grant_id, uid, user_code, expires_at, rotated_from)
       select $1, $2, $3, $4, $5, $6, ${expiresAt}, used.id from used
       returning id`,
      [...rowParams(id, payload, expiresIn), used, Math.floor(Date.now() / 1000)],
    );
    return rows.length > 0;
  };

  // The one reuse of refresh token `$8`, used within the interval (see above), for the request that read
  // it as unused: taken (`reused_at`), the token its first use issued superseded (as consumed at the
  // beginning of time, past any interval), and the token it is rotated to saved, in one statement: false
  // when there is no reuse to take. The saved token is the newest of the line: no link to the used one,
  // which a later reuse's supersession would follow.
  //
  // The successor is read locked (`for update`), not in the statement's snapshot: a refresh with it
  // that commits while this statement runs (its holder's next refresh) must be seen, or both are
  // answered and two lines of tokens live on, neither ever read as a replay. Locked first, it is the
  // latest version (a rotation in progress is waited for), and a rotation that comes after waits for
  // this one and finds the successor superseded: a replay that revokes the grant.
  const rotateOnReuse = async (used: string, id: string, payload: AdapterPayload, expiresIn?: number) => {
    const { rows } = await db.query(
      `with successor as (
         select next.consumed_at from idp_models next
           join idp_models used on used.model = $1 and used.id = $8
         where next.model = $1 and next.grant_id = used.grant_id and next.rotated_from = used.id
         for update of next
       ), taken as (
         update idp_models m set reused_at = now()
         where m.model = $1 and m.id = $8 and ${usedWithin('$9')}
           and not exists (select 1 from successor where successor.consumed_at is not null)
         returning m.id, m.grant_id
       ), superseded as (
         update idp_models earlier
         set consumed_at = '-infinity',
             payload = jsonb_set(earlier.payload, '{consumed}', to_jsonb(extract(epoch from now())::bigint))
         from taken
         where earlier.model = $1 and earlier.grant_id = taken.grant_id and earlier.rotated_from = taken.id
       )
       insert into idp_models (model, id, payload, grant_id, uid, user_code, expires_at)
       select $1, $2, $3, $4, $5, $6, ${expiresAt} from taken
       returning id`,
      [...rowParams(id, payload, expiresIn), used, reuseSeconds],
    );
    return rows.length > 0;
  };

  // Lost the compare-and-set: another request used the row keyed `stored` after both read it unused
  // (and, for a refresh token, its one reuse was gone or taken too). That is a replay (a code redeemed
  // twice, a rotated refresh token reused), which oidc-provider answers by revoking the grant only
  // when it reads `consumed` itself; here it never does, so the revocation is done here. The Grant row
  // goes too: a winner may save tokens after this delete (a code's), and without their grant they are
  // refused at first use.
  const refuseReplay = async (stored: string): Promise<never> => {
    await db.query(
      `with replayed as (select grant_id from idp_models where model = $1 and id = $2 and grant_id is not null)
       delete from idp_models
       where (grant_id = (select grant_id from replayed) and model = any($3::text[]))
          or (model = 'Grant' and id = (select grant_id from replayed))`,
      [model, stored, issuedUnderGrant],
    );
    throw new errors.InvalidGrant(`${model} already consumed`);
  };

  return {
    async upsert(id, payload, expiresIn) {
      if (holdsNul(id) || holdsNul(payload)) {
        throw new errors.InvalidRequest('a parameter holds a NUL character');
      }
      // The token a rotation issues: saved with the use of the one it replaces (see above).
      const ctx = model === 'RefreshToken' ? Provider.ctx : undefined;
      const used = ctx ? rotating.get(ctx) : undefined;
      if (ctx && used !== undefined) {
        rotating.delete(ctx);
        const issued = key(id);
        if (await rotateOnFirstUse(used, id, payload, expiresIn)) {
          rotated.set(ctx, { used, issued, reuse: false });
          return;
        }
        if (reusable && (await rotateOnReuse(used, id, payload, expiresIn))) {
          rotated.set(ctx, { used, issued, reuse: true });
          return;
        }
        // Used when the first use was tried, and unused again when the reuse was: another request's
        // rotation of it, undone since (its access token failed to save, see `undoneOnFailure`). The
        // first use is then this request's, not a replay: taken for one, the grant was revoked.
        if (await rotateOnFirstUse(used, id, payload, expiresIn)) {
          rotated.set(ctx, { used, issued, reuse: false });
          return;
        }
        await refuseReplay(used);
      }
      // A consent's finish (see `finishConsentRead`): `$8`, the grant the consent named when it was
      // read; `$9`, the one this save names; `$10`, the error the result held when it was read.
      const read = tombstoned ? consentRead.getStore() : undefined;
      const stored = "idp_models.payload #>> '{result,consent,grantId}'";
      const storedError = "idp_models.payload #>> '{result,error}'";
      const save = db.query(
        `insert into idp_models (model, id, payload, grant_id, uid, user_code, expires_at)
         values ($1, $2, $3, $4, $5, $6, ${expiresAt})
         on conflict (model, id) do update set
           payload = excluded.payload, grant_id = excluded.grant_id, uid = excluded.uid,
           user_code = excluded.user_code, expires_at = excluded.expires_at
         ${tombstoned ? 'where idp_models.consumed_at is null' : ''}
         ${read ? `and ((${stored} is not distinct from $8::text and ${storedError} is not distinct from $10::text) or ${stored} = $9::text)` : ''}
         returning id`,
        read
          ? [
              ...rowParams(id, payload, expiresIn),
              read.grantId ?? null,
              consentGrantOf(payload) ?? null,
              read.error ?? null,
            ]
          : rowParams(id, payload, expiresIn),
      );
      const { rows } = model === 'AccessToken' ? await undoneOnFailure(db, save) : await save;
      if (rows.length > 0) return;
      // Refused: the interaction was resumed (a tombstone), or another consent finished it since.
      const finished =
        read &&
        (await db.query('select 1 from idp_models where model = $1 and id = $2 and consumed_at is null', [
          model,
          key(id),
        ]));
      if (finished && finished.rows.length > 0) {
        throw new ConsentedByAnother('interaction finished by another consent');
      }
      throw new errors.SessionNotFound('interaction already resumed');
    },
    async find(id) {
      if (model !== 'ReplayDetection' || holdsNul(id)) return findOne('id', id);
      // oidc-provider's replay check (a DPoP proof's or a client assertion's jti) finds, then saves:
      // two copies of one proof sent at once would both find nothing and both pass. Here the find
      // claims the id first (an insert, or the take-over of an expired row), so only one of them
      // finds nothing; the save that follows sets the row's payload and expiry. The claim's own
      // expiry only bounds a row whose save never came (a crash between the two).
      const { rows } = await db.query(
        `insert into idp_models (model, id, payload, expires_at) values ($1, $2, '{}', now() + interval '1 hour')
         on conflict (model, id) do update set payload = excluded.payload, expires_at = excluded.expires_at
           where idp_models.expires_at is not null and idp_models.expires_at <= now()
         returning id`,
        [model, id],
      );
      // Not claimed: the id is held, by a saved proof or one being checked (whose payload is `{}`).
      return rows.length > 0 ? undefined : findOne('id', id);
    },
    findByUid(uid) {
      return findOne('uid', uid);
    },
    findByUserCode(userCode) {
      return findOne('user_code', userCode);
    },
    async consume(id) {
      // A refresh token is consumed by a rotation (the only place oidc-provider consumes one), in the
      // statement that saves the token it is rotated to: noted here, used by that `upsert`.
      const ctx = model === 'RefreshToken' ? Provider.ctx : undefined;
      if (ctx) {
        rotating.set(ctx, key(id));
        return;
      }
      const consumed = Math.floor(Date.now() / 1000);
      const { rows } = await db.query(
        `update idp_models
         set consumed_at = now(), payload = jsonb_set(payload, '{consumed}', to_jsonb($3::bigint))
         where model = $1 and id = $2 and consumed_at is null
         returning id`,
        [model, key(id), consumed],
      );
      if (rows.length === 0) await refuseReplay(key(id));
    },
    async destroy(id) {
      if (!tombstoned) {
        await db.query('delete from idp_models where model = $1 and id = $2', [model, key(id)]);
        return;
      }
      const { rows } = await db.query(
        `update idp_models set consumed_at = now()
         where model = $1 and id = $2 and consumed_at is null
         returning id`,
        [model, key(id)],
      );
      if (rows.length === 0) throw new errors.SessionNotFound('interaction already resumed');
    },
    async revokeByGrantId(grantId) {
      // Every token issued under the grant goes, codes, access and refresh tokens alike, whichever
      // model's adapter is asked: oidc-provider skips refresh tokens when the client at hand may not use
      // them, and a logout revokes every grant of the session with the one client that asked for it.
      await db.query('delete from idp_models where grant_id = $1 and model = any($2::text[])', [
        grantId,
        issuedUnderGrant,
      ]);
    },
  };
}

/**
 * The save of the opaque access token a refresh issues (oidc-provider stores it after the refresh token
 * it rotated to, when the client asked for no API): when it fails, the client gets a 500 and no token,
 * yet the rotation has committed, and its retry would spend the presented token's one reuse (two such
 * failures in a row and the next retry revoked the grant). The rotation is undone before the error goes
 * on, so a failed token request spends nothing, as when the rotation's own save fails. Best effort: a
 * database that failed the save may fail this statement too, and the retry is then a reuse as before.
 */
async function undoneOnFailure<Result>(db: Database, save: Promise<Result>): Promise<Result> {
  try {
    return await save;
  } catch (error) {
    const ctx = Provider.ctx;
    const rotation = ctx ? rotated.get(ctx) : undefined;
    if (ctx && rotation) {
      rotated.delete(ctx);
      await undoRotation(db, rotation).catch(() => undefined);
    }
    throw error;
  }
}

/**
 * Takes a rotation back: the token it issued, which no client was given, is deleted, and the presented
 * token is as it was before. For a first use, unused again; for a reuse, its one reuse ahead again and
 * the token its first use issued no longer superseded. Only while the issued token is unused: a reuse
 * that superseded it meanwhile (a concurrent presentation of the same token) stands, and so does what
 * it took.
 */
async function undoRotation(db: Database, rotation: { used: string; issued: string; reuse: boolean }) {
  if (!rotation.reuse) {
    await db.query(
      `with issued as (
         delete from idp_models
         where model = 'RefreshToken' and id = $2 and rotated_from = $1 and consumed_at is null
         returning rotated_from
       )
       update idp_models m set consumed_at = null, payload = m.payload - 'consumed'
       from issued where m.model = 'RefreshToken' and m.id = issued.rotated_from and m.reused_at is null`,
      [rotation.used, rotation.issued],
    );
    return;
  }
  await db.query(
    `with issued as (
       delete from idp_models where model = 'RefreshToken' and id = $2 and consumed_at is null
       returning id
     ), untaken as (
       update idp_models m set reused_at = null
       from issued where m.model = 'RefreshToken' and m.id = $1 and m.reused_at is not null
       returning m.id
     )
     update idp_models earlier set consumed_at = null, payload = earlier.payload - 'consumed'
     from untaken
     where earlier.model = 'RefreshToken' and earlier.rotated_from = untaken.id and earlier.consumed_at = '-infinity'`,
    [rotation.used, rotation.issued],
  );
}

/** The grant an Interaction's payload names as its consent's result, if any. */
function consentGrantOf(payload: AdapterPayload): string | undefined {
  const result = payload.result as { consent?: { grantId?: unknown } } | undefined;
  return consentGrantId(result?.consent?.grantId);
}

/** True when `value`, or any string in it however deep, holds U+0000, which PostgreSQL cannot store. */
function holdsNul(value: unknown): boolean {
  if (typeof value === 'string') return value.includes('\u0000');
  if (Array.isArray(value)) return value.some(holdsNul);
  if (typeof value === 'object' && value !== null) {
    for (const [key, item] of Object.entries(value)) if (holdsNul(key) || holdsNul(item)) return true;
  }
  return false;
}

/**
 * Deletes expired rows, `batchSize` (default 1,000) per statement, and returns how many. oidc-provider
 * never asks for this; call it from a timer or a maintenance job. Batches, read through the
 * `idp_models_expires_at` index: one statement deleting a day of expired sessions and tokens would
 * hold all their row locks (and write all their WAL) at once, and without the index every pass read
 * the whole table, live sessions included.
 *
 * @example
 * ```ts
 * const removed = await purgeExpiredModels(db);
 * ```
 */
export async function purgeExpiredModels(db: Database, batchSize = 1_000): Promise<number> {
  if (!Number.isSafeInteger(batchSize) || batchSize < 1)
    throw new TypeError(`batchSize must be a positive safe integer (at most ${Number.MAX_SAFE_INTEGER})`);
  let removed = 0;
  for (;;) {
    const { rowCount } = await db.query(
      `delete from idp_models where (model, id) in (
         select model, id from idp_models where expires_at <= now() order by expires_at limit $1)`,
      [batchSize],
    );
    removed += rowCount;
    if (rowCount < batchSize) return removed;
  }
}

import { generateKeyPairSync, randomBytes, randomUUID } from 'node:crypto';
import { pathToFileURL } from 'node:url';
import { generateSecret } from '@idem/webhooks';
import type { Database } from './db.js';
import { openDatabaseFromEnv } from './open-from-env.js';

/**
 * One step of a rotation of the secrets the reference app keeps in its database. Each takes effect
 * at the next start of every process (they read the secrets once, at start-up); run the steps in this
 * order, each after every process has restarted on the one before (docs/operations.md, "Rotating
 * secrets and keys"):
 *
 * - `signing-stage`: a fresh RS256 key is appended to the provider's keys. It is published in the
 *   JWKS and signs nothing yet, so every verifier can fetch it before a token names it.
 * - `signing-promote`: the newest key moves to the front and signs; the old one stays published, so
 *   tokens it signed keep verifying.
 * - `signing-retire`: only the signing key is kept. Wait until the old key's last token has expired
 *   (access and ID tokens live 5 minutes) and verifiers' caches have turned over.
 * - `cookie-add`: a fresh cookie key goes in front and signs; the old ones still verify, and a
 *   cookie read with one is signed again with the new key on its way out.
 * - `cookie-retire`: only the newest cookie key is kept. A sign-in session that never came back
 *   meanwhile must sign in again at the provider (the app's own session is not affected).
 * - `csrf`: a fresh key for the forms of the provider (login, consent) and of the third-party app,
 *   which share it. A form open at that moment is refused once (403, nothing done); sent again from
 *   a fresh page, it works.
 * - `app-client-secret`: a fresh client secret for the third-party app (`photo-app`). The provider
 *   holds one secret per client, and the app reads it at start-up, as the provider does: both must
 *   restart together (one process here). Refresh tokens belong to the client, not to its secret:
 *   they keep working with the new one.
 * - `webhook`: a fresh Standard Webhooks secret. The API's sender and the receiver are one process
 *   and read it together, and events waiting in the outbox are signed when sent: nothing to stage.
 */
export type RotationStep =
  | 'signing-stage'
  | 'signing-promote'
  | 'signing-retire'
  | 'cookie-add'
  | 'cookie-retire'
  | 'csrf'
  | 'app-client-secret'
  | 'webhook';

export const rotationSteps: readonly RotationStep[] = [
  'signing-stage',
  'signing-promote',
  'signing-retire',
  'cookie-add',
  'cookie-retire',
  'csrf',
  'app-client-secret',
  'webhook',
];

function freshSigningKey() {
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  return { ...privateKey.export({ format: 'jwk' }), kid: randomUUID(), alg: 'RS256', use: 'sig' };
}

// Each step is one UPDATE of a row a start created, so two operators (or a retry) never lose a key
// another one added in between, as a read-modify-write would.
const statements: Record<RotationStep, { sql: string; param?: () => string }> = {
  'signing-stage': {
    sql: "update idp_secrets set value = value || jsonb_build_array($1::jsonb) where name = 'signing-keys' returning value",
    param: () => JSON.stringify(freshSigningKey()),
  },
  'signing-promote': {
    sql: "update idp_secrets set value = jsonb_build_array(value -> -1) || (value - -1) where name = 'signing-keys' and jsonb_array_length(value) > 1 returning value",
  },
  'signing-retire': {
    sql: "update idp_secrets set value = jsonb_build_array(value -> 0) where name = 'signing-keys' returning value",
  },
  'cookie-add': {
    sql: "update idp_secrets set value = jsonb_build_array($1::text) || value where name = 'cookie-keys' returning value",
    param: () => randomBytes(32).toString('base64url'),
  },
  'cookie-retire': {
    sql: "update idp_secrets set value = jsonb_build_array(value -> 0) where name = 'cookie-keys' returning value",
  },
  csrf: {
    sql: "update idp_secrets set value = to_jsonb($1::text) where name = 'csrf-key' returning value",
    param: () => randomBytes(32).toString('base64url'),
  },
  'app-client-secret': {
    sql: "update idp_models set payload = jsonb_set(payload, '{client_secret}', to_jsonb($1::text)) where model = 'Client' and id = 'photo-app' returning payload as value",
    param: () => randomBytes(32).toString('base64url'),
  },
  webhook: {
    sql: "update api_webhook_secrets set secret = $1 where name = 'payments' returning secret as value",
    param: () => (generateSecret('v1') as { secret: string }).secret,
  },
};

/**
 * Takes one rotation step in the database (see {@link RotationStep}). Throws when the secret does not
 * exist yet (the app has never started on this database) or, for `signing-promote`, when no key is
 * staged.
 *
 * @example
 * ```ts
 * await rotateSecret(db, 'signing-stage');
 * // restart every process, wait a few minutes, then:
 * await rotateSecret(db, 'signing-promote');
 * ```
 */
export async function rotateSecret(db: Database, step: RotationStep): Promise<void> {
  const statement = statements[step];
  if (!statement) throw new TypeError(`unknown rotation step ${String(step)}; one of ${rotationSteps.join(', ')}`);
  const notStarted = 'the secret does not exist yet: start the app once on this database first';
  const { rows } = await db.query(statement.sql, statement.param ? [statement.param()] : []).catch((error: unknown) => {
    // 42P01: the table itself is missing, on a database the app never started on.
    if ((error as { code?: unknown }).code === '42P01') throw new Error(notStarted, { cause: error });
    throw error;
  });
  if (rows.length === 0) {
    throw new Error(step === 'signing-promote' ? 'no signing key is staged: run signing-stage first' : notStarted);
  }
}

// `npm run rotate -- <step>`: one step on the database `npm start` uses (DATABASE_URL, or PGlite in
// DATA_DIR or the default folder).
async function rotateFromCommandLine(step: string | undefined): Promise<void> {
  if (!rotationSteps.includes(step as RotationStep)) {
    console.error(`usage: npm run rotate -- <step>, one of ${rotationSteps.join(', ')}`);
    process.exitCode = 2;
    return;
  }
  const db = await openDatabaseFromEnv(process.env);
  try {
    await rotateSecret(db, step as RotationStep);
  } finally {
    await db.close();
  }
  console.log(`${step}: done. It takes effect when each process of the app restarts.`);
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  rotateFromCommandLine(process.argv[2]).catch((error: unknown) => {
    console.error(error instanceof Error ? error.message : error);
    process.exitCode = 1;
  });
}

// Audit (branch audit-secrets): what the sender's refusals of a bad message carry. docs/webhooks.md:
// errors carry "header names, never secrets, signatures or payloads"; security.md: "Nothing secret
// reaches a message, an event or a log".

import { PGlite } from '@electric-sql/pglite';
import { reachableText } from '@idem/testkit';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOutbox, createSender, generateSecret, type Queryable } from '../src/index.js';

const thrown = async (run: () => unknown): Promise<unknown> => {
  try {
    await run();
  } catch (error) {
    return error;
  }
  throw new Error('did not throw');
};

const { secret } = generateSecret('v1') as { secret: string };
const PARTNER_TOKEN = 'partner-token-PLANTED-9f8e7d6c';

// Was a defect: a header value fetch would refuse (a control character, as in a token read from a file
// with a stray byte) is refused with a TypeError whose message names the header only, but whose `cause`
// is undici's TypeError 'Headers.append: "Bearer <the whole value>" is an invalid header value.': the
// partner's credential, printed by util.inspect (an uncaught error, console.error) and by pino's err
// serializer. Expected: no cause, or one naming the header without its value (deliverable.ts,
// assertSendableHeaders; also reached by outbox.add()).
describe('a header value the sender refuses', () => {
  it('createSender({ headers }) refuses it without carrying the value', async () => {
    const error = await thrown(() =>
      createSender({ secret, headers: { authorization: `Bearer ${PARTNER_TOKEN}\u0000` } }),
    );
    expect(error).toBeInstanceOf(TypeError);
    expect(reachableText(error).join('\n')).not.toContain(PARTNER_TOKEN);
  });

  it('send() refuses a message header without carrying the value', async () => {
    const sender = createSender({ secret, fetch: async () => new Response(null, { status: 204 }) });
    const error = await thrown(() =>
      sender.send({
        url: 'https://hooks.example/in',
        id: 'evt_1',
        body: '{}',
        headers: { authorization: `Bearer ${PARTNER_TOKEN}\n` + 'x' },
      }),
    );
    expect(error).toBeInstanceOf(TypeError);
    expect(reachableText(error).join('\n')).not.toContain(PARTNER_TOKEN);
  });
});

// Was a defect: a URL that does not parse (a port out of range, a password with a raw '/') is refused
// with 'url must be an absolute http: or https: URL', but its `cause` is the URL parser's TypeError,
// whose `input` is the whole URL: the endpoint's credentials (userinfo, a ?token= query). Expected: no
// cause carrying the input (deliverable.ts, assertDeliverable; also reached by outbox.add()).
it('send() refuses an unparsable URL without carrying its credentials', async () => {
  const sender = createSender({ secret, fetch: async () => new Response(null, { status: 204 }) });
  const error = await thrown(() =>
    sender.send({ url: `https://hooks:${PARTNER_TOKEN}@hooks.example:99999/in`, id: 'evt_1', body: '{}' }),
  );
  expect(error).toBeInstanceOf(TypeError);
  expect(reachableText(error).join('\n')).not.toContain(PARTNER_TOKEN);
});

// PGlite puts a failed statement's bound values on its errors (`params`): for the outbox, the
// event's body and headers, or what a partner answered. The outbox trims the errors it passes on.
describe('outbox errors on PGlite (an outbox table never migrated)', () => {
  const CARD = '4111111111111111';
  const db = new PGlite();
  const outbox = createOutbox({ table: 'outbox_never_migrated' });
  // PGlite's start (its WASM compiled) waited out the first test's 20 s once on a loaded box: it is
  // waited for here, with time of its own.
  beforeAll(() => db.waitReady, 120_000);
  afterAll(() => db.close());

  it('PGlite itself does attach the values (the control)', async () => {
    const error = await thrown(() => db.query('SELECT $1::text FROM outbox_never_migrated', [CARD]));
    expect(reachableText(error).join('\n')).toContain(CARD);
  });

  it("add() rejects without the event's body", async () => {
    const body = `{"card":"${CARD}"}`;
    const error = await thrown(() =>
      outbox.add(db as unknown as Queryable, { url: 'https://partner.example/hooks', body }),
    );
    expect(String(error)).toContain('outbox_never_migrated');
    expect(reachableText(error).join('\n')).not.toContain(CARD);
  });

  it("the relay's onError gets the failure without the statement's values", async () => {
    let reported: (error: unknown) => void = () => {};
    const failed = new Promise<unknown>((resolve) => {
      reported = resolve;
    });
    const relay = outbox.relay({
      db: db as unknown as Queryable,
      sender: createSender({ secret }),
      onError: (error) => reported(error),
    });
    relay.start();
    const error = await failed;
    await relay.stop();
    expect(String(error)).toContain('outbox_never_migrated');
    expect(error).not.toHaveProperty('params');
  });
});

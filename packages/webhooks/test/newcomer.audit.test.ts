// Newcomer audit of @idem/webhooks, found by following docs/webhooks.md from the packed package.
// docs/webhooks.md ("A message no attempt could send"): send() "never throws for a failed delivery";
// a message no attempt could send "is a bug in the caller, and `send()` rejects with a `TypeError`
// before any request goes out", as bad options do everywhere (DESIGN: misuse throws a TypeError).
// outbox.add() takes an object body ("An object body is sent as its JSON") and refuses a missing one
// with a TypeError. send() checks the URL, id, headers and content type (assertDeliverable), but not
// the body: toBodyBytes() runs inside the first attempt and throws the RECEIVER's error,
// WebhookError `raw_body_required` (status 500, retryable: true), whose message tells the caller to
// "mount the webhook route before" express.json(). A sender given the same object it gives add(),
// or no body at all (plain JavaScript), is sent looking for a body parser it does not have.
import { createSender } from '@idem/webhooks';
import { describe, expect, it } from 'vitest';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';

describe('createSender().send() with a body no attempt could send', () => {
  for (const [what, body] of [
    ['an object, as outbox.add() takes', { type: 'order.paid', order: 'ord_7' }],
    ['no body', undefined],
  ] as const) {
    // Was a defect: send() rejects with WebhookError raw_body_required ("mount the webhook route before express.json()"), not a TypeError.
    it(`refuses ${what} with a TypeError before any request`, async () => {
      let requests = 0;
      const sender = createSender({
        secret: SECRET,
        fetch: async () => {
          requests++;
          return new Response(null, { status: 200 });
        },
      });
      const sent = sender.send({ url: 'https://partner.example/webhooks', id: 'evt_1', body: body as never });
      await expect(sent).rejects.toBeInstanceOf(TypeError);
      expect(requests).toBe(0);
    });
  }
});

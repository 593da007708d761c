import { memoryStore } from '@idem/core';
import { Webhook } from 'standardwebhooks';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { createReceiver, createVerifier, sign, type Tolerance } from '../src/index.js';

// The published v1 vector: its signature is over timestamp 1614265330.
const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const ID = 'msg_p5jXN8AQM9LWM0D4loKWxJek';
const TS = 1614265330;
const BODY = '{"test": 2432232314}';
const headers = sign({ secret: SECRET, id: ID, body: BODY, timestamp: TS });

afterEach(() => {
  vi.useRealTimers();
});

describe('timestamp tolerance at its edges', () => {
  // The header holds whole seconds: a delivery stamped TS was signed somewhere in [TS, TS + 1). Received
  // at TS + 300.5 s it may be only 299.6 s old, inside a 5-minute window; every Standard Webhooks
  // library compares whole seconds and takes it until TS + 301 s. Counting the stamp's lost fraction
  // against the sender refused it for all but the first millisecond of that second.
  it('takes a delivery stamped a whole tolerance ago for all of that second, and refuses it from the next', () => {
    const codeAt = (offsetMs: number, tolerance?: Tolerance) =>
      createVerifier({
        secret: SECRET,
        now: () => TS * 1000 + offsetMs,
        ...(tolerance === undefined ? {} : { tolerance }),
      }).verify({ headers, body: BODY });
    const code = (result: ReturnType<typeof codeAt>) => (result.ok ? 'ok' : result.error.code);
    expect(code(codeAt(300_000))).toBe('ok');
    expect(code(codeAt(300_500))).toBe('ok');
    expect(code(codeAt(300_999))).toBe('ok');
    expect(code(codeAt(301_000))).toBe('timestamp_too_old');
    expect(code(codeAt(10_999, '10s'))).toBe('ok');
    expect(code(codeAt(11_000, '10s'))).toBe('timestamp_too_old');
    // The future side already counts from the start of the stamped second.
    expect(code(codeAt(-300_000))).toBe('ok');
    expect(code(codeAt(-300_001))).toBe('timestamp_too_new');
  });

  it('agrees with the standardwebhooks package on the last instant of the window', () => {
    const theirs = new Webhook(SECRET);
    for (const offset of [300_999, 301_000]) {
      vi.useFakeTimers({ now: TS * 1000 + offset, toFake: ['Date'] });
      let theirsOk = true;
      try {
        theirs.verify(BODY, headers);
      } catch {
        theirsOk = false;
      }
      const ours = createVerifier({ secret: SECRET, now: () => TS * 1000 + offset }).verify({ headers, body: BODY });
      expect(ours.ok).toBe(theirsOk);
    }
  });

  it('a receiver applies such a delivery rather than answering 400', async () => {
    let applied = 0;
    const receiver = createReceiver({
      store: memoryStore({ now: () => TS * 1000 + 300_700 }),
      secret: SECRET,
      now: () => TS * 1000 + 300_700,
      apply: () => {
        applied++;
      },
    });
    const response = await receiver.handle({ headers, body: BODY });
    expect(response).toMatchObject({ status: 200, outcome: 'applied' });
    expect(applied).toBe(1);
  });
});

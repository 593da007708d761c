// Review: the timestamp window and the retention together are the replay defence. A captured
// delivery is refused once it is older than the tolerance; until then only the recorded id absorbs
// it. A retention shorter than the tolerance leaves a gap where a replay is applied again.
import { type Duration, memoryStore } from '@idem/core';
import { describe, expect, it } from 'vitest';
import { createReceiver, createSigner } from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const START = Date.UTC(2026, 0, 1);

describe('retention against the timestamp tolerance', () => {
  // Was wrong: a retention below the tolerance was accepted (with acknowledgeShortRetention it only
  // warned about the sender's horizon), so a captured delivery replayed 2 minutes later, inside the
  // default 5-minute window, was applied again once the 1-minute record was gone. Decided: a
  // TypeError when the receiver is built, since no warning can make that configuration safe.
  it('refuses a retention shorter than the tolerance both ways and a second when the receiver is built', () => {
    const build = (retention: Duration, tolerance?: Duration | { past: Duration; future: Duration }) =>
      createReceiver({
        store: memoryStore(),
        secret: SECRET,
        retention,
        acknowledgeShortRetention: true,
        onWarning: () => undefined,
        apply: () => undefined,
        ...(tolerance === undefined ? {} : { tolerance }),
      });
    expect(() => build('1m')).toThrow(TypeError);
    expect(() => build('10m')).toThrow(TypeError);
    expect(() => build('601s')).not.toThrow();
    expect(() => build('1m', { past: '20s', future: '20s' })).not.toThrow();
    expect(() => build('1m', { past: '40s', future: '20s' })).toThrow(TypeError);
  });

  it('with a retention that outlasts the window, a replay inside it is a duplicate, and one past it is refused', async () => {
    let t = START;
    const now = () => t;
    const applied: string[] = [];
    const receiver = createReceiver({
      store: memoryStore({ now }),
      secret: SECRET,
      now,
      retention: '601s',
      acknowledgeShortRetention: true,
      onWarning: () => undefined,
      apply: (event) => void applied.push(event.id),
    });
    const body = Buffer.from('{"type":"payment.succeeded"}');
    // Stamped as far ahead as the window takes: the longest a replay of it stays inside.
    const headers = createSigner({ secret: SECRET }).sign({ id: 'evt_1', body, timestamp: new Date(t + 300_000) });
    expect((await receiver.handle({ headers, body })).outcome).toBe('applied');
    t += 600_900;
    expect((await receiver.handle({ headers, body })).outcome).toBe('duplicate');
    t += 200;
    expect((await receiver.handle({ headers, body })).outcome).toBe('rejected');
    expect(applied).toEqual(['evt_1']);
  });
});

// Review: the timestamp window and the retention together are the replay defence. A captured
// delivery is refused once it is older than the tolerance; until then only the recorded id absorbs
// it. A retention shorter than the tolerance leaves a gap where a replay is applied again.
import { memoryStore } from '@idem/core';
import { describe, expect, it } from 'vitest';
import { createReceiver, createSigner } from '../src/index.js';

const SECRET = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
const START = Date.UTC(2026, 0, 1);

describe('retention against the timestamp tolerance', () => {
  it('shows the gap: with retention 1m and the default 5m tolerance, a replay 2 minutes later is applied again', async () => {
    let t = START;
    const now = () => t;
    const applied: string[] = [];
    const receiver = createReceiver({
      store: memoryStore({ now }),
      secret: SECRET,
      now,
      retention: '1m',
      acknowledgeShortRetention: true,
      onWarning: () => undefined,
      apply: (event) => void applied.push(event.id),
    });
    const body = Buffer.from('{"type":"payment.succeeded"}');
    const headers = createSigner({ secret: SECRET }).sign({ id: 'evt_1', body, timestamp: new Date(t) });
    expect((await receiver.handle({ headers, body })).outcome).toBe('applied');
    t += 120_000; // the captured request is 2 minutes old: inside the 5-minute window
    expect((await receiver.handle({ headers, body })).outcome).toBe('applied');
    expect(applied).toEqual(['evt_1', 'evt_1']);
  });

  // Was wrong: a retention below the past tolerance is accepted (with acknowledgeShortRetention it
  // only warns about the sender's horizon), so a captured delivery is applied again inside the window;
  // needs a decision: throw a TypeError at construction, or only warn, as for the sender's horizon.
  it.fails('refuses a retention shorter than the past tolerance when the receiver is built', () => {
    expect(() =>
      createReceiver({
        store: memoryStore(),
        secret: SECRET,
        retention: '1m',
        acknowledgeShortRetention: true,
        onWarning: () => undefined,
        apply: () => undefined,
      }),
    ).toThrow(TypeError);
  });
});

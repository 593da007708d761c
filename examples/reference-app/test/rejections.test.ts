// Refused webhook deliveries reach the operator as counted lines, never one line per request (anyone
// can post junk to the endpoint), and a signature mismatch says how long the body was.
import { sign } from '@idem/webhooks';
import { describe, expect, it } from 'vitest';
import { openDatabase } from '../src/db.js';
import { rejectionLogger } from '../src/receiver/rejections.js';
import { startReceiver } from '../src/receiver/server.js';
import { manualClock as manual } from './manual-clock.js';

const mismatch = (bodyBytes: number) => ({
  code: 'signature_mismatch',
  error: { code: 'signature_mismatch', details: { bodyBytes, signatures: 1 } },
});

describe('rejectionLogger', () => {
  it('writes the first refusal at once, then one line a minute for those since, by code', () => {
    const clock = manual();
    const lines: string[] = [];
    const log = rejectionLogger({ write: (line) => lines.push(line), now: clock.now, schedule: clock.schedule });
    log.note(mismatch(1234));
    expect(lines).toEqual([
      'receiver: 1 webhook delivery refused (signature_mismatch 1; the last mismatch over a body of 1234 bytes)',
    ]);
    for (let i = 0; i < 40; i++) log.note(mismatch(900 + i));
    log.note({ code: 'timestamp_too_old' });
    clock.advance(59_999);
    expect(lines).toHaveLength(1);
    // The burst stopped: its line still goes out, by the timer, a minute after the first.
    clock.advance(1);
    expect(lines[1]).toBe(
      'receiver: 41 webhook deliveries refused (signature_mismatch 40, timestamp_too_old 1; the last mismatch over a body of 939 bytes)',
    );
    expect(clock.pending()).toBe(0);
    // Past a quiet minute, the next one goes out at once again.
    clock.advance(60_000);
    log.note({ code: 'signature_missing' });
    expect(lines[2]).toBe('receiver: 1 webhook delivery refused (signature_missing 1)');
  });

  it('writes a code it does not know as other, and what was counted when flushed', () => {
    const clock = manual();
    const lines: string[] = [];
    const log = rejectionLogger({ write: (line) => lines.push(line), now: clock.now, schedule: clock.schedule });
    log.note({ code: 'x\nFAKE LINE' });
    log.note({});
    log.flush();
    expect(lines).toEqual([
      'receiver: 1 webhook delivery refused (other 1)',
      'receiver: 1 webhook delivery refused (other 1)',
    ]);
    expect(clock.pending()).toBe(0);
    log.flush();
    expect(lines).toHaveLength(2);
  });

  it('refuses an interval that is no positive whole number of ms', () => {
    for (const everyMs of [0, -1, 1.5, Number.NaN]) {
      expect(() => rejectionLogger({ write: () => undefined, everyMs })).toThrow(TypeError);
    }
  });
});

describe('the receiver', () => {
  it('tells refused deliveries to onRejectedDeliveries, with the length of a body whose signature failed', async () => {
    const db = await openDatabase({ memory: true });
    const lines: string[] = [];
    const secret = `whsec_${Buffer.alloc(32, 1).toString('base64')}`;
    const receiver = await startReceiver({
      port: 0,
      db,
      webhookSecret: secret,
      onRejectedDeliveries: (line) => lines.push(line),
    });
    try {
      const body = JSON.stringify({ type: 'payment.succeeded', data: { id: 'ch_1', amount: 1, currency: 'EUR' } });
      const wrong = sign({
        id: 'evt_1',
        timestamp: Math.floor(Date.now() / 1000),
        body,
        secret: `whsec_${Buffer.alloc(32, 7).toString('base64')}`,
      });
      const post = (headers: Record<string, string>) =>
        fetch(receiver.webhookUrl, {
          method: 'POST',
          headers: { 'content-type': 'application/json', ...headers },
          body,
        });
      expect((await post(wrong)).status).toBe(400);
      expect(lines).toEqual([
        `receiver: 1 webhook delivery refused (signature_mismatch 1; the last mismatch over a body of ${Buffer.byteLength(body)} bytes)`,
      ]);
      // The next within the minute is counted, and told when the receiver closes.
      expect((await post({})).status).toBe(400);
      expect(lines).toHaveLength(1);
    } finally {
      await receiver.close();
      await db.close();
    }
    expect(lines[1]).toMatch(/^receiver: 1 webhook delivery refused \([a-z_]+ 1\)$/);
  });
});

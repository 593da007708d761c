// The default idempotency log of the API and the receiver (src/idempotency-log.ts), event by event: one line for each
// event docs/operations.md says to look at, none for the routine ones, and nothing but the record id,
// the operation and the event's reason, status, phase or error codes. The lines as the running API
// writes them are in api-events.int.test.ts.
import { type IdempotencyEvent, StoreContendedError, StoreUnavailableError } from '@idem/core';
import { RedisCommandError } from '@idem/redis';
import { describe, expect, it } from 'vitest';
import { idempotencyLogLine } from '../src/idempotency-log.js';

const base = { id: 'rec-id_1', operation: 'POST /charges', at: 0 };

describe('idempotencyLogLine', () => {
  it.each<IdempotencyEvent>([
    { ...base, type: 'claim', durationMs: 1 },
    { ...base, type: 'replay', status: 201, durationMs: 1 },
    { ...base, type: 'conflict', durationMs: 1 },
    { ...base, type: 'mismatch', durationMs: 1 },
    { ...base, type: 'complete', status: 201, durationMs: 1, executionMs: 1 },
    { ...base, type: 'release', durationMs: 1 },
    { ...base, type: 'not-stored', status: 429 },
    { type: 'refused', code: 'key_missing', status: 400, operation: 'POST /photos', at: 0 },
  ])('writes nothing for a routine $type', (event) => {
    expect(idempotencyLogLine(event, 'API')).toBeUndefined();
  });

  it.each<[IdempotencyEvent, RegExp]>([
    [{ ...base, type: 'claim', durationMs: 1, recovered: true }, /claim recovered .*crashed attempt/],
    [{ ...base, type: 'lease-lost', reason: 'fenced' }, /lease-lost .*, reason fenced:/],
    [{ ...base, type: 'response-not-stored', reason: 'too-large', status: 201 }, /reason too-large, status 201:/],
    [{ ...base, type: 'not-stored', status: 503 }, /not-stored .*, status 503: .*retry runs the operation again/],
    [
      { ...base, type: 'policy-error', error: new TypeError('boom') },
      /policy-error .*\(TypeError\); the outcome was stored/,
    ],
    [
      {
        ...base,
        type: 'store-error',
        phase: 'complete',
        error: new StoreUnavailableError('PostgreSQL store unavailable during complete', {
          cause: Object.assign(new Error('terminating connection'), { code: '57P01' }),
        }),
      },
      /store-error .*, phase complete: StoreUnavailableError store_unavailable "PostgreSQL store unavailable during complete" \(cause 57P01\)$/,
    ],
    // The store errors of a store that answered: their messages are idem's too, and say what it answered.
    [
      {
        ...base,
        type: 'store-error',
        phase: 'claim',
        error: new RedisCommandError('claim', 'NOPERM', "NOPERM User api has no permissions to run the 'set' command"),
      },
      /phase claim: RedisCommandError redis_command_refused "Redis claim was refused: NOPERM User api has no permissions to run the 'set' command"$/,
    ],
    [
      {
        ...base,
        type: 'store-error',
        phase: 'claim',
        error: new StoreContendedError('Redis claim kept racing with releases; retry'),
      },
      /phase claim: StoreContendedError store_contended "Redis claim kept racing with releases; retry"$/,
    ],
  ])('writes one line for %j, with the record id and the operation', (event, expected) => {
    const line = idempotencyLogLine(event, 'API');
    expect(line).toMatch(/^API: idempotency [a-z-]+( recovered)? for record rec-id_1 \(POST \/charges\)/);
    expect(line).toMatch(expected);
    expect(line).not.toMatch(/\n/);
  });

  it("tells a driver's error by its name and codes, never by its message, which may quote what it was sent", () => {
    const error = Object.assign(new Error('invalid input syntax: "card 4242 4242"'), { code: '22P02' });
    const line = idempotencyLogLine({ ...base, type: 'store-error', phase: 'transaction', error }, 'API');
    expect(line).toMatch(/phase transaction: Error 22P02$/);
    expect(line).not.toContain('4242');
    // A code that is no identifier is a value: left out too.
    const odd = Object.assign(new Error('x'), { code: 'the body: {"amount": 1}' });
    expect(idempotencyLogLine({ ...base, type: 'store-error', phase: 'claim', error: odd }, 'API')).toMatch(
      /phase claim: Error$/,
    );
  });

  it('keeps to one line whatever a message or an operation holds', () => {
    const line = idempotencyLogLine(
      {
        id: 'rec',
        operation: 'POST /a\nAPI: forged\u2028line',
        at: 0,
        type: 'store-error',
        phase: 'get',
        error: new StoreUnavailableError('two\nlines'),
      },
      'API',
    );
    expect(line).toBeDefined();
    expect(line).not.toMatch(/[\n\r\u2028\u2029]/);
  });

  it("starts with the name of the component whose route it is: the API's and the receiver's share one output", () => {
    const event: IdempotencyEvent = { ...base, type: 'lease-lost', reason: 'fenced' };
    expect(idempotencyLogLine(event, 'API')).toMatch(/^API: idempotency lease-lost for record rec-id_1 /);
    expect(idempotencyLogLine(event, 'receiver')).toMatch(/^receiver: idempotency lease-lost for record rec-id_1 /);
    expect(idempotencyLogLine(event, 'a\nforged')).toMatch(/^a forged: idempotency /);
  });
});

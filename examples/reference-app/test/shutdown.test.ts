import { describe, expect, it } from 'vitest';
import { closeInOrder } from '../src/shutdown.js';

describe('closeInOrder', () => {
  it('closes every step in order, even after one fails, then names each failure', async () => {
    const closed: string[] = [];
    const step = (name: string, fails = false) => ({
      name,
      async close() {
        closed.push(name);
        if (fails) throw new Error(`${name} is stuck`);
      },
    });
    const closing = closeInOrder([step('gateway', true), step('api'), step('receiver', true), step('database')]);
    const error = await closing.then(
      () => undefined,
      (caught: unknown) => caught,
    );
    expect(closed).toEqual(['gateway', 'api', 'receiver', 'database']);
    expect(error).toBeInstanceOf(AggregateError);
    expect((error as AggregateError).message).toBe('shutdown: closing gateway failed; closing receiver failed');
    expect((error as AggregateError).errors.map((each: Error) => (each.cause as Error).message)).toEqual([
      'gateway is stuck',
      'receiver is stuck',
    ]);
  });

  it('resolves when everything closed', async () => {
    await expect(closeInOrder([{ name: 'one', close: async () => undefined }])).resolves.toBeUndefined();
  });
});

import type { StoreHarness } from '@idem/testkit';
import {
  type RedisClientLike,
  type RedisStore,
  type RedisStoreOptions,
  redisCommandRunner,
  redisStore,
} from '../src/index.js';
import { claimKeepMs } from '../src/record-codec.js';

/**
 * What describeStore needs of a Redis store: its clock moved by the server's own commands. `client` is
 * what the store was given (one client, a pool, a cluster), so the harness's commands go where the
 * store's do.
 */
export function redisStoreHarness(
  client: RedisClientLike,
  store: RedisStore,
  close: () => Promise<unknown>,
  options: Pick<RedisStoreOptions, 'waitForReplicas'> = {},
): StoreHarness {
  const runner = redisCommandRunner(client);
  return {
    store,
    // PEXPIRE with 0 deletes the key: the same as the server's clock running out the lease.
    expire: async (id) => {
      await runner.send(store.key(id), ['PEXPIRE', store.key(id), '0']);
    },
    ttl: async (id) => {
      const ms = Number(await runner.send(store.key(id), ['PTTL', store.key(id)]));
      return ms >= 0 ? ms : undefined;
    },
    // What the server's clock does when a crashed holder's lease runs out: the key's time left
    // becomes the claim's keep (0 for a claim without one, which deletes it).
    endLease: async (id) => {
      const value = await runner.send(store.key(id), ['GET', store.key(id)]);
      await runner.send(store.key(id), ['PEXPIRE', store.key(id), String(claimKeepMs(value as Uint8Array))]);
    },
    makeCapped: (maxBytes) =>
      redisStore({
        client,
        prefix: store.prefix,
        maxResponseBytes: maxBytes,
        ...options,
      }),
    // A store made afresh over the same records, as a restarted process makes it.
    reopen: () => redisStore({ client, prefix: store.prefix, ...options }),
    close: async () => {
      await close();
    },
  };
}

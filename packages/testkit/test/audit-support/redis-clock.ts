// Time passing on a Redis server, for tests whose store keeps its records there: each key is moved
// `ms` closer to its end (PTTL less the step, in one script), which is what the server's clock does.
// A key whose time is up is deleted: Redis keeps a key whose PTTL is exactly 0 for that millisecond.
import type { Redis } from 'ioredis';

const advanceScript = `for _, k in ipairs(KEYS) do
  local t = redis.call('PTTL', k)
  if t >= 0 then
    local left = t - tonumber(ARGV[1])
    if left <= 0 then redis.call('DEL', k) else redis.call('PEXPIRE', k, left) end
  end
end
return 0`;

/** Moves the given keys `ms` closer to their end. */
export async function advanceRedisKeys(client: Redis, keys: readonly string[], ms: number): Promise<void> {
  if (keys.length > 0) await client.eval(advanceScript, keys.length, ...keys, String(ms));
}

/** Moves every key under `prefix` `ms` closer to its end. */
export async function advanceRedisPrefix(client: Redis, prefix: string, ms: number): Promise<void> {
  let cursor = '0';
  do {
    const [next, keys] = await client.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000);
    cursor = next;
    await advanceRedisKeys(client, keys, ms);
  } while (cursor !== '0');
}

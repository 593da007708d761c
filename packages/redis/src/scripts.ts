import { createHash } from 'node:crypto';
import type { RedisCommandRunner } from './command-runner.js';

/**
 * A Lua script with its SHA1, the name EVALSHA knows it by.
 *
 * @example
 * await runner.send(key, ['EVALSHA', renewScript.sha, '1', key, leasePrefix(token), '10000']);
 */
export interface LuaScript {
  readonly source: string;
  readonly sha: string;
}

const script = (source: string): LuaScript => ({ source, sha: createHash('sha1').update(source).digest('hex') });

// Every script touches exactly KEYS[1], so in a cluster each runs on the one node that owns the
// record's slot: no CROSSSLOT, no hash tags needed. The value layout is described in record-codec.ts.
// The claim needs no script: a plain SET NX PX is atomic on its own (see redis-store.ts).

/**
 * The fence shared by the three compare-and-set scripts: the record must be in progress and held by
 * this token, which is exactly "the value starts with ARGV[1]" (see leasePrefix).
 */
const fence = `local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, #ARGV[1]) ~= ARGV[1] then return 0 end
`;

/** Renew: extends the lease of the holder of the token. ARGV: lease prefix, lease in ms. */
export const renewScript = script(`${fence}redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1`);

/**
 * Complete: turns the claim into a completed record kept for the retention. 'p' becomes 'c' and the
 * outcome is appended, so the claim's token and fingerprint carry over untouched.
 * ARGV: lease prefix, encoded outcome, retention in ms.
 */
export const completeScript =
  script(`${fence}redis.call('SET', KEYS[1], 'c' .. string.sub(v, 2) .. ARGV[2], 'PX', ARGV[3])
return 1`);

/** Release: forgets the claim so a retry runs. ARGV: lease prefix. */
export const releaseScript = script(`${fence}redis.call('DEL', KEYS[1])
return 1`);

const isNoScript = (error: unknown) => error instanceof Error && error.message.startsWith('NOSCRIPT');

/**
 * Runs a script by its SHA and, when this server has not seen it yet (fresh start, SCRIPT FLUSH, a
 * failover, or another cluster node), once more with its source, which also caches it there.
 *
 * @example
 * await runScript(runner, renewScript, 'idem:abc', [leasePrefix('t1'), '10000']); // 1 or 0
 */
export async function runScript(
  runner: RedisCommandRunner,
  lua: LuaScript,
  key: string,
  args: readonly (string | Buffer)[],
): Promise<unknown> {
  try {
    return await runner.send(key, ['EVALSHA', lua.sha, '1', key, ...args]);
  } catch (error) {
    if (!isNoScript(error)) throw error;
    return runner.send(key, ['EVAL', lua.source, '1', key, ...args]);
  }
}

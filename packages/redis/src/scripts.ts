import { createHash } from 'node:crypto';
import type { RedisCommandRunner } from './redis-command-runner.js';

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
 * The fence of the compare-and-set scripts: the record must be in progress and held by this token,
 * which is exactly "the value starts with ARGV[1]" (see leasePrefix). Complete spells it out, since
 * it also answers a completion sent twice.
 */
const fence = `local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, #ARGV[1]) ~= ARGV[1] then return 0 end
`;

// The keep after the lease of the claim in `v` (its line after the fingerprint's, see
// record-codec.ts), 0 for a claim without one; `from` is where the fingerprint's line starts.
const keepOf = `local function keepOf(v, from)
  local fingerprintEnd = string.find(v, '\\n', from, true)
  return tonumber(string.sub(v, fingerprintEnd + 1, -2)) or 0
end
`;

/**
 * Renew: sets the lease of the holder of the token, and the claim's keep after it (carried over from
 * the value). ARGV: lease prefix, lease in ms.
 */
export const renewScript =
  script(`${keepOf}${fence}redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) + keepOf(v, #ARGV[1] + 1))
return 1`);

/**
 * Complete: turns the claim into a completed record kept for the retention. 'p' becomes 'c', the
 * claim's keep line goes, and the outcome is appended, so the claim's token and fingerprint carry
 * over untouched. An abandoned claim (its lease ran out, nobody took it over) completes too: its
 * holder did the work, and a takeover would only run it again.
 * ARGV: lease prefix, encoded outcome, retention in ms.
 *
 * `allow-oom` (Redis 7.0 and later): a Redis over maxmemory with noeviction refuses new claims, but
 * still stores the outcome of a request already running. Refused, that outcome would be lost, the
 * key freed, and the client's retry would run the operation a second time. Memory can grow past
 * maxmemory by at most the outcomes of the requests in flight when Redis filled up.
 *
 * A run that finds the record already completed by this token with this very outcome answers 1 and
 * changes nothing. That is this completion sent twice: its reply was lost and the client sent it
 * again after reconnecting (ioredis does by default), and only the holder of the token can have
 * completed the record. Answered 0, the engine would report a lost lease for an outcome that is
 * stored. The comparison is exact: after 'c', the token and the fingerprint's line (JSON, so no raw
 * newline inside), the rest must be the outcome byte for byte; another outcome with the same token
 * (a caller completing twice) still gets 0.
 *
 * That run sets the key's expiry again to what is left of it (at least 1 ms: 0 would delete it): a
 * write that changes nothing, but goes out to the replicas. With `waitForReplicas` the WAIT behind
 * it then covers the first run too (a replica that has a later write has every earlier one), where
 * a run that wrote nothing would leave WAIT, by its contract, to count writes of that connection
 * alone: none, sent again on a new connection, so it would answer at once and the outcome would be
 * reported replicated while no replica has it.
 */
export const completeScript = script(`#!lua flags=allow-oom
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
if string.sub(v, 1, #ARGV[1]) == ARGV[1] then
  local fingerprintEnd = string.find(v, '\\n', #ARGV[1] + 1, true)
  redis.call('SET', KEYS[1], 'c' .. string.sub(v, 2, fingerprintEnd) .. ARGV[2], 'PX', ARGV[3])
  return 1
end
if string.sub(v, 1, 1) == 'c' and string.sub(v, 2, #ARGV[1]) == string.sub(ARGV[1], 2) then
  local fingerprintEnd = string.find(v, '\\n', #ARGV[1] + 1, true)
  if fingerprintEnd and string.sub(v, fingerprintEnd + 1) == ARGV[2] then
    local ttl = redis.call('PTTL', KEYS[1])
    if ttl >= 0 then redis.call('PEXPIRE', KEYS[1], math.max(ttl, 1)) end
    return 1
  end
end
return 0`);

/**
 * Release: forgets the claim so a retry runs. ARGV: lease prefix.
 *
 * Unlike complete, a release sent twice (its reply lost, the client sending it again after a
 * reconnect) answers 0 the second time: the key is gone, and an absent key cannot tell "deleted by
 * this release" from "the lease ran out" or "taken over and released by someone else". Leaving a
 * marker to tell them apart would hold the key against the next claim and change the value format
 * every reader of the prefix relies on. The key is free either way, which is what a release is for;
 * only the engine's report is off (a `lease-lost` instead of a `release`).
 */
export const releaseScript = script(`${fence}redis.call('DEL', KEYS[1])
return 1`);

/**
 * Forget: deletes the record held by the token, in progress or completed, so the next claim runs
 * afresh (an operator's way out of a wrongly stored outcome). ARGV: lease prefix.
 *
 * The fence is release's with the state byte left out: the value must start with 'p' or 'c' and then
 * the rest of the lease prefix, the token as JSON and its newline, so another token (one that starts
 * with this one too) never matches, and neither does a value whose first byte idem never writes.
 */
export const forgetScript = script(`local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local state = string.sub(v, 1, 1)
if (state ~= 'p' and state ~= 'c') or string.sub(v, 2, #ARGV[1]) ~= string.sub(ARGV[1], 2) then return 0 end
redis.call('DEL', KEYS[1])
return 1`);

/**
 * Inspect, and take over: reads a taken key's value with its PTTL, in one step, so a claim with a
 * keep can tell a live lease from an abandoned one. With a lease prefix in ARGV[1] (the token the
 * claim `replaces`), a claim held by that token whose lease has run out (PTTL at most its keep) is
 * replaced by ARGV[2] for ARGV[3] ms and the answer is 1. Otherwise the answer is {value, PTTL}, or 0
 * for a key that is gone. ARGV: lease prefix or '', new claim, its PX.
 */
export const inspectScript = script(`${keepOf}local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local ttl = redis.call('PTTL', KEYS[1])
if #ARGV[1] > 0 and string.sub(v, 1, #ARGV[1]) == ARGV[1] and ttl >= 0 and ttl <= keepOf(v, #ARGV[1] + 1) then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return {v, ttl}`);

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

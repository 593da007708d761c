import { isIPv4, isIPv6 } from 'node:net';

/** Options of {@link createLoginThrottle}. */
export interface LoginThrottleOptions {
  /** Failed sign-ins one name may have from one address within `windowMs` before the next waits. Default 10. */
  maxFailures?: number | undefined;
  /**
   * Failed sign-ins one address may have within `windowMs`, whatever the names, before every sign-in
   * from it waits: the cap on password spraying (one password tried against many names). At least
   * `maxFailures`. Default 100, or `maxFailures` when that is higher.
   */
  maxFailuresPerAddress?: number | undefined;
  /** How long a failure counts, in ms. Default 15 minutes. */
  windowMs?: number | undefined;
  /**
   * Most name and address pairs followed at once, and most addresses, each for addresses (an IPv6 one
   * by its /64) and again for /48s; the longest-quiet one not locked is forgotten first. Default 10,000.
   */
  maxEntries?: number | undefined;
  now?: (() => number) | undefined;
}

/** Counts failed sign-ins per name and client address, and says how long the next one must wait. */
export interface LoginThrottle {
  /** Seconds until a sign-in as `name` from `address` is taken again, or 0 when it is taken now. */
  retryAfter(name: string, address: string): number;
  failed(name: string, address: string): void;
  /**
   * A right password: the pair's failures are forgotten, at its address too (the attempt itself was
   * counted as a failure before its password was checked). Failures under other names stay.
   */
  succeeded(name: string, address: string): void;
}

/**
 * The login page's guard against password guessing (OWASP ASVS 2.2.1): after `maxFailures` wrong
 * passwords for one name from one address within the window, that pair is refused (429) without any
 * password being checked until its oldest failure leaves the window. Keyed by the name as typed
 * (whether or not such a user exists, so a refusal says nothing about who exists) and by the address,
 * so a stranger guessing from elsewhere cannot lock a user out of her own sign-in.
 *
 * The pair alone lets one address try one password against every name (password spraying): each pair
 * fails once. So an address also has a cap across names, `maxFailuresPerAddress`, ten times the pair's
 * by default: past it every sign-in from that address waits, whatever the name, until its oldest
 * failure leaves the window. A right password forgives its own pair's failures there, never those of
 * other names, so a sprayer cannot wipe its count by signing in to an account of its own. The price:
 * many people behind one address (an office's NAT) who together mistype 100 passwords in 15 minutes
 * wait too.
 *
 * An IPv6 client is counted by its /64 (`addressGroup`), and its /48 has caps of its own, ten times
 * those of a /64 (`networkFactor`): a holder of a /48 would otherwise have 65,536 fresh counts.
 *
 * The memory is bounded: when it is full, the pair (or address) quiet the longest among those not
 * locked is forgotten, so that unlocking one takes `maxEntries` other locked ones.
 *
 * @example
 * const throttle = createLoginThrottle();
 * if (throttle.retryAfter('alice', req.ip) > 0) return tooMany(res);
 */
export function createLoginThrottle(options: LoginThrottleOptions = {}): LoginThrottle {
  const maxFailures = options.maxFailures ?? 10;
  const windowMs = options.windowMs ?? 15 * 60_000;
  const maxEntries = options.maxEntries ?? 10_000;
  const now = options.now ?? Date.now;
  if (!Number.isInteger(maxFailures) || maxFailures < 1) throw new TypeError('maxFailures must be a positive integer');
  const maxFailuresPerAddress = options.maxFailuresPerAddress ?? Math.max(100, maxFailures);
  if (!Number.isInteger(maxFailuresPerAddress) || maxFailuresPerAddress < maxFailures) {
    throw new TypeError('maxFailuresPerAddress must be an integer no lower than maxFailures');
  }
  if (!Number.isFinite(windowMs) || windowMs <= 0) throw new TypeError('windowMs must be a positive number');
  if (!Number.isInteger(maxEntries) || maxEntries < 1) throw new TypeError('maxEntries must be a positive integer');
  // Two tiers, each a pair log and an address log: the address (an IPv6 one by its /64) at the limits
  // as given, and an IPv6 address's /48 at ten times them (`addressNetwork`). An IPv4 address has no
  // /48: its second tier is skipped.
  const tiers = [
    {
      group: addressGroup,
      pairs: failureLog(maxFailures, windowMs, maxEntries),
      addresses: failureLog(maxFailuresPerAddress, windowMs, maxEntries),
    },
    {
      group: addressNetwork,
      pairs: failureLog(maxFailures * networkFactor, windowMs, maxEntries),
      addresses: failureLog(maxFailuresPerAddress * networkFactor, windowMs, maxEntries),
    },
  ];
  const keyOf = (name: string, group: string) => `${name.toLowerCase()}\u0000${group}`;
  return {
    retryAfter(name, address) {
      const t = now();
      let wait = 0;
      for (const { group: groupOf, pairs, addresses } of tiers) {
        const group = groupOf(address);
        if (group === undefined) continue;
        wait = Math.max(wait, pairs.wait(keyOf(name, group), t), addresses.wait(group, t));
      }
      return wait;
    },
    failed(name, address) {
      const t = now();
      for (const { group: groupOf, pairs, addresses } of tiers) {
        const group = groupOf(address);
        if (group === undefined) continue;
        pairs.add(keyOf(name, group), t);
        addresses.add(group, t);
      }
    },
    succeeded(name, address) {
      const t = now();
      for (const { group: groupOf, pairs, addresses } of tiers) {
        const group = groupOf(address);
        if (group === undefined) continue;
        const key = keyOf(name, group);
        addresses.remove(group, pairs.recent(key, t));
        pairs.forget(key);
      }
    },
  };
}

/**
 * How many times the caps of one /64 a /48 has. A site, or anyone with a tunnel broker's free /48,
 * holds 65,536 /64s: counted by its /64 alone, it could guess 65,536 times as often as one client. But
 * a /48 is not always one subscriber (a mobile network hands each device a /64 of its pools, and an
 * office or campus is one /48), so the /64's caps there would let one of them lock out the rest, as
 * an office behind one NAT address is locked out by its own mistypes: ten times, the factor between a
 * pair's cap and an address's, bounds a /48 holder to ten times one client's guesses and leaves room
 * for its honest neighbours. A /56 (a home) gets no tier of its own: a /48's caps hold it too.
 */
const networkFactor = 10;

/**
 * Failure times per key within the window, oldest first, at most `limit` of them, for at most
 * `maxEntries` keys. A Map keeps insertion order: a key is re-inserted on each failure, so the first
 * key is the one quiet the longest.
 */
function failureLog(limit: number, windowMs: number, maxEntries: number) {
  const failures = new Map<string, number[]>();
  const recent = (key: string, t: number): number[] => {
    const times = failures.get(key);
    if (times === undefined) return [];
    while (times.length > 0 && (times[0] as number) <= t - windowMs) times.shift();
    if (times.length === 0) failures.delete(key);
    return times;
  };
  // The key to forget when the memory is full: the one quiet the longest among those not locked. A
  // locked key is quiet by construction (a refused sign-in is no failure), so forgetting the quietest
  // unlocked it first: failures under `maxEntries` other names, from anywhere, bought ten more guesses.
  // Only when every other key is locked does the quietest go (the memory stays bounded). Never the
  // key that just failed (`current`, the newest): forgotten at once, its failures would never count.
  const forgettable = (current: string, t: number): string => {
    for (const key of failures.keys()) {
      if (key !== current && recent(key, t).length < limit) return key;
    }
    return failures.keys().next().value as string;
  };
  return {
    recent: (key: string, t: number): readonly number[] => [...recent(key, t)],
    /** Seconds until `key` is under its limit again; 0 when it is now. */
    wait(key: string, t: number): number {
      const times = recent(key, t);
      if (times.length < limit) return 0;
      return Math.max(1, Math.ceil(((times[0] as number) + windowMs - t) / 1000));
    },
    add(key: string, t: number): void {
      const times = recent(key, t);
      times.push(t);
      if (times.length > limit) times.shift();
      failures.delete(key);
      failures.set(key, times);
      if (failures.size > maxEntries) failures.delete(forgettable(key, t));
    },
    /** Takes one failure at each of `forgiven` times off `key` (those it still holds). */
    remove(key: string, forgiven: readonly number[]): void {
      const times = failures.get(key);
      if (times === undefined) return;
      for (const time of forgiven) {
        const at = times.lastIndexOf(time);
        if (at >= 0) times.splice(at, 1);
      }
      if (times.length === 0) failures.delete(key);
    },
    forget(key: string): void {
      failures.delete(key);
    },
  };
}

/**
 * The address a failure is counted under: an IPv4 address as it is, an IPv6 one by its /64. One
 * subscriber, one machine even, holds a whole /64 (2^64 addresses, SLAAC privacy addresses change by
 * themselves): counted one by one, they would give a guesser as many fresh counts as it likes. An
 * IPv4 address mapped into IPv6 (`::ffff:192.0.2.1` as a dual-stack socket reports it, or in any other
 * spelling: `::ffff:c000:201`, `0:0:0:0:0:ffff:192.0.2.1`) is the IPv4 one. A port, and the brackets
 * around an IPv6 address, are dropped: a proxy may write them in X-Forwarded-For (Azure Application
 * Gateway writes `a.b.c.d:port`), and a new source port with each connection would be a fresh count.
 *
 * @example
 * addressGroup('2001:db8:1:2:aaaa::1'); // '2001:db8:1:2::/64'
 * addressGroup('[::ffff:c000:201]:443'); // '192.0.2.1'
 */
export function addressGroup(address: string): string {
  const host = withoutPort(address);
  if (isIPv4(host)) return host;
  // A zone id (`fe80::1%eth0`) names the local interface, not the client.
  const bare = host.replace(/%.*$/, '');
  if (!isIPv6(bare)) return address;
  const groups = ipv6Groups(bare);
  // ::ffff:0:0/96, IPv4-mapped.
  if (groups.slice(0, 5).every((group) => group === 0) && groups[5] === 0xffff) {
    const high = groups[6] as number;
    const low = groups[7] as number;
    return [high >> 8, high & 0xff, low >> 8, low & 0xff].join('.');
  }
  return `${groups
    .slice(0, 4)
    .map((group) => group.toString(16))
    .join(':')}::/64`;
}

/**
 * The /48 an IPv6 address is in, the second tier of the count (see `networkFactor`); undefined for an
 * IPv4 address (an IPv4-mapped one included, in any spelling) and for anything that is no address.
 * A port, brackets and a zone id are dropped as in {@link addressGroup}.
 *
 * @example
 * addressNetwork('2001:db8:1:2:aaaa::1'); // '2001:db8:1::/48'
 * addressNetwork('192.0.2.1'); // undefined
 */
export function addressNetwork(address: string): string | undefined {
  const bare = withoutPort(address).replace(/%.*$/, '');
  if (!isIPv6(bare)) return undefined;
  const groups = ipv6Groups(bare);
  if (groups.slice(0, 5).every((group) => group === 0) && groups[5] === 0xffff) return undefined;
  return `${groups
    .slice(0, 3)
    .map((group) => group.toString(16))
    .join(':')}::/48`;
}

/** `address` without a port (`a.b.c.d:port`, `[v6]:port`) or the brackets of `[v6]`. */
function withoutPort(address: string): string {
  const bracketed = /^\[([^\]]*)\](?::\d{1,5})?$/.exec(address);
  if (bracketed) return bracketed[1] as string;
  const withPort = /^(\d{1,3}(?:\.\d{1,3}){3}):\d{1,5}$/.exec(address);
  return withPort ? (withPort[1] as string) : address;
}

/** The eight 16-bit groups of a valid IPv6 address (an embedded IPv4 tail is its last two). */
function ipv6Groups(address: string): number[] {
  let text = address;
  const ipv4Tail = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(text);
  if (ipv4Tail) {
    const [a, b, c, d] = ipv4Tail.slice(1).map(Number) as [number, number, number, number];
    text = `${text.slice(0, ipv4Tail.index)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const [head = '', tail] = text.split('::');
  const left = head === '' ? [] : head.split(':');
  const right = tail === undefined || tail === '' ? [] : tail.split(':');
  const zeros = tail === undefined ? [] : Array<string>(8 - left.length - right.length).fill('0');
  return [...left, ...zeros, ...right].map((group) => Number.parseInt(group, 16));
}

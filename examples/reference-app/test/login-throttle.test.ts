import { describe, expect, it } from 'vitest';
import { addressGroup, addressNetwork, createLoginThrottle } from '../src/idp/login-throttle.js';

const minute = 60_000;

describe('createLoginThrottle', () => {
  const clocked = (options: { maxFailures?: number; windowMs?: number; maxEntries?: number } = {}) => {
    let now = Date.UTC(2026, 0, 1);
    const throttle = createLoginThrottle({ maxFailures: 3, windowMs: 10 * minute, ...options, now: () => now });
    return { throttle, advance: (ms: number) => (now += ms) };
  };

  it('takes sign-ins up to the limit, then says how long to wait until the oldest failure leaves the window', () => {
    const { throttle, advance } = clocked();
    for (let i = 0; i < 3; i++) {
      expect(throttle.retryAfter('alice', '10.0.0.1')).toBe(0);
      throttle.failed('alice', '10.0.0.1');
      advance(minute);
    }
    // The first failure was 3 minutes ago: 7 minutes to go.
    expect(throttle.retryAfter('alice', '10.0.0.1')).toBe(7 * 60);
    advance(7 * minute - 1);
    expect(throttle.retryAfter('alice', '10.0.0.1')).toBe(1);
    advance(1);
    expect(throttle.retryAfter('alice', '10.0.0.1')).toBe(0);
    // One more failure fills the window again (the second and third still count).
    throttle.failed('alice', '10.0.0.1');
    expect(throttle.retryAfter('alice', '10.0.0.1')).toBe(60);
  });

  it('counts a name whatever its case, apart per address, and forgets a pair once its password was right', () => {
    const { throttle } = clocked();
    for (const name of ['alice', 'ALICE', 'Alice']) throttle.failed(name, '10.0.0.1');
    expect(throttle.retryAfter('alice', '10.0.0.1')).toBeGreaterThan(0);
    // Someone guessing elsewhere does not lock alice out where she is, nor another name.
    expect(throttle.retryAfter('alice', '10.0.0.2')).toBe(0);
    expect(throttle.retryAfter('bob', '10.0.0.1')).toBe(0);
    throttle.failed('bob', '10.0.0.1');
    throttle.failed('bob', '10.0.0.1');
    throttle.succeeded('bob', '10.0.0.1');
    throttle.failed('bob', '10.0.0.1');
    expect(throttle.retryAfter('bob', '10.0.0.1')).toBe(0);
  });

  it('follows at most maxEntries pairs, forgetting the one quiet the longest', () => {
    const { throttle, advance } = clocked({ maxFailures: 1, maxEntries: 2 });
    throttle.failed('a', 'x');
    advance(1);
    throttle.failed('b', 'x');
    advance(1);
    throttle.failed('a', 'x');
    advance(1);
    throttle.failed('c', 'x');
    expect(throttle.retryAfter('b', 'x')).toBe(0);
    expect(throttle.retryAfter('a', 'x')).toBeGreaterThan(0);
    expect(throttle.retryAfter('c', 'x')).toBeGreaterThan(0);
  });

  it('refuses settings that would never or always throttle', () => {
    expect(() => createLoginThrottle({ maxFailures: 0 })).toThrow(TypeError);
    expect(() => createLoginThrottle({ maxFailures: 1.5 })).toThrow(TypeError);
    expect(() => createLoginThrottle({ windowMs: 0 })).toThrow(TypeError);
    expect(() => createLoginThrottle({ windowMs: Number.NaN })).toThrow(TypeError);
    expect(() => createLoginThrottle({ maxEntries: 0 })).toThrow(TypeError);
  });
});

describe('addressGroup: an IPv6 client is counted by its /64', () => {
  it.each([
    ['10.0.0.1', '10.0.0.1'],
    ['::ffff:192.0.2.1', '192.0.2.1'],
    ['::FFFF:192.0.2.1', '192.0.2.1'],
    ['2001:db8:1:2:aaaa::1', '2001:db8:1:2::/64'],
    ['2001:0db8:0001:0002:ffff:ffff:ffff:ffff', '2001:db8:1:2::/64'],
    ['2001:DB8:1:2::', '2001:db8:1:2::/64'],
    ['2001:db8::1', '2001:db8:0:0::/64'],
    ['::1', '0:0:0:0::/64'],
    ['fe80::1%eth0', 'fe80:0:0:0::/64'],
    ['2001:db8:1:2:3:4:1.2.3.4', '2001:db8:1:2::/64'],
    ['not an address', 'not an address'],
    ['[not an address]:80', '[not an address]:80'],
  ])('%s is counted as %s', (address, group) => {
    expect(addressGroup(address)).toBe(group);
  });

  // Was wrong: only the `::ffff:a.b.c.d` spelling of an IPv4-mapped address was taken for the IPv4
  // one; the full and the hex spellings (as valid, and what a proxy may write in X-Forwarded-For) were
  // grouped as the /64 `0:0:0:0::/64`, one count for every IPv4 client. A port or brackets (Azure
  // Application Gateway writes `a.b.c.d:port` in X-Forwarded-For, and `[v6]:port` is how IPv6 takes
  // one) made the text no address at all, so each new connection was a fresh count.
  it.each([
    ['0:0:0:0:0:ffff:192.0.2.1', '192.0.2.1'],
    ['0:0:0:0:0:FFFF:C000:0201', '192.0.2.1'],
    ['::ffff:c000:201', '192.0.2.1'],
    ['::ffff:198.51.100.7%eth0', '198.51.100.7'],
    ['192.0.2.1:5678', '192.0.2.1'],
    ['[2001:db8:1:2::1]', '2001:db8:1:2::/64'],
    ['[2001:db8:1:2:aaaa::1]:443', '2001:db8:1:2::/64'],
    ['[::ffff:192.0.2.1]:443', '192.0.2.1'],
  ])('%s is counted as %s too', (address, group) => {
    expect(addressGroup(address)).toBe(group);
  });

  it('a guesser whose proxy writes its address with a port (a new one per connection) is refused from the limit on', () => {
    let now = Date.UTC(2026, 0, 1);
    const throttle = createLoginThrottle({ maxFailures: 3, windowMs: 10 * minute, now: () => now });
    for (let port = 40_001; port <= 40_003; port++) {
      expect(throttle.retryAfter('alice', `192.0.2.1:${port}`)).toBe(0);
      throttle.failed('alice', `192.0.2.1:${port}`);
      now += 1000;
    }
    expect(throttle.retryAfter('alice', '192.0.2.1:40004')).toBeGreaterThan(0);
    expect(throttle.retryAfter('alice', '192.0.2.1')).toBeGreaterThan(0);
  });

  it('IPv4 clients written as mapped IPv6 in hex are counted apart: a stranger cannot lock out every other one', () => {
    const throttle = createLoginThrottle({ maxFailures: 3, windowMs: 10 * minute, now: () => Date.UTC(2026, 0, 1) });
    for (let i = 0; i < 3; i++) throttle.failed('alice', '::ffff:c633:6407'); // 198.51.100.7
    expect(throttle.retryAfter('alice', '::ffff:c633:6407')).toBeGreaterThan(0);
    expect(throttle.retryAfter('alice', '::ffff:c000:201')).toBe(0); // 192.0.2.1, alice herself
  });

  it('a guesser that takes a new address of its /64 for each wrong password is refused from the limit on', () => {
    let now = Date.UTC(2026, 0, 1);
    const throttle = createLoginThrottle({ maxFailures: 3, windowMs: 10 * minute, now: () => now });
    for (let i = 1; i <= 3; i++) {
      expect(throttle.retryAfter('alice', `2001:db8:1:2::${i.toString(16)}`)).toBe(0);
      throttle.failed('alice', `2001:db8:1:2::${i.toString(16)}`);
      now += 1000;
    }
    expect(throttle.retryAfter('alice', '2001:db8:1:2:dead:beef:0:4')).toBeGreaterThan(0);
    // Another /64 is another client.
    expect(throttle.retryAfter('alice', '2001:db8:1:3::1')).toBe(0);
  });
});

// Was wrong: failures were counted per (name, address) pair only, so one address could try one
// password against every name it likes (password spraying) and never be slowed: 10,000 names, 10,000
// guesses, none of them refused. Now an address (an IPv6 one by its /64) has a cap of its own across
// names, higher than the pair's, in the same window and with the same answer.
describe('createLoginThrottle: failures per address, across names', () => {
  const clocked = (options: { maxFailures?: number; maxFailuresPerAddress?: number; maxEntries?: number } = {}) => {
    let now = Date.UTC(2026, 0, 1);
    const throttle = createLoginThrottle({ windowMs: 10 * minute, ...options, now: () => now });
    return { throttle, advance: (ms: number) => (now += ms) };
  };

  it('refuses an address that sprays one password over many names, from its 100th failure by default', () => {
    const { throttle, advance } = clocked();
    let refused = 0;
    for (let i = 0; i < 10_000; i++) {
      if (throttle.retryAfter(`user-${i}`, '198.51.100.7') > 0) {
        refused++;
        continue;
      }
      throttle.failed(`user-${i}`, '198.51.100.7');
    }
    expect(refused).toBe(10_000 - 100);
    // Until its oldest failure leaves the window; then one more guess, and the wait again.
    expect(throttle.retryAfter('someone-new', '198.51.100.7')).toBe(10 * 60);
    advance(10 * minute);
    expect(throttle.retryAfter('someone-new', '198.51.100.7')).toBe(0);
    // Another address is another client.
    expect(throttle.retryAfter('user-1', '198.51.100.8')).toBe(0);
  });

  it('counts an IPv6 sprayer by its /64, whichever address of it each guess comes from', () => {
    const { throttle } = clocked({ maxFailures: 3, maxFailuresPerAddress: 5 });
    for (let i = 1; i <= 5; i++) throttle.failed(`user-${i}`, `2001:db8:1:2::${i.toString(16)}`);
    expect(throttle.retryAfter('user-6', '2001:db8:1:2:dead:beef:0:6')).toBeGreaterThan(0);
    expect(throttle.retryAfter('user-6', '2001:db8:1:3::1')).toBe(0);
  });

  it("forgives a right password's pair at its address too, and nothing else there", () => {
    const { throttle } = clocked({ maxFailures: 3, maxFailuresPerAddress: 5 });
    // Each sign-in is counted before its password is checked (interactions.ts), then forgiven.
    for (let i = 0; i < 20; i++) {
      throttle.failed('alice', '10.0.0.1');
      throttle.succeeded('alice', '10.0.0.1');
    }
    expect(throttle.retryAfter('bob', '10.0.0.1')).toBe(0);
    // A sprayer with an account of its own cannot wipe its guesses by signing in as itself.
    for (let i = 0; i < 4; i++) throttle.failed(`user-${i}`, '10.0.0.1');
    throttle.failed('mallory', '10.0.0.1');
    throttle.succeeded('mallory', '10.0.0.1');
    expect(throttle.retryAfter('user-9', '10.0.0.1')).toBe(0);
    throttle.failed('user-9', '10.0.0.1');
    expect(throttle.retryAfter('user-10', '10.0.0.1')).toBeGreaterThan(0);
    expect(throttle.retryAfter('mallory', '10.0.0.1')).toBeGreaterThan(0);
  });

  it('follows at most maxEntries addresses, forgetting the quietest one not locked', () => {
    const { throttle, advance } = clocked({ maxFailures: 1, maxFailuresPerAddress: 2, maxEntries: 2 });
    throttle.failed('a', '10.0.0.1');
    advance(1);
    throttle.failed('b', '10.0.0.1');
    advance(1);
    throttle.failed('a', '10.0.0.2');
    advance(1);
    throttle.failed('a', '10.0.0.3');
    // The locked address stays locked, for every name; the quietest unlocked one was forgotten.
    expect(throttle.retryAfter('c', '10.0.0.1')).toBeGreaterThan(0);
    throttle.failed('b', '10.0.0.2');
    expect(throttle.retryAfter('c', '10.0.0.2')).toBe(0);
  });

  it('refuses a per-address cap that is not a whole number at least the per-pair limit', () => {
    expect(() => createLoginThrottle({ maxFailuresPerAddress: 0 })).toThrow(TypeError);
    expect(() => createLoginThrottle({ maxFailuresPerAddress: 50.5 })).toThrow(TypeError);
    expect(() => createLoginThrottle({ maxFailures: 10, maxFailuresPerAddress: 9 })).toThrow(TypeError);
    expect(() => createLoginThrottle({ maxFailures: 10, maxFailuresPerAddress: 10 })).not.toThrow();
    // The default follows a per-pair limit set above it.
    expect(() => createLoginThrottle({ maxFailures: 500 })).not.toThrow();
  });
});

// Was wrong: an IPv6 client was counted by its /64 only, and a site, or anyone with a free tunnel
// broker account, holds a /48: 65,536 /64s, each a fresh count, so 655,360 guesses at one name per
// window instead of 10. A /48 now has caps of its own, ten times the /64's (a /48 may be many
// subscribers of a mobile network: one of them must not lock out the rest at the /64's numbers).
describe('addressNetwork: the /48 of an IPv6 address', () => {
  it.each([
    ['2001:db8:1:2:aaaa::1', '2001:db8:1::/48'],
    ['[2001:DB8:1:ffff::1]:443', '2001:db8:1::/48'],
    ['2001:db8::1', '2001:db8:0::/48'],
  ])('%s is in %s', (address, network) => {
    expect(addressNetwork(address)).toBe(network);
  });

  it.each(['192.0.2.1', '::ffff:192.0.2.1', '::ffff:c000:201', '192.0.2.1:443', 'not an address'])(
    '%s has none (an IPv4 client is one address)',
    (address) => {
      expect(addressNetwork(address)).toBeUndefined();
    },
  );
});

describe('createLoginThrottle: a /48, ten times the caps of a /64', () => {
  const clocked = (options: { maxFailures?: number; maxFailuresPerAddress?: number } = {}) => {
    let now = Date.UTC(2026, 0, 1);
    const throttle = createLoginThrottle({ windowMs: 10 * minute, ...options, now: () => now });
    return { throttle, advance: (ms: number) => (now += ms) };
  };
  const subnet = (n: number) => `2001:db8:1:${n.toString(16)}::1`;

  it('refuses a guesser that takes a new /64 of its /48 for each wrong password, from 10 × maxFailures on', () => {
    const { throttle, advance } = clocked({ maxFailures: 2, maxFailuresPerAddress: 100 });
    for (let n = 1; n <= 20; n++) {
      expect(throttle.retryAfter('alice', subnet(n))).toBe(0);
      throttle.failed('alice', subnet(n));
    }
    expect(throttle.retryAfter('alice', subnet(21))).toBe(10 * 60);
    // Other names from that /48, and alice from another /48, are not refused.
    expect(throttle.retryAfter('bob', subnet(21))).toBe(0);
    expect(throttle.retryAfter('alice', '2001:db8:2::1')).toBe(0);
    advance(10 * minute);
    expect(throttle.retryAfter('alice', subnet(21))).toBe(0);
  });

  it('refuses a sprayer that rotates its /64s within a /48, from 10 × maxFailuresPerAddress on', () => {
    const { throttle } = clocked({ maxFailures: 1, maxFailuresPerAddress: 2 });
    for (let n = 1; n <= 20; n++) {
      expect(throttle.retryAfter(`user-${n}`, subnet(n))).toBe(0);
      throttle.failed(`user-${n}`, subnet(n));
    }
    expect(throttle.retryAfter('user-21', subnet(21))).toBeGreaterThan(0);
    expect(throttle.retryAfter('user-21', '2001:db8:2::1')).toBe(0);
  });

  it("forgives a right password's failures at the /48 too", () => {
    const { throttle } = clocked({ maxFailures: 1, maxFailuresPerAddress: 1 });
    // Each sign-in is counted before its password is checked (interactions.ts), then forgiven.
    for (let n = 1; n <= 30; n++) {
      expect(throttle.retryAfter('alice', subnet(n))).toBe(0);
      throttle.failed('alice', subnet(n));
      throttle.succeeded('alice', subnet(n));
    }
    expect(throttle.retryAfter('bob', subnet(31))).toBe(0);
  });

  it('leaves IPv4 clients as they were: one address, one count', () => {
    const { throttle } = clocked({ maxFailures: 1, maxFailuresPerAddress: 1 });
    for (let n = 1; n <= 30; n++) throttle.failed('alice', `198.51.100.${n}`);
    expect(throttle.retryAfter('alice', '198.51.100.31')).toBe(0);
  });
});

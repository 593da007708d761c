// How `npm start` reads its numeric variables (src/env.ts), case by case, without spawning it: the
// config audit starts the real script once per variable to prove a refusal is one line and exit 1;
// the values each reader takes and refuses are checked here.
import { describe, expect, it } from 'vitest';
import { ConfigError, envPort, envSeconds } from '../src/env.js';
import { sessionIdleBounds } from '../src/idp/session-lifetime.js';

const refusal = (read: () => unknown): string => {
  try {
    read();
  } catch (error) {
    expect(error).toBeInstanceOf(ConfigError);
    return (error as Error).message;
  }
  throw new Error('expected a ConfigError');
};

describe('envSeconds', () => {
  const name = 'REFRESH_TOKEN_REUSE_SECONDS';
  const read = (value: string | undefined, min?: number) =>
    envSeconds(value === undefined ? {} : { [name]: value }, name, 1_209_600, min);

  it('unset is undefined (the caller’s default); whole seconds within bounds are taken, blanks around them too', () => {
    expect(read(undefined)).toBeUndefined();
    expect(read('0')).toBe(0);
    expect(read(' 30 ')).toBe(30);
    expect(read('1209600')).toBe(1_209_600);
  });

  // Was a defect: `Number('')` is 0 (turned reuse off in silence), and Number() reads '1e3', '0x10'
  // and ' 1.5' as numbers nobody meant.
  it.each(['abc', '', '-1', '1.5', '30s', '1e3', '0x10', '999999999999999', '1209601'])(
    'refuses %j with one line naming the variable and the bounds',
    (value) => {
      const message = refusal(() => read(value));
      expect(message).toContain(name);
      expect(message).toContain('from 0 to 1209600');
      expect(message).toContain(JSON.stringify(value));
      expect(message).not.toContain('\n');
    },
  );

  it('a minimum of 1 refuses 0 (a lease of nothing), and takes 1', () => {
    expect(refusal(() => read('0', 1))).toContain('from 1 to');
    expect(read('1', 1)).toBe(1);
  });
});

// SESSION_IDLE_SECONDS as main.ts reads it: a minute at least (the app records use once a minute), at
// most the sign-in session's lifetime (SESSION_LIFETIME_SECONDS, 12 hours unset): a longer idle limit
// would never be reached.
describe('SESSION_IDLE_SECONDS', () => {
  const name = 'SESSION_IDLE_SECONDS';
  const read = (value: string, lifetime?: number) => {
    const { min, max } = sessionIdleBounds(lifetime);
    return envSeconds({ [name]: value }, name, max, min);
  };

  it('takes 60 to 43200 seconds with the default lifetime, and up to the lifetime set', () => {
    expect(read('60')).toBe(60);
    expect(read('1800')).toBe(1800);
    expect(read('43200')).toBe(43_200);
    expect(read('1209600', 1_209_600)).toBe(1_209_600);
  });

  it.each([
    ['59', undefined, 'from 60 to 43200'],
    ['0', undefined, 'from 60 to 43200'],
    ['43201', undefined, 'from 60 to 43200'],
    ['3601', 3600, 'from 60 to 3600'],
    ['', undefined, 'from 60 to 43200'],
    ['30m', undefined, 'from 60 to 43200'],
  ])('refuses %j (lifetime %s) with one line naming the variable', (value, lifetime, bounds) => {
    const message = refusal(() => read(value, lifetime));
    expect(message).toContain(name);
    expect(message).toContain(bounds);
    expect(message).not.toContain('\n');
  });
});

describe('envPort', () => {
  it('unset is the fallback; 1 to 65535 are taken; empty, 0, 65536 and non-digits are refused by name', () => {
    expect(envPort({}, 'AUTH_PORT', 8081)).toBe(8081);
    expect(envPort({ AUTH_PORT: '1' }, 'AUTH_PORT', 8081)).toBe(1);
    expect(envPort({ AUTH_PORT: '65535' }, 'AUTH_PORT', 8081)).toBe(65_535);
    for (const value of ['', '0', '65536', '80a', '8.5']) {
      expect(refusal(() => envPort({ AUTH_PORT: value }, 'AUTH_PORT', 8081))).toContain('AUTH_PORT');
    }
  });
});

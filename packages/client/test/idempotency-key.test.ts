import { formatKeyField, newIdempotencyKey, parseKeyField } from '@idem/client';
import { parseIdempotencyKey } from '@idem/core';
import { afterEach, describe, expect, it, vi } from 'vitest';

const uuidV4 = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

describe('keys', () => {
  afterEach(() => {
    vi.unstubAllGlobals();
  });

  it('makes distinct UUIDv4 keys', () => {
    const keys = new Set(Array.from({ length: 1000 }, newIdempotencyKey));
    expect(keys.size).toBe(1000);
    for (const key of keys) expect(key).toMatch(uuidV4);
  });

  it('falls back to getRandomValues where randomUUID is missing (non-secure browser contexts)', () => {
    const real = globalThis.crypto;
    vi.stubGlobal('crypto', { getRandomValues: (bytes: Uint8Array) => real.getRandomValues(bytes) });
    const keys = new Set(Array.from({ length: 200 }, newIdempotencyKey));
    expect(keys.size).toBe(200);
    for (const key of keys) expect(key).toMatch(uuidV4);
  });

  it('writes sf-strings that the server-side parser reads back as the same key', () => {
    for (const key of ['abc', 'with space', 'quote"inside', 'back\\slash', newIdempotencyKey()]) {
      const field = formatKeyField(key, 'sf-string');
      expect(parseKeyField(field)).toBe(key);
      expect(parseIdempotencyKey(field, { strict: true })).toEqual({ ok: true, key });
    }
    expect(formatKeyField('abc', 'bare')).toBe('abc');
    expect(parseIdempotencyKey(formatKeyField('abc', 'bare'))).toEqual({ ok: true, key: 'abc' });
  });

  it('refuses keys the field cannot carry, in either format', () => {
    for (const key of ['', '   ', 'caf\u00e9', 'line\nbreak', 'tab\there']) {
      expect(() => formatKeyField(key, 'sf-string'), JSON.stringify(key)).toThrow(TypeError);
      expect(() => formatKeyField(key, 'bare'), JSON.stringify(key)).toThrow(TypeError);
    }
    for (const key of ['with space', 'quote"inside', 'a,b', 'a;b', 'back\\slash']) {
      expect(() => formatKeyField(key, 'bare'), key).toThrow(TypeError);
    }
  });

  it('refuses an sf-string with an escape RFC 9651 does not allow', () => {
    expect(parseKeyField('"a\\b"')).toBeUndefined();
    expect(parseKeyField('"ab\\"')).toBeUndefined();
    expect(parseKeyField('"a\\"b"')).toBe('a"b');
  });

  it('reads keys the server sends, and refuses ambiguous ones', () => {
    expect(parseKeyField('"abc";ttl=60')).toBe('abc');
    expect(parseKeyField(' abc ')).toBe('abc');
    expect(parseKeyField('a, b')).toBeUndefined();
    expect(parseKeyField('"a", "b"')).toBeUndefined();
    expect(parseKeyField('"unterminated')).toBeUndefined();
    expect(parseKeyField('""')).toBeUndefined();
    expect(parseKeyField(null)).toBeUndefined();
  });
});

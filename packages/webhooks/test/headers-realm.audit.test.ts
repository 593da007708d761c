// Was wrong: `headers` had to have this realm's Object.prototype (or none), so a plain object made in
// another realm (a node:vm context: a sandboxed config, a test runner's globals) was refused as "not
// a plain object". Any realm's Object.prototype is taken now; a Headers, a Map or a class instance
// (of any realm) is still refused, its entries being where Object.entries does not look.
import vm from 'node:vm';
import { describe, expect, it } from 'vitest';
import { recordingSender } from './support/recording-sender.js';

const message = { url: 'https://receiver.test/hooks', id: 'evt_1', body: '{"n":1}' };

const otherRealm = (source: string) => vm.runInNewContext(source) as Record<string, string>;

describe('headers made in another realm', () => {
  it('send() takes a plain object of another realm and sends its entries', async () => {
    const headers = otherRealm(`({ 'X-Tenant': 'a' })`);
    expect(Object.getPrototypeOf(headers)).not.toBe(Object.prototype);
    const { sender, sent } = recordingSender();
    const result = await sender.send({ ...message, headers });
    expect(result.outcome).toBe('delivered');
    expect(sent[0]).toMatchObject({ 'x-tenant': 'a' });
  });

  it('createSender({ headers }) takes one too', async () => {
    const { sender, sent } = recordingSender(otherRealm(`({ 'user-agent': 'hooks/1' })`));
    await sender.send(message);
    expect(sent[0]).toMatchObject({ 'user-agent': 'hooks/1' });
  });

  it('still takes a null-prototype object and a structured clone', async () => {
    const { sender, sent } = recordingSender();
    const bare = Object.assign(Object.create(null) as Record<string, string>, { 'x-a': '1' });
    await sender.send({ ...message, headers: bare });
    await sender.send({ ...message, headers: structuredClone(otherRealm(`({ 'x-b': '2' })`)) });
    expect(sent.map((headers) => headers['x-a'] ?? headers['x-b'])).toEqual(['1', '2']);
  });

  it.each([
    ['a Map of another realm', () => otherRealm(`new Map([['x-a', '1']])`)],
    [
      'a class instance of another realm',
      () => otherRealm(`new (class Options { constructor() { this['x-a'] = '1'; } })()`),
    ],
    [
      'a class instance',
      () =>
        new (class Options {
          'x-a' = '1';
        })() as unknown as Record<string, string>,
    ],
    ['a Headers', () => new Headers({ 'x-a': '1' }) as unknown as Record<string, string>],
    ['an object over a plain object', () => Object.create({ 'x-a': '1' }) as Record<string, string>],
    ['an object over one of another realm', () => Object.create(otherRealm('({})')) as Record<string, string>],
    [
      'an object whose prototype names Object but is not its prototype',
      () => {
        const prototype = Object.create(null) as { constructor?: unknown };
        prototype.constructor = Object.defineProperty(() => {}, 'name', { value: 'Object' });
        return Object.create(prototype) as Record<string, string>;
      },
    ],
  ])('still refuses %s, at send() and at createSender()', async (_what, make) => {
    const { sender, sent } = recordingSender();
    await expect(sender.send({ ...message, headers: make() })).rejects.toThrow(/plain object/);
    expect(() => recordingSender(make())).toThrow(TypeError);
    expect(sent).toHaveLength(0);
  });
});

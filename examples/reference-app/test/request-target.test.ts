// src/request-target.ts on its own (hostile-request-target.int.test.ts sends such targets over raw
// sockets to the running services, and checks only that they get no 500): what each target becomes,
// which it refuses, and the 400 each kind of service answers with.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { describe, expect, it } from 'vitest';
import { toOriginForm, toOwnOriginForm, withOriginForm } from '../src/request-target.js';

const request = (url: string) => ({ url }) as IncomingMessage;

describe('toOriginForm', () => {
  it('leaves an origin-form target, and the asterisk of OPTIONS *, as they are', () => {
    for (const target of ['/', '/charges?limit=2', '*']) {
      const req = request(target);
      expect(toOriginForm(req), target).toBe(true);
      expect(req.url).toBe(target);
    }
  });

  it('brings an absolute-form target to its path and query as sent, / when it has no path', () => {
    for (const [target, origin] of [
      ['http://api.example/charges?limit=2', '/charges?limit=2'],
      ['https://api.example:8443/a/b', '/a/b'],
      ['http://api.example', '/'],
      // The authority ends at the first / ? or #: a query holding a / stays the query.
      ['http://api.example?next=/charges', '/?next=/charges'],
    ] as const) {
      const req = request(target);
      expect(toOriginForm(req), target).toBe(true);
      expect(req.url, target).toBe(origin);
    }
  });

  it('refuses, target untouched, an absolute-form target whose authority does not parse', () => {
    for (const target of ['http://x:99999/charges', 'http://[/', 'http://a b/']) {
      const req = request(target);
      expect(toOriginForm(req), target).toBe(false);
      expect(req.url).toBe(target);
    }
  });
});

describe('toOwnOriginForm', () => {
  const own = new Set(['http://localhost:8080', 'https://api.example']);
  const sent = (url: string, host = 'evil.example') => ({ url, headers: { host } }) as unknown as IncomingMessage;

  it('brings a target naming an own origin to its path and query, and makes its authority the Host', () => {
    for (const [target, origin, host] of [
      ['http://localhost:8080/photos?limit=2', '/photos?limit=2', 'localhost:8080'],
      // The origin as URL writes it: host in lower case, the scheme's default port dropped.
      ['http://LOCALHOST:8080', '/', 'localhost:8080'],
      ['https://api.example:443/a', '/a', 'api.example'],
    ] as const) {
      const req = sent(target);
      toOwnOriginForm(req, own);
      expect([req.url, req.headers.host], target).toEqual([origin, host]);
    }
  });

  it('leaves as sent, Host untouched, an origin-form target and one naming another origin', () => {
    for (const target of [
      '/photos',
      '*',
      'http://evil.example/photos',
      'http://localhost:8081/photos',
      'https://localhost:8080/photos',
      'http://api.example/photos',
      'http://user@localhost:8080/photos',
      'http://[/photos',
    ]) {
      const req = sent(target);
      toOwnOriginForm(req, own);
      expect([req.url, req.headers.host], target).toEqual([target, 'evil.example']);
    }
  });
});

describe('withOriginForm', () => {
  const answered = (kind: 'problem' | 'page', target: string) => {
    let handled = false;
    const written: { status?: number; headers?: Record<string, string>; body?: string } = {};
    const res = {
      writeHead(status: number, headers: Record<string, string>) {
        written.status = status;
        written.headers = headers;
        return this;
      },
      end(body: string) {
        written.body = body;
        return this;
      },
    } as unknown as ServerResponse;
    withOriginForm(() => {
      handled = true;
    }, kind)(request(target), res);
    return { handled, ...written };
  };

  it('hands a target it takes to the handler, and answers nothing itself', () => {
    expect(answered('problem', 'http://api.example/charges')).toEqual({ handled: true });
  });

  it("answers a services' bad target with a 400 path_malformed problem, a page's with a 400 page", () => {
    const problem = answered('problem', 'http://[/');
    expect(problem).toMatchObject({ handled: false, status: 400 });
    expect(problem.headers?.['Content-Type']).toBe('application/problem+json');
    expect(JSON.parse(problem.body ?? '')).toMatchObject({ status: 400, code: 'path_malformed' });
    const page = answered('page', 'http://[/');
    expect(page).toMatchObject({ handled: false, status: 400 });
    expect(page.headers?.['Content-Type']).toMatch(/^text\/html/);
    expect(page.body).toContain('Bad request');
  });
});

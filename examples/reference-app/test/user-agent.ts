// A scripted user agent for the tests: fetch with manual redirects and a cookie jar, the way a browser
// keeps cookies per host (ports share a jar, as in browsers).
import { createHash, randomBytes } from 'node:crypto';
import { sendOnceScript } from '../src/html.js';

export interface Step {
  url: string;
  response: Response;
  body: string;
}

export interface CookieJar {
  readonly cookies: Map<string, { value: string; raw: string }>;
  store(response: Response): void;
  header(): string;
}

export function createCookieJar(): CookieJar {
  const cookies = new Map<string, { value: string; raw: string }>();
  return {
    cookies,
    store(response) {
      for (const raw of response.headers.getSetCookie()) {
        const [pair = ''] = raw.split(';');
        const eq = pair.indexOf('=');
        const name = pair.slice(0, eq).trim();
        const value = pair.slice(eq + 1).trim();
        if (/max-age=0/i.test(raw) || /expires=thu, 01 jan 1970/i.test(raw) || value === '') cookies.delete(name);
        else cookies.set(name, { value, raw });
      }
    },
    header() {
      return [...cookies].map(([name, { value }]) => `${name}=${value}`).join('; ');
    },
  };
}

export interface UserAgent {
  readonly jar: CookieJar;
  request(url: string, init?: RequestInit): Promise<Step>;
  /** GET, then follow redirects until `stop(url)` says so or a non-redirect answers. */
  follow(url: string, stop?: (url: string) => boolean): Promise<Step>;
  postForm(url: string, fields: Record<string, string>, headers?: Record<string, string>): Promise<Step>;
}

export function createUserAgent(): UserAgent {
  const jar = createCookieJar();
  const request = async (url: string, init: RequestInit = {}): Promise<Step> => {
    const headers = new Headers(init.headers);
    const cookie = jar.header();
    if (cookie) headers.set('cookie', cookie);
    const response = await fetch(url, { ...init, headers, redirect: 'manual' });
    jar.store(response);
    return { url, response, body: await response.text() };
  };
  const followFrom = async (first: Step, stop: (url: string) => boolean): Promise<Step> => {
    let step = first;
    for (let hops = 0; hops < 20; hops++) {
      const location = step.response.headers.get('location');
      if (!location || step.response.status < 300 || step.response.status > 399) return step;
      const next = new URL(location, step.url).href;
      if (stop(next)) return { ...step, url: next };
      step = await request(next);
    }
    throw new Error('too many redirects');
  };
  return {
    jar,
    request,
    async follow(url, stop = () => false) {
      return followFrom(await request(url), stop);
    },
    postForm(url, fields, headers = {}) {
      return request(url, {
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers },
        body: new URLSearchParams(fields),
      });
    },
  };
}

export function formField(html: string, name: string): string {
  const match = new RegExp(`name="${name}" value="([^"]*)"`).exec(html);
  if (!match?.[1]) throw new Error(`no ${name} field in page`);
  return match[1];
}

export function formAction(html: string, suffix: string): string {
  const match = new RegExp(`action="([^"]*/${suffix})"`).exec(html);
  if (!match?.[1]) throw new Error(`no form ending in /${suffix}`);
  return match[1];
}

export function pkcePair(): { verifier: string; challenge: string } {
  const verifier = randomBytes(32).toString('base64url');
  return { verifier, challenge: createHash('sha256').update(verifier).digest('base64url') };
}

export function decodeJwt(token: string): { header: Record<string, unknown>; payload: Record<string, any> } {
  const [header = '', payload = ''] = token.split('.');
  return {
    header: JSON.parse(Buffer.from(header, 'base64url').toString()),
    payload: JSON.parse(Buffer.from(payload, 'base64url').toString()),
  };
}

/** A page without the one script every page of ours carries (a form is sent once; see html.ts). */
export function withoutSendOnce(body: string): string {
  return body.replace(`<script>${sendOnceScript}</script>`, '');
}

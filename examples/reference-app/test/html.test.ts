import { describe, expect, it } from 'vitest';
import { htmlPage, pageHeaders } from '../src/html.js';

describe('htmlPage', () => {
  // Was a defect: no page named an icon, so the browser asked every server of the stack for
  // /favicon.ico: a 404 in each log and console (at the provider, oidc-provider's error page).
  it('names an icon the CSP allows, so no browser asks a server for /favicon.ico', () => {
    const icon = /<link rel="icon" href="([^"]*)">/.exec(htmlPage('Title', '<p>x</p>'))?.[1];
    expect(icon).toBe('data:,');
    const imgSrc = /(?:^|;\s*)img-src ([^;]*)/.exec(pageHeaders['Content-Security-Policy'] ?? '')?.[1];
    expect(imgSrc?.split(' ')).toContain('data:');
  });
});

import { createHash } from 'node:crypto';

const entities: Record<string, string> = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };

/**
 * Escapes text for HTML element content and quoted attribute values.
 *
 * @example
 * ```ts
 * escapeHtml('<b>"hi"</b>'); // '&lt;b&gt;&quot;hi&quot;&lt;/b&gt;'
 * ```
 */
export function escapeHtml(value: unknown): string {
  return String(value).replace(/[&<>"']/g, (char) => entities[char] ?? char);
}

/**
 * The one stylesheet every page embeds; the CSP allows exactly this text by its hash. Every text meets
 * WCAG's 4.5:1 contrast on its background: the error red is #a00 on white (7.7:1) and a light red on
 * the dark theme (7.3:1), where #a00 would be 2.1:1. A word too long for its line (an email address, a
 * subject, the API's URL in a consent heading) breaks rather than push the page sideways: at 320 CSS px
 * (a phone, 400% zoom) nothing scrolls but the receiver's table (WCAG 1.4.10).
 */
const style =
  'body{font-family:system-ui,sans-serif;max-width:40rem;margin:2rem auto;padding:0 1rem;line-height:1.5;overflow-wrap:break-word}' +
  'label{display:block;margin-top:.75rem}input,button{font:inherit;padding:.35rem .5rem}' +
  'button{margin-top:1rem}.error{color:#a00;font-weight:600}section{border-top:1px solid #ccc;margin-top:1.5rem}' +
  'pre{white-space:pre-wrap;background:#f4f4f4;padding:.5rem}li,td{overflow-wrap:anywhere}' +
  '.theme-dark{background:#1d1f21;color:#e8e8e8;padding:.5rem 1rem}.theme-dark pre{background:#2c2f33}' +
  '.theme-dark .error{color:#ff8a80}';

const styleHash = `'sha256-${createHash('sha256').update(style).digest('base64')}'`;

/**
 * The one script every page embeds, allowed by its hash like the stylesheet: a form is sent once per
 * page. A double click on "Allow" or "Sign in" otherwise sends the form twice; the browser drops the
 * first answer (the way on to the application) and shows the second, which finds the step already
 * done: a dead end, though everything went through. The pages work without it.
 *
 * A form that carries an idempotency key (`key`, the charge forms) may be sent again 2 s after the
 * last time: the same key makes the second send harmless (the API replays the first charge), and a
 * person who pressed Stop during a slow answer and clicks again must not meet a button that does
 * nothing, whose only way on (a reload) renders a new key and so a second charge. A double click
 * still sends once.
 *
 * A page that Back (or Forward) brings out of the browser's back/forward cache comes back as it was
 * left, its sent form still marked: every button of it would do nothing, silently. Chromium keeps
 * even `no-store` pages there. Such a page reloads instead, as it would without that cache: a fresh
 * render, with fresh forms (a new idempotency key for a new charge) and data as it is now.
 */
export const sendOnceScript =
  "document.addEventListener('submit',function(e){var f=e.target,t=Date.now(),s=Number(f.dataset.sent);" +
  "if(s&&!(f.elements.namedItem('key')&&t-s>=2000)){e.preventDefault()}else{f.dataset.sent=String(t)}});" +
  "addEventListener('pageshow',function(e){if(e.persisted)location.reload()})";

const scriptHash = `'sha256-${createHash('sha256').update(sendOnceScript).digest('base64')}'`;

/**
 * The headers every HTML page of the reference app carries: a strict CSP with no framing (RFC 9700
 * clickjacking defence), no referrer (codes and state never leak through `Referer`), and no caching.
 * `form-action` is left out on purpose: the login form's 303 chain ends at the client's redirect URI,
 * and browsers apply `form-action` to every hop of that chain.
 *
 * @example
 * ```ts
 * for (const [name, value] of Object.entries(pageHeaders)) res.setHeader(name, value);
 * ```
 */
export const pageHeaders: Readonly<Record<string, string>> = {
  'Content-Security-Policy': `default-src 'none'; style-src ${styleHash}; script-src ${scriptHash}; img-src 'self' data:; base-uri 'none'; frame-ancestors 'none'`,
  'X-Frame-Options': 'DENY',
  'Referrer-Policy': 'no-referrer',
  'X-Content-Type-Options': 'nosniff',
  'Cache-Control': 'no-store',
  'Content-Type': 'text/html; charset=utf-8',
};

/**
 * Wraps page content in a small accessible HTML document: `lang`, a title, one `main` landmark.
 * `body` must already be escaped. The empty icon keeps browsers from asking every server of the stack
 * for a `/favicon.ico` it does not have (a 404 in every log and console, and on the provider a
 * request that reaches oidc-provider's error page).
 *
 * @example
 * ```ts
 * res.send(htmlPage('Sign in', '<h1>Sign in</h1>'));
 * ```
 */
export function htmlPage(title: string, body: string): string {
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${escapeHtml(title)}</title>
<link rel="icon" href="data:,">
<style>${style}</style>
<script>${sendOnceScript}</script>
</head>
<body>
<main>
${body}
</main>
</body>
</html>
`;
}

/**
 * A plain error page. `message` is shown as given, so callers pass fixed, generic text only.
 *
 * @example
 * ```ts
 * res.status(400).send(errorPage('This sign-in link has expired', 'Start again from the application.'));
 * ```
 */
export function errorPage(title: string, message: string): string {
  return htmlPage(title, `<h1>${escapeHtml(title)}</h1>\n<p>${escapeHtml(message)}</p>`);
}

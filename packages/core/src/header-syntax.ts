// RFC 9110's header field syntax, written here rather than taken from node:http's
// validateHeaderName/validateHeaderValue: those are the only reason the engine would import
// node:http, which Cloudflare Workers provide only from compatibility date 2025-08-15. The two checks
// accept and refuse exactly what Node's do (test/header-syntax.property.test.ts compares them on every
// character up to U+02FF and on random strings), so a header that passes can always be written by
// Node's `writeHead` on replay.

// field-name = token; token = 1*tchar; tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" /
// "." / "^" / "_" / "`" / "|" / "~" / DIGIT / ALPHA (RFC 9110 section 5.6.2). Anchored with no `m`
// flag, so `$` is the end of the string, never a line end.
const token = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

// What Node writes as a field value: HTAB, SP, VCHAR (0x21-0x7E) and obs-text (0x80-0xFF), any number
// of them, the empty string included. Anything else (NUL, CR, LF, other controls, DEL, a code unit
// over 0xFF, a lone surrogate) is refused. Unlike RFC 9110's field-value, leading and trailing
// whitespace pass, as they do in Node (it writes them; a reader trims them).
const notFieldValueChar = /[^\t\x20-\x7e\x80-\xff]/;

/**
 * True when `name` is an HTTP token (RFC 9110 section 5.6.2), what a header field name must be: one
 * or more of the letters, digits and ``!#$%&'*+-.^_`|~``. The same as Node's `validateHeaderName`.
 *
 * @example
 * isHttpToken('x-request-id'); // true
 * isHttpToken('a b'); // false
 */
export function isHttpToken(name: string): boolean {
  return token.test(name);
}

/**
 * True when every character of `value` may be written in a header field value: HTAB, SP, visible
 * ASCII and obs-text (U+0080 to U+00FF). The empty string passes. The same as Node's
 * `validateHeaderValue` on a string.
 *
 * @example
 * isFieldValue('W/"é\t1"'); // true
 * isFieldValue('/a\r\nset-cookie: x=1'); // false
 */
export function isFieldValue(value: string): boolean {
  return !notFieldValueChar.test(value);
}

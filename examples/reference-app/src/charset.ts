/**
 * The `charset` parameter of a `Content-Type` value, lowercased and unquoted, or undefined when it
 * names none. The API and the receiver take JSON in UTF-8 only (RFC 8259 section 8.1): body-parser
 * alone would also decode `charset=utf-16` (it takes any `utf-` charset), and the receiver's notes
 * route would read any charset as UTF-8.
 *
 * @example
 * ```ts
 * charsetOf('application/json; charset="UTF-8"'); // 'utf-8'
 * charsetOf('application/json'); // undefined
 * ```
 */
export function charsetOf(contentType: string | undefined): string | undefined {
  for (const parameter of (contentType ?? '').split(';').slice(1)) {
    const separator = parameter.indexOf('=');
    if (separator === -1 || parameter.slice(0, separator).trim().toLowerCase() !== 'charset') continue;
    const value = parameter.slice(separator + 1).trim();
    return (
      value.length >= 2 && value.startsWith('"') && value.endsWith('"') ? value.slice(1, -1) : value
    ).toLowerCase();
  }
  return undefined;
}

/**
 * True when `contentType` names no charset, or UTF-8: `utf-8`, or `utf8`, its other label in the
 * WHATWG Encoding standard, which some clients send (and which Node and @idem/core's fingerprint read
 * as UTF-8).
 */
export function isUtf8Charset(contentType: string | undefined): boolean {
  const charset = charsetOf(contentType);
  return charset === undefined || charset === 'utf-8' || charset === 'utf8';
}

/**
 * A `Content-Type` parameter (RFC 9110 §5.6.6) by its name: `;`, the name in any case, `=`, and a
 * value quoted (returned without its quotes) or not. Made once per name, by the modules that read one.
 *
 * @example
 * const charset = parameterPattern('charset');
 * parameterOf(charset, 'text/plain; CHARSET="Shift_JIS"'); // 'Shift_JIS'
 */
export function parameterPattern(name: string): RegExp {
  return new RegExp(`;\\s*${name}\\s*=\\s*(?:"([^"]*)"|([^\\s;"]*))`, 'i');
}

/** The value of the parameter `pattern` reads (see {@link parameterPattern}), or undefined when there is none. */
export function parameterOf(pattern: RegExp, contentType: string): string | undefined {
  const match = pattern.exec(contentType);
  return match === null ? undefined : (match[1] ?? match[2]);
}

/** C0 controls (NUL to US), DEL and the C1 controls. */
// biome-ignore lint/suspicious/noControlCharactersInRegex: control characters are exactly what is matched.
const controlCharacter = /[\u0000-\u001f\u007f-\u009f]/;
/** The same, except tab and line feed. */
// biome-ignore lint/suspicious/noControlCharactersInRegex: control characters are exactly what is matched.
const controlCharacterButTabOrLineFeed = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/;

/**
 * True when `text` holds a control character. PostgreSQL refuses NUL in `text` (the query would fail,
 * a 500), and no title, username or note needs the others; `allowLines` lets tab and line feed through
 * for text written in several lines.
 *
 * @example
 * ```ts
 * hasControlCharacters('a\u0000b'); // true
 * hasControlCharacters('two\nlines', { allowLines: true }); // false
 * ```
 */
export function hasControlCharacters(text: string, options: { allowLines?: boolean } = {}): boolean {
  return (options.allowLines ? controlCharacterButTabOrLineFeed : controlCharacter).test(text);
}

/**
 * The one spelling of a username or password that is stored, looked up and verified: Unicode NFC,
 * as RFC 8265's profiles for usernames and passwords prescribe (NIST SP 800-63B asks for a
 * normalisation too). The same word reaches the provider composed (`é`, one code point) from most
 * keyboards and decomposed (`e` and U+0301) from others, or from text pasted out of a macOS file
 * name; compared as sent, the second would be another username, and the right password a wrong one.
 * ASCII is its own NFC, so accounts with ASCII credentials are unchanged.
 *
 * @example
 * ```ts
 * credentialText('cafe\u0301') === credentialText('caf\u00e9'); // true
 * ```
 */
export function credentialText(text: string): string {
  return text.normalize('NFC');
}

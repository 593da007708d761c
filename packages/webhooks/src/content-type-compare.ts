// ASCII letters only, as the header names are lowered: toLowerCase() also folds non-ASCII letters,
// which no HTTP token holds, and a value of obs-text must stay the bytes it was.
const asciiLower = (text: string) => text.replace(/[A-Z]+/g, (letters) => letters.toLowerCase());

const OWS = /^[ \t]*/;
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+/;
// qdtext and quoted-pair (RFC 9110 5.6.4), obs-text included.
const QUOTED = /^"((?:[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*)"/;

/**
 * A content type as `outbox.add()` compares two events by it (RFC 9110 8.3.1 and 5.6.6): trimmed as
 * fetch sends it, type and subtype in lower case, parameter names in lower case, whitespace around
 * `;` left out, a quoted value unquoted (`"utf-8"` is `utf-8`), and the `charset` value in lower case.
 * Other parameter values stay as written, in the order written: a value may be case-sensitive (a
 * `profile` URL). A value that does not parse as a media type compares as it did before: trimmed,
 * the part before its first `;` in lower case, the rest as written. Only for comparing: the outbox
 * stores the content type as the caller spelt it, and the relay sends that.
 *
 * @example
 * contentTypeAsCompared('Application/JSON ; Charset="UTF-8"') === contentTypeAsCompared('application/json;charset=utf-8'); // true
 */
export function contentTypeAsCompared(contentType: string): string {
  const value = contentType.replace(/^[ \t\r\n]+|[ \t\r\n]+$/g, '');
  const parsed = canonicalMediaType(value);
  if (parsed !== undefined) return `parsed ${parsed}`;
  const semicolon = value.indexOf(';');
  const mediaType = semicolon === -1 ? value : value.slice(0, semicolon);
  return `as written ${asciiLower(mediaType)}${semicolon === -1 ? '' : value.slice(semicolon)}`;
}

// The media type and its parameters in one spelling, or undefined when `value` is not
// `type "/" subtype *( OWS ";" OWS [ name "=" ( token / quoted-string ) ] )`.
function canonicalMediaType(value: string): string | undefined {
  const type = TOKEN.exec(value)?.[0];
  if (type === undefined || value[type.length] !== '/') return undefined;
  let rest = value.slice(type.length + 1);
  const subtype = TOKEN.exec(rest)?.[0];
  if (subtype === undefined) return undefined;
  rest = rest.slice(subtype.length);
  let out = asciiLower(`${type}/${subtype}`);
  while (rest.length > 0) {
    rest = rest.slice((OWS.exec(rest)?.[0] ?? '').length);
    if (rest[0] !== ';') return undefined;
    rest = rest.slice(1);
    rest = rest.slice((OWS.exec(rest)?.[0] ?? '').length);
    // An empty parameter (`;;`, or a `;` at the end) is allowed, and says nothing.
    if (rest.length === 0 || rest[0] === ';') continue;
    const name = TOKEN.exec(rest)?.[0];
    if (name === undefined || rest[name.length] !== '=') return undefined;
    rest = rest.slice(name.length + 1);
    let parameter: string;
    const token = TOKEN.exec(rest)?.[0];
    if (token !== undefined) {
      parameter = token;
      rest = rest.slice(token.length);
    } else {
      const quoted = QUOTED.exec(rest);
      if (quoted === null) return undefined;
      parameter = (quoted[1] as string).replace(/\\(.)/gs, '$1');
      rest = rest.slice(quoted[0].length);
    }
    const lowerName = asciiLower(name);
    // JSON quoting keeps a value holding `;` or `=` from reading as another parameter.
    out += `;${lowerName}=${JSON.stringify(lowerName === 'charset' ? asciiLower(parameter) : parameter)}`;
  }
  return out;
}

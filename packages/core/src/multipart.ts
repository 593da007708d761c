import { trimBlanks } from './blanks.js';
import { parameterOf, parameterPattern } from './media-type.js';

/**
 * The fingerprint form of a multipart body (RFC 2046 §5.1, RFC 7578): its parts, in order, each as
 * its header fields and its content, without the boundary. Clients pick a new random boundary each
 * time they serialise a form (`fetch` with a `FormData`, curl `-F`, every HTTP library), so a retry of
 * the same upload differs from the first try in its boundary alone: hashed as bytes it would be a
 * different request, and the retry a 422. The preamble and epilogue carry nothing (RFC 2046 says to
 * ignore them) and are left out too.
 *
 * Undefined when the body is not well-formed multipart under that boundary, or has more than
 * {@link maxParts} parts or {@link maxFieldLines} header lines in a part (a body of many tiny parts
 * would cost far more to read than to hash): the caller then hashes its bytes, as for any other body. Both limits hold whatever the boundary, so a retry is read the same way as the first try.
 *
 * @example
 * const body = Buffer.from('--x\r\nContent-Disposition: form-data; name="a"\r\n\r\n1\r\n--x--\r\n');
 * canonicalMultipart(body, 'multipart/form-data; boundary=x'); // Buffer 'h40:content-disposition:form-data; name="a"\nc1:1'
 */
export function canonicalMultipart(body: Uint8Array, contentType: string): Buffer | undefined {
  const boundary = boundaryOf(contentType);
  if (boundary === undefined) return undefined;
  const parts = partsOf(Buffer.from(body.buffer, body.byteOffset, body.byteLength), boundary, maxParts);
  if (parts === undefined) return undefined;
  const out: Buffer[] = [];
  for (const part of parts) {
    const framed = partForHash(part);
    if (framed === undefined) return undefined;
    out.push(framed);
  }
  return Buffer.concat(out);
}

/**
 * True when a part of the multipart body under the boundary its `Content-Type` names has a header
 * section that is no list of header fields (RFC 7578 §4.8 takes RFC 9110's field syntax: a token,
 * a colon, a value of visible characters, spaces and tabs, each line ended by CRLF), or one longer
 * than {@link maxPartHeaderBytes}: what a multipart parser refuses as a malformed part header
 * (busboy's "Malformed part header", under multer). The body is walked as such a parser walks it,
 * so a body it reads without that error is never said to have one: a delimiter is `--boundary`
 * after a line break (the body read as if one came first), followed by `--` (the end) or a line
 * break (a part's header section); anything else is content, not a delimiter, and a header section
 * with no blank line before the next delimiter runs on into it, so it is not judged. False for a
 * `Content-Type` that names more than one boundary (or one inside another parameter's quotes):
 * which of them a parser takes is its own reading.
 *
 * @example
 * malformedPartHeader(Buffer.from('--x\r\nno colon\r\n\r\n1\r\n--x--\r\n'), 'multipart/form-data; boundary=x'); // true
 */
export function malformedPartHeader(body: Uint8Array, contentType: string): boolean {
  if ((contentType.match(/boundary\s*=/gi) ?? []).length !== 1) return false;
  const boundary = boundaryOf(contentType);
  if (boundary === undefined) return false;
  const text = Buffer.concat([lineBreak, Buffer.from(body.buffer, body.byteOffset, body.byteLength)]);
  const delimiter = Buffer.from(`\r\n--${boundary}`, 'latin1');
  let at = text.indexOf(delimiter);
  while (at !== -1) {
    const after = at + delimiter.length;
    if (text[after] === dash && text[after + 1] === dash) return false;
    // The next delimiter may begin at the line break that ends this one: two in a row, no part.
    const next = text.indexOf(delimiter, after);
    if (text[after] === cr && text[after + 1] === lf) {
      const section = text.subarray(after + 2, next === -1 ? text.length : Math.max(after + 2, next));
      if (badHeaderSection(section)) return true;
    }
    at = next;
  }
  return false;
}

// A part (from its header section on) whose header section does not parse: a line that is no field
// line before the blank line, or no blank line within the limit.
function badHeaderSection(part: Buffer): boolean {
  if (part[0] === cr && part[1] === lf) return false;
  // The blank line must end within the limit (a section cut by it is refused whatever it holds).
  const split = part.subarray(0, maxPartHeaderBytes).indexOf(headerEnd);
  if (split === -1) return part.length > maxPartHeaderBytes;
  return !fieldLines(part.subarray(0, split));
}

const lineBreak = Buffer.from('\r\n');

/** The longest header section of a part, its blank line included, that a multipart parser reads (Node's own header limit, busboy's too). */
export const maxPartHeaderBytes = 16 * 1024;

// RFC 9110 §5.1, §5.5: a field line is a token, a colon and a value of visible characters (and
// obs-text), spaces and tabs; a line that starts with a space or tab continues the one before.
const fieldLine = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+:[\t\x20-\x7e\x80-\xff]*$/;
const continuation = /^[\t ][\t\x20-\x7e\x80-\xff]*$/;

function fieldLines(section: Buffer): boolean {
  const lines = section.toString('latin1').split('\r\n');
  return lines.every((line, index) => fieldLine.test(line) || (index > 0 && continuation.test(line)));
}

// The parts of a multipart body under `boundary`, each as the bytes between two delimiter lines (its
// header section, the blank line, its content). Undefined when the body has no delimiter line of that
// boundary, a delimiter followed by more than transport padding (RFC 2046: linear white space a
// gateway may add), no close delimiter, or more than `limit` parts.
function partsOf(bytes: Buffer, boundary: string, limit: number): Buffer[] | undefined {
  const delimiter = Buffer.from(`--${boundary}`, 'latin1');
  const nextDelimiter = Buffer.from(`\r\n--${boundary}`, 'latin1');
  // The first delimiter opens the body or ends a line of the preamble (which may be empty).
  const opens = bytes.subarray(0, delimiter.length).equals(delimiter);
  let at = opens ? 0 : bytes.indexOf(nextDelimiter);
  if (at === -1) return undefined;
  if (!opens) at += 2;
  const parts: Buffer[] = [];
  for (;;) {
    at += delimiter.length;
    // `--` after a delimiter closes the body; whatever follows is the epilogue.
    if (bytes[at] === dash && bytes[at + 1] === dash) return parts;
    while (bytes[at] === space || bytes[at] === tab) at++;
    if (bytes[at] !== cr || bytes[at + 1] !== lf) return undefined;
    at += 2;
    if (parts.length === limit) return undefined;
    const end = bytes.indexOf(nextDelimiter, at);
    if (end === -1) return undefined;
    parts.push(bytes.subarray(at, end));
    at = end + 2;
  }
}

/**
 * Orders `[name, value]` pairs by name, then value (code unit order): the one order the fingerprint
 * gives a form part's header fields, so it does not depend on how they came. (A query's parameters
 * are sorted by name only: the order of a repeated name's values is what a handler sees.)
 */
export function byNameThenValue([a, av]: readonly [string, string], [b, bv]: readonly [string, string]): number {
  return a < b ? -1 : a > b ? 1 : av < bv ? -1 : av > bv ? 1 : 0;
}

/** Parts read at most; a form with more is fingerprinted by its bytes. */
export const maxParts = 1000;
/** Header lines read at most in one part; a part with more makes the form fingerprinted by its bytes. */
export const maxFieldLines = 32;
const dash = 0x2d;
const space = 0x20;
const tab = 0x09;
const cr = 0x0d;
const lf = 0x0a;
const headerEnd = Buffer.from('\r\n\r\n');

// One part as `h<length>:<header fields>c<length>:<content>`: each length-prefixed, so no two
// different forms frame into the same bytes. Field names are case-insensitive and their order
// carries no meaning, so they are lower-cased and sorted; values keep their spelling (a file name is
// data), without the white space around them.
function partForHash(part: Buffer): Buffer | undefined {
  let fields = '';
  let content: Buffer;
  if (part[0] === cr && part[1] === lf) {
    // No header fields at all: the blank line comes first.
    content = part.subarray(2);
  } else {
    const split = part.indexOf(headerEnd);
    if (split === -1) return undefined;
    const raw = part
      .subarray(0, split)
      .toString('latin1')
      .split('\r\n', maxFieldLines + 1);
    const lines = raw.length > maxFieldLines ? undefined : unfold(raw);
    if (lines === undefined) return undefined;
    const named: Array<[string, string]> = [];
    for (const line of lines) {
      const colon = line.indexOf(':');
      // A bare CR or LF inside a line would let one field pass for two in the joined form below.
      if (colon <= 0 || line.includes('\r') || line.includes('\n')) return undefined;
      named.push([trimBlanks(line.slice(0, colon)).toLowerCase(), trimBlanks(line.slice(colon + 1))]);
    }
    named.sort(byNameThenValue);
    fields = named.map(([name, value]) => `${name}:${value}\n`).join('');
    content = part.subarray(split + 4);
  }
  const head = Buffer.from(fields, 'latin1');
  return Buffer.concat([Buffer.from(`h${head.length}:`), head, Buffer.from(`c${content.length}:`), content]);
}

// A line that starts with white space continues the field before it (obsolete folding, which some
// clients still write for long file names). Undefined when the first line is such a continuation.
function unfold(lines: string[]): string[] | undefined {
  const out: string[] = [];
  for (const line of lines) {
    const continues = line.startsWith(' ') || line.startsWith('\t');
    if (continues && out.length === 0) return undefined;
    if (continues) out[out.length - 1] += ` ${trimBlanks(line)}`;
    else out.push(line);
  }
  return out;
}

// RFC 2046 §5.1.1: 1 to 70 characters from a fixed set, the last not a space; quoted or not.
const boundaryParameter = parameterPattern('boundary');
const boundaryCharacters = /^[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]$/;

/**
 * The `boundary` parameter of a `Content-Type`, unquoted, as given (empty or not one RFC 2046 allows
 * too), or undefined when there is none: whether there is one, as a multipart parser asks.
 *
 * @example
 * boundaryParameterOf('multipart/form-data; boundary="a b"'); // 'a b'
 */
export function boundaryParameterOf(contentType: string): string | undefined {
  return parameterOf(boundaryParameter, contentType);
}

// The boundary, when it is one RFC 2046 allows.
function boundaryOf(contentType: string): string | undefined {
  const value = boundaryParameterOf(contentType);
  return value !== undefined && boundaryCharacters.test(value) ? value : undefined;
}

// Reading a response head off a raw socket, byte for byte, for the tests of heads with characters
// U+0080..U+00FF (latin1-head*.test.ts): which bytes the status line and each header value went out
// as, so a first answer and its replay can be compared, and both against Latin-1.
import { frameRequest, type RawAnswer } from '@idem/testkit';

/** A reason phrase, a Location and a JSON body, each with characters U+0080..U+00FF. */
export const phrase = 'Créé ¤ ÿ';
export const location = '/charges/café';
export const body = '{"id":"ch_1","note":"é"}';

/** `text` as Latin-1 bytes (one per character). */
export const latin1 = (text: string) => Buffer.from(text, 'latin1');

/** A bodiless `POST /charges` with the key, as raw bytes, for `sendRaw`. */
export const request = (key: string) =>
  frameRequest(
    `POST /charges HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nIdempotency-Key: ${key}\r\n`,
    Buffer.alloc(0),
  ).bytes;

/** The head's bytes, up to the blank line. */
export function headOf(answer: RawAnswer): Buffer {
  return answer.raw.subarray(0, answer.raw.indexOf('\r\n\r\n'));
}

/** The status line's bytes. */
export function statusLine(answer: RawAnswer): Buffer {
  const head = headOf(answer);
  return head.subarray(0, head.indexOf('\r\n'));
}

// Each header field of the head: its lower-case name and its value's bytes, as sent.
function* fields(answer: RawAnswer): Generator<[string, Buffer]> {
  const head = headOf(answer);
  for (let at = head.indexOf('\r\n') + 2; at > 1 && at < head.length; ) {
    const next = head.indexOf('\r\n', at);
    const line = head.subarray(at, next === -1 ? head.length : next);
    const colon = line.indexOf(':');
    yield [line.subarray(0, colon).toString('latin1').toLowerCase(), line.subarray(colon + 1)];
    at = next === -1 ? head.length : next + 2;
  }
}

/** The bytes of one header's value (the first with that name), as sent. */
export function value(answer: RawAnswer, name: string): Buffer | undefined {
  for (const [field, bytes] of fields(answer)) if (field === name) return bytes;
  return undefined;
}

/**
 * Every value of a header, trimmed, as one list: Node sends each item of a list set on the response
 * as a field of its own, and a replay sends the list joined (the same field value, RFC 9110 5.3).
 */
export function joined(answer: RawAnswer, name: string): Buffer {
  const found: Buffer[] = [];
  for (const [field, bytes] of fields(answer)) {
    if (field !== name) continue;
    if (found.length > 0) found.push(Buffer.from(', '));
    found.push(latin1(bytes.toString('latin1').trim()));
  }
  return Buffer.concat(found);
}

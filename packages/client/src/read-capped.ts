/**
 * Thrown inside an attempt when the body runs past its limit.
 *
 * @example
 * if (error instanceof ResponseTooLarge) return { kind: 'too-large', response };
 */
export class ResponseTooLarge extends Error {}

/**
 * Reads a body into memory, but no further than `maxBytes`: past it, stops reading and throws
 * {@link ResponseTooLarge}.
 *
 * @example
 * const bytes = await readCapped(response, 16 * 2 ** 20);
 */
export async function readCapped(response: Response, maxBytes: number): Promise<Uint8Array> {
  // No body at all: the answer to a HEAD, a 204 or a 304 (fetch gives them a null body). Its
  // Content-Length is that of the representation (RFC 9110 8.6), which is not being sent: a HEAD that
  // asks the size of a large file, or a 304 that revalidates it, is no body over the limit.
  if (response.body === null) return new Uint8Array(0);
  if (maxBytes === Number.POSITIVE_INFINITY) return new Uint8Array(await response.arrayBuffer());
  // A declared length over the limit refuses the body unread. Not under a content coding: it counts
  // the coded bytes, and the decoded body, the one kept, may be shorter (then it fits); a longer one
  // is caught by the count below anyway. A browser shows a script only the headers a cross-origin
  // server exposed (type 'cors'), and Content-Encoding is not among those it shows unasked: there a
  // missing one proves nothing, and a gzipped body that fits was refused by its coded length.
  const declared = Number(response.headers.get('content-length') ?? Number.NaN);
  if (declared > maxBytes && response.type !== 'cors' && !response.headers.has('content-encoding')) {
    response.body?.cancel().catch(() => undefined);
    throw new ResponseTooLarge();
  }
  const reader = response.body.getReader();
  const chunks: Uint8Array[] = [];
  let total = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    total += value.byteLength;
    if (total > maxBytes) {
      reader.cancel().catch(() => undefined);
      throw new ResponseTooLarge();
    }
    chunks.push(value);
  }
  if (chunks.length === 1) return chunks[0] as Uint8Array;
  const bytes = new Uint8Array(total);
  let at = 0;
  for (const chunk of chunks) {
    bytes.set(chunk, at);
    at += chunk.byteLength;
  }
  return bytes;
}

import * as zlib from 'node:zlib';

type Decoder = (bytes: Uint8Array, options: { maxOutputLength: number }) => Buffer;

// zstd (RFC 8878) from Node 22.15 on, where body-parser 2.4 decodes it too. Read off the namespace:
// a named import of it would not even load on an older runtime, which leaves such a body as it came.
const zstdDecompressSync: Decoder | undefined = (zlib as Partial<typeof zlib>).zstdDecompressSync;

// The content codings Node can undo without a dependency (RFC 9110 section 8.4.1).
const decoders: Record<string, Decoder> = {
  gzip: zlib.gunzipSync,
  'x-gzip': zlib.gunzipSync,
  deflate: zlib.inflateSync,
  br: zlib.brotliDecompressSync,
  ...(zstdDecompressSync === undefined ? {} : { zstd: zstdDecompressSync }),
};

/**
 * The decoder of one content coding (`gzip`, `x-gzip`, `deflate`, `br`, and `zstd` where the
 * runtime has it; lower case), or undefined.
 * Pass `maxOutputLength`: a small compressed body can inflate without bound.
 *
 * @example
 * const bytes = decoderOf('gzip')?.(body, { maxOutputLength: 16_384 });
 */
export function decoderOf(coding: string): Decoder | undefined {
  return Object.hasOwn(decoders, coding) ? decoders[coding] : undefined;
}

/**
 * Whether a request's `Accept-Encoding` (RFC 9110 section 12.5.3) takes `coding`. A missing field
 * is read as compression middleware reads it (identity only), not as the RFC's "anything": a retry
 * from curl without `--compressed` must not be handed gzip bytes it never asked for. `x-gzip` and
 * `gzip` are one coding.
 *
 * @example
 * acceptsCoding('gzip, deflate;q=0.5', 'gzip'); // true
 * acceptsCoding('br;q=0, *', 'br'); // false
 */
export function acceptsCoding(acceptEncoding: string | undefined, coding: string): boolean {
  if (acceptEncoding === undefined) return false;
  const wanted = coding === 'x-gzip' ? 'gzip' : coding;
  let wildcard: boolean | undefined;
  for (const entry of acceptEncoding.split(',')) {
    const [rawName = '', ...params] = entry.split(';');
    let name = rawName.trim().toLowerCase();
    if (name === 'x-gzip') name = 'gzip';
    if (name !== wanted && name !== '*') continue;
    let accepted = true;
    for (const param of params) {
      const [rawKey = '', rawValue = ''] = param.split('=');
      if (rawKey.trim().toLowerCase() === 'q') accepted = Number(rawValue.trim()) > 0;
    }
    // An explicit entry for the coding wins over the wildcard, whatever their order.
    if (name === wanted) return accepted;
    wildcard = accepted;
  }
  return wildcard === true;
}

/**
 * A stored response as this request can read it. A body stored compressed (compression inside
 * the idempotency layer, or a handler that compresses itself) was negotiated with the first
 * request's `Accept-Encoding`; a retry that does not take that coding gets the decoded body with
 * no `Content-Encoding`, and a strong `ETag` made weak, since the bytes are no longer the ones it
 * tagged. Decoded up to `maxBytes`. A coding Node cannot undo, a list of codings, or a body that
 * does not decode is served as stored: the status quo, never a failed replay.
 */
export function negotiatedBody(
  headers: Record<string, string>,
  body: Uint8Array,
  acceptEncoding: string | undefined,
  maxBytes: number,
): { headers: Record<string, string>; body: Uint8Array } | undefined {
  const stored = headers['content-encoding'];
  if (stored === undefined) return undefined;
  const coding = stored.trim().toLowerCase();
  if (coding === 'identity' || acceptsCoding(acceptEncoding, coding)) return undefined;
  const decode = decoderOf(coding);
  if (decode === undefined) return undefined;
  let decoded: Buffer;
  try {
    decoded = decode(body, { maxOutputLength: maxBytes });
  } catch {
    return undefined;
  }
  const out: Record<string, string> = {};
  for (const name of Object.keys(headers)) {
    if (name === 'content-encoding') continue;
    const value = headers[name] as string;
    out[name] = name === 'etag' && !value.startsWith('W/') ? `W/${value}` : value;
  }
  return { headers: out, body: decoded };
}

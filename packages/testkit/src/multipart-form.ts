import { Buffer } from 'node:buffer';

/**
 * A multipart/form-data body (RFC 7578) under `boundary`: a text field `note` and a file part
 * `receipt` holding `file`, with the `Content-Type` that names the boundary. For tests that send an
 * upload through a framework's multipart parser (multer, koa-body) or fingerprint one.
 *
 * @example
 * const { body, contentType } = multipartForm('----idemBoundaryA1', Buffer.alloc(500, 7));
 * // fetch's types take no Buffer (its memory may be shared): hand it the bytes as a Uint8Array.
 * await fetch(url, { method: 'POST', headers: { 'content-type': contentType }, body: new Uint8Array(body) });
 */
export function multipartForm(boundary: string, file: Buffer, note = 'hello ✓'): { body: Buffer; contentType: string } {
  const body = Buffer.concat([
    Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="note"\r\n\r\n${note}\r\n`),
    Buffer.from(
      `--${boundary}\r\nContent-Disposition: form-data; name="receipt"; filename="receipt.bin"\r\n` +
        'Content-Type: application/octet-stream\r\n\r\n',
    ),
    file,
    Buffer.from(`\r\n--${boundary}--\r\n`),
  ]);
  return { body, contentType: `multipart/form-data; boundary=${boundary}` };
}

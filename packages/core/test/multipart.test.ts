import { describe, expect, it } from 'vitest';
import { fingerprintRequest } from '../src/fingerprint.js';
import { canonicalMultipart } from '../src/multipart.js';

// A form as a client serialises it: the same parts under whatever boundary it picked this time.
function form(boundary: string, parts: Array<{ headers: string[]; content: string | Buffer }>, extra = {}) {
  const { preamble = '', epilogue = '', padding = '' } = extra as Record<string, string>;
  const chunks: Buffer[] = [Buffer.from(preamble === '' ? '' : `${preamble}\r\n`)];
  for (const part of parts) {
    chunks.push(Buffer.from(`--${boundary}${padding}\r\n${part.headers.map((h) => `${h}\r\n`).join('')}\r\n`));
    chunks.push(typeof part.content === 'string' ? Buffer.from(part.content) : part.content);
    chunks.push(Buffer.from('\r\n'));
  }
  chunks.push(Buffer.from(`--${boundary}--${padding}${epilogue === '' ? '\r\n' : `\r\n${epilogue}`}`));
  return Buffer.concat(chunks);
}

const upload = [
  { headers: ['Content-Disposition: form-data; name="amount"'], content: '1000' },
  {
    headers: ['Content-Disposition: form-data; name="receipt"; filename="r.png"', 'Content-Type: image/png'],
    content: Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0xff]),
  },
];

const base = { method: 'POST', route: '/uploads', path: '/uploads' };
const fp = (boundary: string, body: Buffer, type = 'multipart/form-data') =>
  fingerprintRequest({ ...base, contentType: `${type}; boundary=${boundary}`, body });

describe('multipart fingerprint (case 20)', () => {
  it('is the same for the same parts under another boundary, as a retry of fetch(FormData) sends them', () => {
    const first = fp('----formdata-undici-0123456789', form('----formdata-undici-0123456789', upload));
    expect(fp('----WebKitFormBoundaryAbC123', form('----WebKitFormBoundaryAbC123', upload))).toBe(first);
    // A quoted boundary parameter, and header names in another case or order, are the same form.
    const quoted = fingerprintRequest({
      ...base,
      contentType: 'multipart/form-data; boundary="q b"',
      body: form('q b', [
        { headers: ['content-disposition: form-data; name="amount"'], content: '1000' },
        {
          headers: ['content-type:image/png', 'CONTENT-DISPOSITION:  form-data; name="receipt"; filename="r.png"'],
          content: upload[1]!.content,
        },
      ]),
    });
    expect(quoted).toBe(first);
    // Preamble, epilogue and transport padding carry nothing (RFC 2046).
    expect(
      fp('b1', form('b1', upload, { preamble: 'This is a multipart message.', epilogue: 'bye', padding: ' \t' })),
    ).toBe(first);
  });

  it('tells apart forms whose parts differ in content, name, file name, type, order or count', () => {
    const first = fp('b', form('b', upload));
    const changed = (index: number, part: { headers: string[]; content: string | Buffer }) =>
      fp(
        'b',
        form(
          'b',
          upload.map((p, i) => (i === index ? part : p)),
        ),
      );
    expect(changed(0, { ...upload[0]!, content: '1001' })).not.toBe(first);
    expect(changed(0, { ...upload[0]!, headers: ['Content-Disposition: form-data; name="total"'] })).not.toBe(first);
    expect(
      changed(1, {
        ...upload[1]!,
        headers: ['Content-Disposition: form-data; name="receipt"; filename="R.png"', 'Content-Type: image/png'],
      }),
    ).not.toBe(first);
    expect(
      changed(1, {
        ...upload[1]!,
        headers: ['Content-Disposition: form-data; name="receipt"; filename="r.png"', 'Content-Type: image/jpeg'],
      }),
    ).not.toBe(first);
    expect(fp('b', form('b', [upload[1]!, upload[0]!]))).not.toBe(first);
    expect(fp('b', form('b', [upload[0]!]))).not.toBe(first);
    // Content that spells a part boundary of the framing cannot shift bytes between parts.
    const a = fp(
      'b',
      form('b', [
        { headers: ['X: 1'], content: 'ab' },
        { headers: ['X: 1'], content: 'c' },
      ]),
    );
    const b = fp(
      'b',
      form('b', [
        { headers: ['X: 1'], content: 'a' },
        { headers: ['X: 1'], content: 'bc' },
      ]),
    );
    expect(a).not.toBe(b);
  });

  it('is not mistaken for another media type carrying the same parts', () => {
    expect(fp('b', form('b', upload), 'multipart/mixed')).not.toBe(fp('b', form('b', upload)));
  });

  it('hashes the bytes of a body that is not well-formed multipart under its boundary', () => {
    const body = form('b', upload);
    expect(canonicalMultipart(body, 'multipart/form-data')).toBeUndefined(); // no boundary
    expect(canonicalMultipart(body, 'multipart/form-data; boundary=other')).toBeUndefined();
    expect(canonicalMultipart(body.subarray(0, body.length - 8), 'multipart/form-data; boundary=b')).toBeUndefined(); // no close delimiter
    expect(
      canonicalMultipart(Buffer.from('--b\r\nno blank line\r\n--b--'), 'multipart/form-data; boundary=b'),
    ).toBeUndefined();
    expect(
      canonicalMultipart(Buffer.from('--b junk\r\n\r\nx\r\n--b--'), 'multipart/form-data; boundary=b'),
    ).toBeUndefined();
    expect(canonicalMultipart(body, `multipart/form-data; boundary=${'x'.repeat(71)}`)).toBeUndefined(); // too long
    // Then the bytes are the identity: the same malformed body twice is one request, two are two.
    const malformed = Buffer.from('--b\r\nno blank line\r\n--b--');
    expect(fp('b', malformed)).toBe(fp('b', Buffer.from(malformed)));
    expect(fp('b', malformed)).not.toBe(fp('b', Buffer.from('--b\r\nother line\r\n--b--')));
  });

  it('reads a part without header fields, an empty form, and folded header lines', () => {
    const bare = canonicalMultipart(Buffer.from('--b\r\n\r\nhello\r\n--b--'), 'multipart/form-data; boundary=b');
    expect(bare?.toString()).toBe('multipart:h0:c5:hello');
    expect(canonicalMultipart(Buffer.from('--b--\r\n'), 'multipart/form-data; boundary=b')?.toString()).toBe(
      'multipart:',
    );
    const folded = canonicalMultipart(
      Buffer.from('--b\r\nContent-Disposition: form-data;\r\n name="a"\r\n\r\n1\r\n--b--'),
      'multipart/form-data; boundary=b',
    );
    expect(folded?.toString()).toBe('multipart:h40:content-disposition:form-data; name="a"\nc1:1');
  });
});

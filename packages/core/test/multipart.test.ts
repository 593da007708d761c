import { describe, expect, it } from 'vitest';
import { fingerprintRequest } from '../src/fingerprint.js';
import {
  canonicalMultipart,
  malformedPartHeader,
  maxFieldLines,
  maxPartHeaderBytes,
  maxParts,
} from '../src/multipart.js';

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
    // A boundary over RFC 2046's 70 characters is refused whole, never cut short: cut, its first 70
    // characters followed by `--` would read as the closing delimiter, and every form as an empty one.
    const long = `${'a'.repeat(70)}--zz`;
    expect(canonicalMultipart(form(long, upload), `multipart/form-data; boundary=${long}`)).toBeUndefined();
    expect(canonicalMultipart(form(long, upload), `multipart/form-data; boundary="${long}"`)).toBeUndefined();
    const other = form(long, [{ ...upload[0]!, content: '999' }, upload[1]!]);
    expect(fp(long, other)).not.toBe(fp(long, form(long, upload)));
    // Then the bytes are the identity: the same malformed body twice is one request, two are two.
    const malformed = Buffer.from('--b\r\nno blank line\r\n--b--');
    expect(fp('b', malformed)).toBe(fp('b', Buffer.from(malformed)));
    expect(fp('b', malformed)).not.toBe(fp('b', Buffer.from('--b\r\nother line\r\n--b--')));
  });

  it('reads a part without header fields, an empty form, and folded header lines', () => {
    const bare = canonicalMultipart(Buffer.from('--b\r\n\r\nhello\r\n--b--'), 'multipart/form-data; boundary=b');
    expect(bare?.toString()).toBe('h0:c5:hello');
    expect(canonicalMultipart(Buffer.from('--b--\r\n'), 'multipart/form-data; boundary=b')?.toString()).toBe('');
    // An empty preamble: the body opens with the line break before the first delimiter.
    const opening = Buffer.from('\r\n--b\r\n\r\nhello\r\n--b--');
    expect(canonicalMultipart(opening, 'multipart/form-data; boundary=b')?.toString()).toBe('h0:c5:hello');
    const folded = canonicalMultipart(
      Buffer.from('--b\r\nContent-Disposition: form-data;\r\n name="a"\r\n\r\n1\r\n--b--'),
      'multipart/form-data; boundary=b',
    );
    expect(folded?.toString()).toBe('h40:content-disposition:form-data; name="a"\nc1:1');
  });

  it('refuses what would make two forms one: a bare line break in a field, a raw body spelling a canonical form', () => {
    const type = 'multipart/form-data; boundary=b';
    const folded = Buffer.from('--b\r\nContent-Disposition: form-data; name="a"\nx-y:z\r\n\r\n1\r\n--b--');
    expect(canonicalMultipart(folded, type)).toBeUndefined();
    expect(fp('b', folded)).not.toBe(
      fp('b', Buffer.from('--b\r\nContent-Disposition: form-data; name="a"\r\nx-y: z\r\n\r\n1\r\n--b--')),
    );
    // A malformed body (hashed as bytes) whose bytes are another form's canonical form.
    const canonical = canonicalMultipart(form('b', upload), type) as Buffer;
    expect(canonicalMultipart(canonical, type)).toBeUndefined();
    expect(fp('b', canonical)).not.toBe(fp('b', form('b', upload)));
    // Only spaces and tabs are trimmed: 0xA0 ends a value as data.
    const named = (tail: string) =>
      Buffer.from(`--b\r\nContent-Disposition: form-data; name="a"${tail}\r\n\r\n1\r\n--b--`, 'latin1');
    expect(fp('b', named('\u00a0'))).not.toBe(fp('b', named('')));
  });

  it(`reads at most ${maxParts} parts and ${maxFieldLines} header lines in a part, then hashes the bytes`, () => {
    const type = 'multipart/form-data; boundary=b';
    const parts = (count: number) =>
      form(
        'b',
        Array.from({ length: count }, () => ({ headers: [], content: 'x' })),
      );
    expect(canonicalMultipart(parts(maxParts), type)).toBeDefined();
    expect(canonicalMultipart(parts(maxParts + 1), type)).toBeUndefined();
    const lines = (count: number) =>
      form('b', [{ headers: Array.from({ length: count }, (_, i) => `X-${i}: ${i}`), content: 'x' }]);
    expect(canonicalMultipart(lines(maxFieldLines), type)).toBeDefined();
    expect(canonicalMultipart(lines(maxFieldLines + 1), type)).toBeUndefined();
    // A body of many tiny parts is still one request with itself (its bytes), and another with others.
    expect(fp('b', parts(maxParts + 1))).toBe(fp('b', parts(maxParts + 1)));
  });

  it('takes a boundary of up to 70 characters (RFC 2046), not 71', () => {
    for (const [length, readable] of [
      [70, true],
      [71, false],
    ] as const) {
      const boundary = 'a'.repeat(length);
      const read = canonicalMultipart(form(boundary, upload), `multipart/form-data; boundary=${boundary}`);
      expect(read !== undefined, `${length} characters`).toBe(readable);
    }
  });

  it('refuses a header line without a field name', () => {
    const body = Buffer.from('--b\r\n: x\r\n\r\n1\r\n--b--');
    expect(canonicalMultipart(body, 'multipart/form-data; boundary=b')).toBeUndefined();
  });
});

describe('malformedPartHeader: a part header a multipart parser refuses', () => {
  const type = 'multipart/form-data; boundary=b';
  const withHeaders = (...headers: string[]) => form('b', [...upload, { headers, content: 'x' }]);

  it('is false for well-formed forms: fields, files, no header fields, folded lines, obs-text, many parts', () => {
    expect(malformedPartHeader(form('b', upload), type)).toBe(false);
    expect(malformedPartHeader(withHeaders(), type)).toBe(false);
    expect(malformedPartHeader(withHeaders('Content-Disposition: form-data;', '\tname="a"'), type)).toBe(false);
    expect(malformedPartHeader(withHeaders('Content-Disposition: form-data; name="\u00e9"'), type)).toBe(false);
    expect(malformedPartHeader(withHeaders('X-Empty:'), type)).toBe(false);
    const many = form(
      'b',
      Array.from({ length: maxParts + 1 }, () => ({ headers: ['A: 1'], content: 'x' })),
    );
    expect(malformedPartHeader(many, type)).toBe(false);
  });

  it('is true for a line without a colon, an empty or non-token name, a control character, a folded first line', () => {
    for (const bad of [
      ['Content-Disposition form-data; name="a"'],
      [': form-data'],
      ['Content Disposition: form-data'],
      ['Content-Disposition(x): form-data'],
      ['Content-Disposition: form-data; name="a\u0000"'],
      ['Content-Disposition: form-data; name="a\u007f"'],
      [' Content-Disposition: form-data'],
    ]) {
      expect(malformedPartHeader(withHeaders(...bad), type), JSON.stringify(bad)).toBe(true);
    }
    // A bare CR or LF inside a line.
    expect(malformedPartHeader(withHeaders('A: 1\rB: 2'), type)).toBe(true);
    expect(malformedPartHeader(withHeaders('A: 1\nB: 2'), type)).toBe(true);
  });

  it(`is true for a header section over ${maxPartHeaderBytes} bytes, its blank line counted`, () => {
    const line = (length: number) => `X: ${'a'.repeat(length - 'X: '.length - 4)}`;
    expect(malformedPartHeader(withHeaders(line(maxPartHeaderBytes)), type)).toBe(false);
    expect(malformedPartHeader(withHeaders(line(maxPartHeaderBytes + 1)), type)).toBe(true);
  });

  it('walks the body as busboy does: what it reads without that error is never malformed here', () => {
    const part = 'Content-Disposition: form-data; name="a"\r\n\r\n1\r\n';
    const well = [
      // Two delimiters in a row: the line break after the first begins the second, no part between.
      '--x\r\n--x--\r\n',
      `--x\r\n--x\r\n${part}--x--\r\n`,
      // `--x` followed by more than a line break is no delimiter: what follows is content.
      `--x \r\nnot a header line\r\n\r\njunk\r\n--x\r\n${part}--x--\r\n`,
      `--x\r\n${part}--xy\r\nno colon\r\n\r\n\r\n--x--\r\n`,
      // A body cut inside a header section, or one with no blank line before the next delimiter:
      // the parser's complaint is another (the end of the form), or it reads on into the next part.
      `--x\r\nContent-Disposition: form`,
      `--x\r\nA: 1\r\n--x\r\n${part}--x--\r\n`,
    ];
    for (const body of well) {
      expect(malformedPartHeader(Buffer.from(body), 'multipart/form-data; boundary=x'), JSON.stringify(body)).toBe(
        false,
      );
    }
    // A section with no blank line within the limit is refused whatever it holds.
    expect(
      malformedPartHeader(
        Buffer.from(`--x\r\nA: ${'a'.repeat(maxPartHeaderBytes)}`),
        'multipart/form-data; boundary=x',
      ),
    ).toBe(true);
    // The body may open with its first delimiter, or after a preamble line.
    expect(
      malformedPartHeader(
        Buffer.from('preamble\r\n--x\r\nno colon\r\n\r\n1\r\n--x--'),
        'multipart/form-data; boundary=x',
      ),
    ).toBe(true);
    expect(
      malformedPartHeader(Buffer.from('preamble--x\r\nno colon\r\n\r\n1\r\n--x--'), 'multipart/form-data; boundary=x'),
    ).toBe(false);
  });

  it("is false for a Content-Type naming two boundaries, or one inside another parameter's quotes", () => {
    const bad = Buffer.from('--x\r\nno colon\r\n\r\n1\r\n--x--\r\n');
    expect(malformedPartHeader(bad, 'multipart/form-data; boundary=x')).toBe(true);
    expect(malformedPartHeader(bad, 'multipart/form-data; note="; boundary=x"; boundary=y')).toBe(false);
    expect(malformedPartHeader(bad, 'multipart/form-data; boundary=x; boundary=x')).toBe(false);
  });

  it('is false when the body is not delimited by the boundary its Content-Type names, or names none', () => {
    const bad = withHeaders('no colon');
    expect(malformedPartHeader(bad, 'multipart/form-data; boundary=c')).toBe(false);
    expect(malformedPartHeader(bad, 'multipart/form-data')).toBe(false);
    expect(malformedPartHeader(bad, 'multipart/form-data; boundary="b"')).toBe(true);
    expect(malformedPartHeader(Buffer.from('--b\r\nno colon\r\n\r\n'), type)).toBe(true);
    expect(malformedPartHeader(Buffer.from('--bx\r\nno colon\r\n\r\n--b--'), type)).toBe(false);
  });
});

// Mutation audit: the edges of malformedPartHeader's walk and field-line grammar that the cases
// above leave open, each one a way busboy reads a body that a small slip here would misjudge.
describe('malformedPartHeader: the edges of the walk and of the field-line grammar', () => {
  const type = 'multipart/form-data; boundary=b';
  const withHeaders = (...headers: string[]) => form('b', [...upload, { headers, content: 'x' }]);
  const badPart = 'no colon\r\n\r\n1\r\n';

  it('is false for a boundary that names no boundary RFC 2046 allows, or one repeated in another case or spacing', () => {
    const long = 'a'.repeat(71);
    expect(
      malformedPartHeader(Buffer.from(`--${long}\r\n${badPart}--${long}--`), `multipart/form-data; boundary=${long}`),
    ).toBe(false);
    const bad = Buffer.from(`--x\r\n${badPart}--x--\r\n`);
    expect(malformedPartHeader(bad, 'multipart/form-data; boundary=x; boundary =x')).toBe(false);
    expect(malformedPartHeader(bad, 'multipart/form-data; boundary=x; BOUNDARY=x')).toBe(false);
  });

  it('takes `--b` followed by anything but `--` or CRLF as content, and stops at the close delimiter', () => {
    for (const [body, malformed] of [
      // Not delimiters: the walk goes on to the part after them.
      [`--b-a\r\n--b\r\n${badPart}--b--`, true],
      [`--ba-\r\n--b\r\n${badPart}--b--`, true],
      // Half a line break after `--b` is no delimiter line either: what follows is no header section.
      [`--b\r!${badPart}--b--`, false],
      [`--b!\n${badPart}--b--`, false],
      // The epilogue after the close delimiter is not read, whatever it spells.
      [`--b\r\nA: 1\r\n\r\n1\r\n--b--\r\n--b\r\n${badPart}`, false],
    ] as const) {
      expect(malformedPartHeader(Buffer.from(body), type), JSON.stringify(body)).toBe(malformed);
    }
  });

  it('a part with no header fields is content from its blank line on, however long and whatever it holds', () => {
    expect(malformedPartHeader(form('b', [{ headers: [], content: 'a'.repeat(maxPartHeaderBytes * 2) }]), type)).toBe(
      false,
    );
    expect(malformedPartHeader(form('b', [{ headers: [], content: '\r\nno colon\r\n\r\n' }]), type)).toBe(false);
    // A bare CR or LF at the start is no blank line.
    expect(malformedPartHeader(withHeaders('\rA: 1'), type)).toBe(true);
    expect(malformedPartHeader(withHeaders('A\nB: 1'), type)).toBe(true);
  });

  it(`is ${maxPartHeaderBytes} bytes (16 KiB, busboy's limit): a section cut short at that length is not over it`, () => {
    expect(maxPartHeaderBytes).toBe(16 * 1024);
    const cut = (length: number) => Buffer.from(`--b\r\nA: ${'a'.repeat(length - 3)}`);
    expect(malformedPartHeader(cut(maxPartHeaderBytes), type)).toBe(false);
    expect(malformedPartHeader(cut(maxPartHeaderBytes + 1), type)).toBe(true);
  });

  it('field values take tabs and obs-text read as bytes; names take every tchar, and no space before the colon', () => {
    expect(malformedPartHeader(withHeaders('X-Note:\tvalue'), type)).toBe(false);
    expect(malformedPartHeader(withHeaders("X!#$%&'*+.^_`|~: 1"), type)).toBe(false);
    expect(malformedPartHeader(withHeaders('X-Note : value'), type)).toBe(true);
    // Bytes that are no UTF-8 (a latin1 file name) and characters beyond latin1 are obs-text alike.
    const latin1 = Buffer.from('--b\r\nContent-Disposition: form-data; name="caf\u00e9"\r\n\r\n1\r\n--b--', 'latin1');
    expect(malformedPartHeader(latin1, type)).toBe(false);
    expect(malformedPartHeader(withHeaders('Content-Disposition: form-data; name="\u20ac"'), type)).toBe(false);
  });

  it('a continuation line starts with a space or a tab, and is a value of visible characters to its end', () => {
    expect(malformedPartHeader(withHeaders('Content-Disposition: form-data;', ' name="a"'), type)).toBe(false);
    expect(malformedPartHeader(withHeaders('Content-Disposition: form-data;', ' name="\u00e9"'), type)).toBe(false);
    expect(malformedPartHeader(withHeaders('Content-Disposition: form-data;', ' name="a"\u0000'), type)).toBe(true);
    // A second line that is no field line and no continuation is malformed, as a first one is.
    expect(malformedPartHeader(withHeaders('A: 1', 'no colon'), type)).toBe(true);
  });
});

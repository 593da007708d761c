// An HTTP/2 response has no reason phrase, and Node's compatibility `Http2ServerResponse` says so
// when its `statusMessage` is read: the first read in a process emits an `UnsupportedWarning`
// ("Status message is not supported by HTTP/2"). idem never sends or stores a phrase over HTTP/2,
// so it must not read one there either: an app serving HTTP/2 would otherwise get that warning on
// its first keyed response, from a read of ours, and one run with `--throw-deprecation`-style
// warning handlers (or a test that asserts a clean stderr) would fail.
import http2 from 'node:http2';
import type { AddressInfo } from 'node:net';
import { expect, it } from 'vitest';
import { ownReasonPhrase } from '../src/index.js';

it('ownReasonPhrase over HTTP/2: undefined, without reading the response statusMessage (Node warns on that read)', async () => {
  const reads: string[] = [];
  let answer: string | undefined = 'unset';
  const server = http2.createServer((_req, res) => {
    // A spy in place of Node's getter, which would warn once per process and so could not be
    // asserted on reliably.
    Object.defineProperty(res, 'statusMessage', {
      configurable: true,
      get() {
        reads.push('statusMessage');
        return '';
      },
    });
    res.statusCode = 201;
    answer = ownReasonPhrase(res as never, 201);
    res.end('created');
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const session = http2.connect(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  try {
    await new Promise<void>((resolve, reject) => {
      const stream = session.request({ ':path': '/' });
      stream.resume();
      stream.on('end', resolve);
      stream.on('error', reject);
      stream.end();
    });
    expect(answer).toBeUndefined();
    // Was wrong: read before the check for HTTP/2, so Node's warning fired on the first keyed answer.
    expect(reads).toEqual([]);
  } finally {
    session.destroy();
    await new Promise((resolve) => server.close(resolve));
  }
});

import type http2 from 'node:http2';

/** What an HTTP/2 client got back: its status, headers and body as text. */
export interface H2Answer {
  status: number;
  headers: http2.IncomingHttpHeaders;
  body: string;
}

/** Sends POST /charges with `headers` and `body` on an HTTP/2 session, and reads the whole answer. */
export function h2post(
  session: http2.ClientHttp2Session,
  headers: Record<string, string>,
  body: string,
): Promise<H2Answer> {
  return new Promise((resolve, reject) => {
    const stream = session.request({ ':method': 'POST', ':path': '/charges', ...headers });
    let head: http2.IncomingHttpHeaders = {};
    let text = '';
    stream.setEncoding('utf8');
    stream.on('response', (received) => {
      head = received;
    });
    stream.on('data', (chunk: string) => {
      text += chunk;
    });
    stream.on('end', () => resolve({ status: Number(head[':status']), headers: head, body: text }));
    stream.on('error', reject);
    stream.end(body);
  });
}

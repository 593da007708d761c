// An empty body sent chunked, for the adapters' tests of it (packages/*/test/empty-chunked-body.test.ts).
import { connect } from 'node:net';

/**
 * The status line and body of the answer to an empty chunked POST /notes, its last chunk sent in the
 * packet of its head or `later`, in a packet of its own.
 */
export function postEmptyChunked(port: number, key: string, later: boolean): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host: '127.0.0.1', port });
    let answer = '';
    socket.on('data', (chunk: Buffer) => {
      answer += chunk.toString('latin1');
    });
    socket.on('end', () => {
      const [head = '', body = ''] = answer.split('\r\n\r\n');
      resolve(`${head.split('\r\n')[0]} ${body}`);
    });
    socket.on('error', reject);
    const head =
      `POST /notes HTTP/1.1\r\nHost: x\r\nConnection: close\r\nIdempotency-Key: ${key}\r\n` +
      'Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n';
    if (!later) socket.write(`${head}0\r\n\r\n`);
    else {
      socket.write(head);
      setTimeout(() => socket.write('0\r\n\r\n'), 20);
    }
  });
}

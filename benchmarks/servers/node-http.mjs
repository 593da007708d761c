// The limit every framework is measured against: node:http alone, parsing the JSON body and answering
// the same 201 as the /charges routes (research/perf-limits.md row 12).
import { createServer } from 'node:http';
import { nodeServer } from './charges.mjs';

/**
 * Starts the bare node:http POST /charges server on an ephemeral loopback port.
 *
 * @example
 * const { port, close } = await startNodeHttp();
 */
export async function startNodeHttp() {
  let count = 0;
  const server = createServer((req, res) => {
    const chunks = [];
    req.on('data', (chunk) => chunks.push(chunk));
    req.on('end', () => {
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8') || '{}');
      const answer = JSON.stringify({
        id: `ch_${++count}`,
        amount: body.amount ?? 0,
        currency: 'usd',
        status: 'succeeded',
      });
      res.writeHead(201, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(answer) });
      res.end(answer);
    });
  });
  return nodeServer(server.listen(0, '127.0.0.1'));
}

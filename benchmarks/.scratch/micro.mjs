// Isolated cost of idem's HTTP layer per fresh request: begin (parsed JSON body) + capture + end + complete.
import { IncomingMessage, ServerResponse } from 'node:http';
import { Socket } from 'node:net';
import { createHttpIdempotency, memoryStore } from '@idem/core';

const body = { amount: 1000, currency: 'usd', source: 'tok_visa', description: 'perf test charge', metadata: { order_id: 'ord_123' } };
const payload = JSON.stringify({ id: 'ch_1', amount: 1000, currency: 'usd', status: 'succeeded' });
const http = createHttpIdempotency({ store: memoryStore({ maxEntries: Number(process.env.MAX ?? 100000) }), scope: () => 'bench-caller' });
const mode = process.argv[2] ?? 'fresh';
let n = 0;
function fakeRes() {
  const req = new IncomingMessage(new Socket());
  req.method = 'POST';
  const res = new ServerResponse(req);
  return res;
}
async function one(i) {
  const res = fakeRes();
  const key = mode === 'replay' ? 'replay-key' : `k-${i}-abcdefabcdefabcdef`;
  if (mode === 'bare') { res.statusCode = 201; res.setHeader('content-type', 'application/json'); res.end(payload); return; }
  const started = await http.begin({ method: 'POST', route: '/charges', path: '/charges', query: '', contentType: 'application/json', keyHeader: key, body: undefined, json: body, scope: 'bench-caller' });
  if (started.kind === 'execute') {
    res.setHeader('idempotency-key', started.echo);
    http.capture(res, { settle: { lease: started.lease, thrown: () => false } });
    res.statusCode = 201; res.setHeader('content-type', 'application/json'); res.end(payload);
  } else if (started.kind === 'respond') {
    res.writeHead(started.response.status, started.response.headers); res.end(Buffer.from(started.response.body));
  }
}
if (mode === 'replay') { await one(0); }
for (let i = 0; i < 50000; i++) await one(i);
for (let r = 0; r < 5; r++) {
  const t = process.hrtime.bigint(); const c0 = process.cpuUsage();
  const N = 200000;
  for (let i = 0; i < N; i++) await one(r * N + i + 100000);
  const ns = Number(process.hrtime.bigint() - t) / N; const c = process.cpuUsage(c0);
  console.log(mode, (ns / 1000).toFixed(2), 'µs/op wall', ((c.user + c.system) / N).toFixed(2), 'µs/op cpu');
}

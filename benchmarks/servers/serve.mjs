// Child process entry for one server under test: `spec` (JSON in argv[2]) says which; the port goes
// to the parent over IPC, 'cpu' asks for the CPU time it used so far, and 'stop' closes the server
// and deletes what it stored.
import { answerCpuQueries, onStop, receiveSpec, reportFailure } from '../lib/child-process.mjs';
import { startCharges } from './charges.mjs';
import { startGuarded } from './guarded.mjs';
import { startNodeHttp } from './node-http.mjs';
import { startReferenceApp } from './reference-app.mjs';

const spec = await receiveSpec();
const starters = {
  charges: startCharges,
  guarded: startGuarded,
  'node-http': startNodeHttp,
  'reference-app': startReferenceApp,
};

try {
  const start = starters[spec.kind];
  if (!start) throw new TypeError(`unknown server kind ${spec.kind}`);
  const server = await start(spec);
  onStop(server.close);
  answerCpuQueries();
  process.send({ port: Number(server.port), ...(server.bearer ? { bearer: server.bearer } : {}) });
} catch (error) {
  reportFailure(error);
}

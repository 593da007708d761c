import { describeAdapter } from '@idem/testkit';
import { makeFastifyServer } from './server.js';

describeAdapter('fastify', makeFastifyServer);

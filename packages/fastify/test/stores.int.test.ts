import { describeOnRealStores } from '../../express/test/real-stores.js';
import { makeFastifyServer } from './server.js';

await describeOnRealStores('fastify', makeFastifyServer);

import { describeOnRealStores } from '../../express/test/real-stores.js';
import { makeKoaServer } from './server.js';

await describeOnRealStores('koa', makeKoaServer);

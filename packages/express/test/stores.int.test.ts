import { describeOnRealStores } from './real-stores.js';
import { makeExpressServer } from './server.js';

await describeOnRealStores('express', makeExpressServer);

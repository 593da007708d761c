import { describeAdapter } from '@idem/testkit';
import { makeKoaServer } from './server.js';

describeAdapter('koa', makeKoaServer);

import { describeAdapter } from '@idem/testkit';
import { makeExpressServer } from './server.js';

describeAdapter('express', makeExpressServer);

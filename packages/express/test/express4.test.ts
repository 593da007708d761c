// The same scenario table on Express 4 (installed as `express4`, an alias of express@4): the
// middleware uses nothing Express 4 lacks, and this proves it.
import { createRequire } from 'node:module';
import { describeAdapter } from '@idem/testkit';
import { type ExpressFactory, makeExpressServer } from './server.js';

const { version } = createRequire(import.meta.url)('express4/package.json') as { version: string };
if (!version.startsWith('4.')) throw new Error(`the express4 alias resolves to express ${version}`);

// Imported by a name TypeScript does not resolve: the alias has no types of its own, and its API is
// the one typed for Express 5 as far as these tests use it.
const express4 = (await import('express4' as string)).default as ExpressFactory;

describeAdapter(`express ${version}`, (options) => makeExpressServer(options, express4));

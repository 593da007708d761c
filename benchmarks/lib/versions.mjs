// The versions of what was measured, read from the installed package.json files (some packages'
// export maps hide package.json from `require.resolve`, so the files are read directly).
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

/** The packages whose versions a results file records. */
export const measuredPackages = [
  'express',
  'fastify',
  'koa',
  'ioredis',
  'redis',
  'pg',
  'jose',
  'autocannon',
  'express-idempotency',
  'express-idempotency-redis-adapter',
  '@node-idempotency/core',
  '@node-idempotency/storage-adapter-redis',
  '@aws-lambda-powertools/idempotency',
  '@fastify/jwt',
  'express-oauth2-jwt-bearer',
  'express-jwt',
  'jwks-rsa',
];

/**
 * `{ name: version }` for every measured package found under the root's or the bench workspace's
 * node_modules; a package that is not installed is left out.
 *
 * @example
 * installedVersions('/repo'); // { express: '5.1.0', fastify: '5.6.1', ... }
 */
export function installedVersions(root) {
  const versions = {};
  for (const name of measuredPackages) {
    for (const folder of [join(root, 'benchmarks', 'node_modules'), join(root, 'node_modules')]) {
      const file = join(folder, name, 'package.json');
      if (!existsSync(file)) continue;
      versions[name] = JSON.parse(readFileSync(file, 'utf8')).version;
      break;
    }
  }
  return versions;
}

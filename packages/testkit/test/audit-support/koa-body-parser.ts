import type { Middleware } from 'koa';

// Loaded by a name the compiler does not follow: @koa/bodyparser's type declarations, once in the
// program, turn Express's `req.body` into `unknown` for every Express file of the repository.
const moduleName: string = '@koa/bodyparser';

/** @koa/bodyparser's middleware factory, typed as far as these tests use it. */
export const bodyParser = ((await import(moduleName)) as { default: (options?: Record<string, unknown>) => Middleware })
  .default;

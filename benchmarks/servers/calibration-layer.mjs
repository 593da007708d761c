// A layer that costs a known amount, mounted where idem is: it spins for a fixed number of
// microseconds per request and does nothing else. Measured beside the bare route, it shows what that
// much added server work does to a throughput ratio on the machine of the run, which is more than
// the work's share of a request's CPU time: the load generator shares the cores and sleeps more often
// behind a slower server, and each response written must then wake it. The #4 explanations read it
// to turn ratios into microseconds of added work (lib/targets.mjs).

/**
 * Spins on the monotonic clock for `micros` µs. The server of a throughput window runs a core flat
 * out, so it is rarely descheduled mid-spin, and the time spun is CPU time.
 *
 * @example
 * spin(5); // returns 5 µs later
 */
export function spin(micros) {
  const until = process.hrtime.bigint() + BigInt(Math.round(micros * 1000));
  while (process.hrtime.bigint() < until) {
    // Nothing: the time is the point.
  }
}

/** Express middleware that spins for `micros` µs per request. */
export function calibrationExpress(micros) {
  return (_req, _res, next) => {
    spin(micros);
    next();
  };
}

/** Fastify plugin (fastify-plugin semantics) that spins for `options.micros` µs in preHandler. */
export function calibrationFastify(fastify, options, ready) {
  fastify.addHook('preHandler', (_request, _reply, next) => {
    spin(options.micros);
    next();
  });
  ready();
}
// The hook applies to the routes of the instance that registers the plugin, as fastify-plugin does.
calibrationFastify[Symbol.for('skip-override')] = true;

/** Koa middleware that spins for `micros` µs per request. */
export function calibrationKoa(micros) {
  return (_ctx, next) => {
    spin(micros);
    return next();
  };
}

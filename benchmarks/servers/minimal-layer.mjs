// The least an idempotency layer can do, per framework, as a yardstick for idem's overhead: a Map
// from the raw Idempotency-Key to the first response, and a Set of keys in flight. No scope, no
// fingerprint, no hashing, no lease, no expiry or bound, no problem bodies: none of what the spec
// asks for. Whatever this costs over the bare route, a real layer mounted in the same place costs
// at least as much, so the adapters' targets are read beside it (docs/benchmarks.md).

/** Express middleware: replays write the stored bytes; a fresh key wraps `res.end` to keep them. */
export function minimalExpress() {
  const { done, inFlight } = keyTables();
  return (req, res, next) => {
    const key = req.headers['idempotency-key'];
    if (key === undefined) return next();
    const stored = done.get(key);
    if (stored !== undefined) {
      res.writeHead(stored.status, replayHeaders(stored));
      res.end(stored.body);
      return;
    }
    if (inFlight.has(key)) return conflict(res);
    inFlight.add(key);
    const end = res.end;
    res.end = function endOnce(chunk, encoding, callback) {
      res.end = end;
      inFlight.delete(key);
      done.set(key, { status: res.statusCode, type: res.getHeader('content-type'), body: chunk });
      return end.call(this, chunk, encoding, callback);
    };
    next();
  };
}

/** Fastify plugin (register with `fastify-plugin` semantics): replays in preHandler, storing in onSend. */
export function minimalFastify(fastify, _options, ready) {
  const { done, inFlight } = keyTables();
  fastify.addHook('preHandler', (request, reply, next) => {
    const key = request.headers['idempotency-key'];
    if (key === undefined) return next();
    const stored = done.get(key);
    if (stored !== undefined) {
      reply.hijack();
      reply.raw.writeHead(stored.status, replayHeaders(stored));
      reply.raw.end(stored.body);
      return;
    }
    if (inFlight.has(key)) {
      reply.hijack();
      return conflict(reply.raw);
    }
    inFlight.add(key);
    next();
  });
  fastify.addHook('onSend', (request, reply, payload, next) => {
    const key = request.headers['idempotency-key'];
    if (key !== undefined && inFlight.delete(key)) {
      done.set(key, { status: reply.statusCode, type: reply.getHeader('content-type'), body: payload });
    }
    next(null, payload);
  });
  ready();
}
// The hooks apply to the routes of the instance that registers the plugin, as fastify-plugin does.
minimalFastify[Symbol.for('skip-override')] = true;

/** Koa middleware: keeps the body the handler set, as set (Koa serialises it on every answer). */
export function minimalKoa() {
  const { done, inFlight } = keyTables();
  return async (ctx, next) => {
    const key = ctx.get('idempotency-key');
    if (key === '') return next();
    const stored = done.get(key);
    if (stored !== undefined) {
      ctx.status = stored.status;
      ctx.set('idempotent-replayed', 'true');
      ctx.body = stored.body;
      return;
    }
    if (inFlight.has(key)) {
      ctx.status = 409;
      return;
    }
    inFlight.add(key);
    try {
      await next();
      done.set(key, { status: ctx.status, body: ctx.body });
    } finally {
      inFlight.delete(key);
    }
  };
}

function keyTables() {
  return { done: new Map(), inFlight: new Set() };
}

function replayHeaders(stored) {
  return {
    'content-type': stored.type,
    'content-length': Buffer.byteLength(stored.body),
    'idempotent-replayed': 'true',
  };
}

function conflict(res) {
  res.statusCode = 409;
  res.end();
}

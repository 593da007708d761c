import type { Middleware } from 'koa';

// What koa-timeout and koa-timeout-v2 do: race the rest of the chain against a timer and, when the
// timer wins, throw a 503 that Koa's error handler answers, while the handler goes on.
export function koaTimeout(ms: number): Middleware {
  return async (ctx, next) => {
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<never>((_resolve, reject) => {
      timer = setTimeout(() => {
        ctx.state.timedout = true;
        reject(Object.assign(new Error('Request timeout'), { status: 503, expose: true }));
      }, ms);
    });
    try {
      await Promise.race([next(), timedOut]);
    } finally {
      clearTimeout(timer);
    }
  };
}

import { Cluster, Redis, type RedisOptions } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { type IoredisLike, type RedisClientLike, redisCommandRunner, redisStore } from '../src/index.js';

// redisStore({ client: [...] }) over several ioredis clients. The real Redis behind it is checked in
// ioredis-clients.int.test.ts and replica-wait.int.test.ts; here, what is decided before a command
// leaves: which client it leaves on, and what is refused at construction.

// An ioredis-like client whose commands answer only when the test says so, and that records them.
const held = (name: string) => {
  const sent: string[][] = [];
  const pending: (() => void)[] = [];
  let failing = false;
  const settle = (answer: unknown, args: string[]) =>
    new Promise<unknown>((resolve, reject) => {
      sent.push(args);
      pending.push(() => (failing ? reject(new Error(`${name} down`)) : resolve(answer)));
    });
  const client = {
    name,
    callBuffer: (command: string, ...args: (string | Buffer | number)[]) =>
      settle(command === 'SET' ? 'OK' : null, [command, ...args.map(String)]),
    pipeline: () => {
      const commands: string[][] = [];
      const pipeline = {
        callBuffer: (command: string, ...args: (string | Buffer)[]) => {
          commands.push([command, ...args.map(String)]);
          return pipeline;
        },
        exec: async () => {
          await settle(null, commands.flat());
          return commands.map(([command]) => [null, command === 'WAIT' ? 1 : 'OK'] as [Error | null, unknown]);
        },
      };
      return pipeline;
    },
  };
  return {
    client,
    sent,
    /** Answers the oldest command still waiting. */
    answer: async () => {
      pending.shift()?.();
      // Let the store's awaits run before the test sends more.
      for (let i = 0; i < 5; i++) await Promise.resolve();
    },
    fail: () => {
      failing = true;
    },
  };
};

// Lets the promises already settled run their continuations.
const tick = async () => {
  for (let i = 0; i < 5; i++) await Promise.resolve();
};

describe('redisStore over several ioredis clients: which client a command leaves on', () => {
  it('sends each command to the client with the fewest of the store’s commands in flight', async () => {
    const [a, b, c] = [held('a'), held('b'), held('c')];
    const runner = redisCommandRunner([a.client, b.client, c.client]);
    void runner.send('k1', ['GET', 'k1']);
    void runner.send('k2', ['GET', 'k2']);
    void runner.send('k3', ['GET', 'k3']);
    await tick();
    // One each: none waits behind another while a client is idle.
    expect([a.sent.length, b.sent.length, c.sent.length]).toEqual([1, 1, 1]);
    await b.answer();
    void runner.send('k4', ['GET', 'k4']);
    await tick();
    // b is the only one with nothing in flight now.
    expect(b.sent.map(([, key]) => key)).toEqual(['k2', 'k4']);
    expect([a.sent.length, c.sent.length]).toEqual([1, 1]);
  });

  it('takes the clients in turn when they are equally busy', async () => {
    const [a, b, c] = [held('a'), held('b'), held('c')];
    const runner = redisCommandRunner([a.client, b.client, c.client]);
    const order: string[] = [];
    for (let i = 0; i < 6; i++) {
      const sending = runner.send(`k${i}`, ['GET', `k${i}`]);
      await tick();
      for (const one of [a, b, c]) {
        if (one.sent.length > order.filter((name) => name === one.client.name).length) {
          order.push(one.client.name);
          await one.answer();
        }
      }
      await sending;
    }
    expect(order).toEqual(['a', 'b', 'c', 'a', 'b', 'c']);
  });

  it('no longer counts a command that was rejected', async () => {
    const [a, b] = [held('a'), held('b')];
    const runner = redisCommandRunner([a.client, b.client]);
    a.fail();
    const first = runner.send('k1', ['GET', 'k1']).catch((error: unknown) => error);
    await tick();
    await a.answer();
    expect(await first).toBeInstanceOf(Error);
    void runner.send('k2', ['GET', 'k2']);
    void runner.send('k3', ['GET', 'k3']);
    await tick();
    // Were a's rejected command still counted, both would have gone to b.
    expect([a.sent.length, b.sent.length]).toEqual([2, 1]);
  });

  it('keeps a write and its WAIT on one client, and serves a read on another while that WAIT holds its client', async () => {
    const [a, b] = [held('a'), held('b')];
    const store = redisStore({ client: [a.client, b.client], waitForReplicas: { count: 1, timeout: 200 } });
    const claim = store.claim({ id: 'x', token: 't', fingerprint: '', leaseMs: 1_000 });
    await tick();
    expect(a.sent).toEqual([['SET', 'idem:x', expect.any(String), 'NX', 'PX', '1000', 'WAIT', '1', '200']]);
    const read = store.get('y');
    await tick();
    expect(b.sent).toEqual([['GET', 'idem:y']]);
    await b.answer();
    expect(await read).toBeUndefined();
    await a.answer();
    expect(await claim).toEqual({ claimed: true });
  });

  it('Held: an array of one client sends as that client alone does', async () => {
    const one = held('one');
    const store = redisStore({ client: [one.client] });
    const reading = store.get('x');
    await tick();
    await one.answer();
    expect(await reading).toBeUndefined();
    expect(one.sent).toEqual([['GET', 'idem:x']]);
  });
});

describe('redisStore over several ioredis clients: refused at construction', () => {
  // Never connected: lazyConnect, and nothing is sent.
  const lazy: { disconnect(): void }[] = [];
  const redis = (options: RedisOptions = {}) => {
    const client = new Redis({ lazyConnect: true, ...options });
    lazy.push(client);
    return client;
  };
  const cluster = () => {
    const client = new Cluster([{ host: '127.0.0.1', port: 1 }], { lazyConnect: true });
    lazy.push(client);
    return client;
  };
  afterAll(() => {
    for (const client of lazy) client.disconnect();
  });

  const refused = (client: unknown, message: RegExp) => {
    expect(() => redisStore({ client: client as RedisClientLike })).toThrow(TypeError);
    expect(() => redisStore({ client: client as RedisClientLike })).toThrow(message);
  };

  it('refuses an empty array', () => {
    refused([], /client is an empty array: give one ioredis client, or several/);
  });

  it('refuses an element that is no client, naming it', () => {
    refused([redis(), null], /client\[1\] is not an ioredis client/);
    refused([redis(), {}], /client\[1\] is not an ioredis client/);
    refused([redis(), 'redis://127.0.0.1:6379'], /client\[1\] is not an ioredis client/);
    // A runner of one's own is one client: an array is for ioredis clients only.
    refused([{ send: async () => null }], /client\[0\] is not an ioredis client/);
  });

  it('refuses a node-redis client in the array, and says what to do instead', () => {
    const nodeRedis = { sendCommand: async () => null };
    refused([redis(), nodeRedis], /client\[1\] is a node-redis client.*createClientPool/);
  });

  it('refuses an array that mixes ioredis Redis and Cluster clients', () => {
    refused([redis(), cluster()], /client\[1\] is an ioredis Cluster where client\[0\] is a Redis/);
    refused([cluster(), redis()], /client\[1\] is an ioredis Redis where client\[0\] is a Cluster/);
  });

  // Array(8).fill(client) is one connection eight times: every command would still queue behind
  // every WAIT, the very thing the array is for.
  it('refuses the same client twice', () => {
    const one = redis();
    refused([one, redis(), one], /client\[2\] is client\[0\] again/);
  });

  // Clients that write under different names would each find the key free: two claims of one key
  // both answered claimed, the handler run twice.
  it('refuses clients that would write one record under different keys (keyPrefix, db)', () => {
    refused(
      [redis({ keyPrefix: 'a:' }), redis({ keyPrefix: 'b:' })],
      /client\[1\] has keyPrefix 'b:' where client\[0\] has 'a:'/,
    );
    refused([redis(), redis({ db: 2 })], /client\[1\] selects db 2 where client\[0\] selects db 0/);
  });

  it('Held: accepts ioredis Redis clients, or Cluster clients, typed as they come', () => {
    const clients: Redis[] = [redis(), redis()];
    expect(redisStore({ client: clients }).prefix).toBe('idem:');
    const clusters: readonly Cluster[] = [cluster(), cluster()];
    expect(redisStore({ client: clusters, waitForReplicas: { count: 1, timeout: 100 } }).prefix).toBe('idem:');
    const likes: IoredisLike[] = clients;
    expect(redisStore({ client: likes, prefix: 'p:' }).prefix).toBe('p:');
  });
});

// docs/guides/queues.md's two consumers, run as the page writes them (queues-guide-consumers.ts
// compiles them from the page's blocks) against a real RabbitMQ and a real NATS JetStream, with the
// Redis and the PostgreSQL store, and real concurrency: three consumers, each with its own broker
// connection, engine and store client, as three processes would have; a fourth, a child process,
// killed with SIGKILL mid-handler. Each test makes its own queues or stream, prefix or tables, and
// removes them. Broker time is real (a nack waits out `retryAfter`, 1 s; a dead consumer's lease is
// 1 s); nothing waits for a retention.
import { type ChildProcess, fork } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import net from 'node:net';
import { fileURLToPath } from 'node:url';
import { type IdempotencyEvent, makeIdempotent } from '@idem/core';
import { databaseUrl, postgresAnswers, redisAnswers, redisUrl, serviceAvailable } from '@idem/testkit';
import { AckPolicy, type JsMsg, jetstream, jetstreamManager, StorageType } from '@nats-io/jetstream';
import { connect as connectNats, nanos } from '@nats-io/transport-node';
import { connect as connectRabbit, type Message } from 'amqplib';
import { describe, it } from 'vitest';
import { channelWith, guideConsumerJs, natsConsumer, type Order, rabbitConsumer } from './queues-guide-consumers.js';
import type { CrashConfig } from './queues-guide-crash-worker.js';
import {
  consumerEngine,
  type EngineExtras,
  openStore,
  preparePlace,
  type StoreKind,
  type StorePlace,
} from './queues-guide-stores.js';

const rabbitUrl = process.env.RABBITMQ_URL ?? 'amqp://guest:guest@127.0.0.1:5672';
const natsUrl = process.env.NATS_URL ?? 'nats://127.0.0.1:4222';
const worker = fileURLToPath(new URL('./queues-guide-crash-worker.ts', import.meta.url));
const root = fileURLToPath(new URL('../..', import.meta.url));
const rabbitJs = await guideConsumerJs('amqplib');
const natsJs = await guideConsumerJs('@nats-io/jetstream');

/** True when the server at `url` greets (NATS sends `INFO` first) or answers `hello` as `ok` says. */
function answers(url: string, port: number, hello: Buffer, ok: (first: Buffer) => boolean): Promise<boolean> {
  return new Promise((resolve) => {
    const parsed = new URL(url);
    const socket = net.connect({ host: parsed.hostname || '127.0.0.1', port: Number(parsed.port || port) });
    const done = (result: boolean) => {
      socket.destroy();
      resolve(result);
    };
    socket.setTimeout(1_500, () => done(false));
    socket.once('error', () => done(false));
    socket.once('close', () => done(false));
    socket.once('connect', () => socket.write(hello));
    socket.once('data', (first: Buffer) => done(ok(first)));
  });
}
// AMQP 0-9-1: the protocol header, answered by a method frame (type 1), connection.start.
const rabbitAnswers = () => answers(rabbitUrl, 5672, Buffer.from('AMQP\x00\x00\x09\x01', 'latin1'), (a) => a[0] === 1);
const natsAnswers = () => answers(natsUrl, 4222, Buffer.alloc(0), (a) => a.toString('latin1').startsWith('INFO '));

const stores: { kind: StoreKind; url: string; available: boolean }[] = [
  {
    kind: 'redis',
    url: redisUrl(),
    available: serviceAvailable(`Redis at ${redisUrl()}`, await redisAnswers(), 'the queues guide tests on Redis'),
  },
  {
    kind: 'postgres',
    url: databaseUrl(),
    available: serviceAvailable(
      `PostgreSQL at ${databaseUrl()}`,
      await postgresAnswers(),
      'the queues guide tests on PostgreSQL',
    ),
  },
];
const withRabbit = serviceAvailable(`RabbitMQ at ${rabbitUrl}`, await rabbitAnswers(), 'the RabbitMQ consumer tests');
const withNats = serviceAvailable(`NATS at ${natsUrl}`, await natsAnswers(), 'the NATS JetStream consumer tests');

/** Resolves when `check` holds, polling (never a fixed sleep); fails after `ms`. */
async function until(what: string, check: () => boolean | Promise<boolean>, ms = 12_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`not in time: ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** What the consumers of one test did, by order id, seen from the outside. */
class Tally {
  readonly counts = new Map<string, number>();
  /** When each thing happened, by the same names (Date.now()). */
  readonly times = new Map<string, number[]>();
  add(what: string, id: string): void {
    const name = `${what}:${id}`;
    this.counts.set(name, (this.counts.get(name) ?? 0) + 1);
    this.times.set(name, [...(this.times.get(name) ?? []), Date.now()]);
  }
  /** The shortest time between two of `what` for `id`, in ms (Infinity if fewer than two). */
  shortestGap(what: string, id: string): number {
    const at = this.times.get(`${what}:${id}`) ?? [];
    let gap = Number.POSITIVE_INFINITY;
    for (let i = 1; i < at.length; i++) gap = Math.min(gap, (at[i] as number) - (at[i - 1] as number));
    return gap;
  }
  get(what: string, id: string): number {
    return this.counts.get(`${what}:${id}`) ?? 0;
  }
  total(what: string): number {
    let n = 0;
    for (const [name, count] of this.counts) if (name.startsWith(`${what}:`)) n += count;
    return n;
  }
}

/**
 * The `chargeCard` the guide leaves to the reader: slow enough for copies to overlap, effect counted.
 * Its first `failures` calls for an order throw (a card network that is down), before any effect.
 */
function charger(effect: (id: string) => Promise<void>, tally: Tally, ms: number, failures = 0) {
  return async (order: Order) => {
    tally.add('charge', order.id);
    await pause(ms);
    if (tally.get('charge', order.id) <= failures) throw new Error('the card network is down');
    await effect(order.id);
    return { chargeId: `ch_${order.id}` };
  };
}

/** Counts the engine's takeovers of a crashed consumer's key, and its fingerprint mismatches. */
const watchEngine = (tally: Tally) => (event: IdempotencyEvent) => {
  if (event.type === 'claim' && event.recovered) tally.add('recovered', event.operation);
  if (event.type === 'mismatch') tally.add('mismatch', event.operation);
};

const orderId = (content: Buffer | Uint8Array): string => {
  try {
    return (JSON.parse(Buffer.from(content).toString('utf8')) as Order).id;
  } catch {
    return 'not-json';
  }
};

interface Place {
  place: StorePlace;
  effects(id: string): Promise<number>;
  drop(): Promise<void>;
}

async function freshPlace(kind: StoreKind, url: string): Promise<Place> {
  const suffix = randomUUID().slice(0, 8);
  const place: StorePlace = {
    kind,
    url,
    name: kind === 'redis' ? `queues-guide:${suffix}:` : `queues_guide_${suffix}`,
  };
  const removeAll = await preparePlace(place);
  const reader = await openStore(place);
  return {
    place,
    effects: (id) => reader.effects(id),
    drop: async () => {
      await reader.close();
      await removeAll();
    },
  };
}

/** Runs `n` of the guide's consumers in this process, each as its own process would: own connection, engine, store client. */
interface Consumers {
  tally: Tally;
  /** Every delivery was acked or nacked (no retry timer left). */
  settled(): boolean;
  close(): Promise<void>;
}

// ---- RabbitMQ ----

interface RabbitQueue {
  queue: string;
  publish(order: Order): void;
  publishRaw(body: Buffer): void;
  /** What reached the dead-letter queue. */
  deadLetters(): Promise<Message[]>;
  readyCount(): Promise<number>;
  remove(): Promise<void>;
}

/** A classic queue, or (given a `deliveryLimit`) a quorum queue that dead-letters past that many redeliveries. */
async function rabbitQueue(deliveryLimit?: number): Promise<RabbitQueue> {
  const connection = await connectRabbit(rabbitUrl);
  const channel = await connection.createChannel();
  const queue = `queues-guide.${randomUUID()}`;
  const dlx = `${queue}.dlx`;
  const dlq = `${queue}.dead`;
  await channel.assertExchange(dlx, 'fanout', { durable: false });
  await channel.assertQueue(dlq, { durable: false });
  await channel.bindQueue(dlq, dlx, '');
  await channel.assertQueue(
    queue,
    deliveryLimit === undefined
      ? { durable: false, deadLetterExchange: dlx }
      : {
          durable: true, // a quorum queue is always durable
          deadLetterExchange: dlx,
          arguments: { 'x-queue-type': 'quorum', 'x-delivery-limit': deliveryLimit },
        },
  );
  const dead: Message[] = [];
  return {
    queue,
    publish: (order) => void channel.sendToQueue(queue, Buffer.from(JSON.stringify(order)), { messageId: order.id }),
    publishRaw: (body) => void channel.sendToQueue(queue, body),
    deadLetters: async () => {
      for (let got = await channel.get(dlq, { noAck: true }); got; got = await channel.get(dlq, { noAck: true })) {
        dead.push(got);
      }
      return dead;
    },
    readyCount: async () => (await channel.checkQueue(queue)).messageCount,
    remove: async () => {
      await channel.deleteQueue(queue);
      await channel.deleteQueue(dlq);
      await channel.deleteExchange(dlx);
      await connection.close();
    },
  };
}

/** What a test changes in its consumers: engine settings, and how many first charges of an order fail. */
interface Setup {
  extras?: EngineExtras;
  failures?: number;
}

async function rabbitConsumers(
  n: number,
  queue: string,
  place: StorePlace,
  chargeMs: number,
  setup: Setup = {},
): Promise<Consumers> {
  const tally = new Tally();
  const running: { close(): Promise<void> }[] = [];
  for (let i = 0; i < n; i++) {
    const opened = await openStore(place);
    const engine = consumerEngine(opened.store, '5s', watchEngine(tally), setup.extras);
    const connection = await connectRabbit(rabbitUrl);
    const channel = await connection.createChannel();
    await channel.prefetch(10);
    // The guide's consumer, given a channel that counts what it does with each delivery.
    const watched = channelWith(channel, {
      consume: (q, onMessage, options) =>
        channel.consume(
          q,
          (msg) => {
            if (msg) tally.add('delivery', orderId(msg.content));
            onMessage(msg);
          },
          options,
        ),
      ack: (msg, allUpTo) => {
        tally.add('ack', orderId(msg.content));
        channel.ack(msg, allUpTo);
      },
      nack: (msg, allUpTo, requeue) => {
        tally.add(requeue ? 'requeue' : 'dead-letter', orderId(msg.content));
        channel.nack(msg, allUpTo, requeue);
      },
    });
    await rabbitConsumer(rabbitJs, charger(opened.effect, tally, chargeMs, setup.failures))(watched, queue, engine);
    running.push({
      close: async () => {
        await connection.close();
        await opened.close();
      },
    });
  }
  return {
    tally,
    settled: () => tally.total('delivery') === tally.total('ack') + tally.total('requeue') + tally.total('dead-letter'),
    close: async () => {
      for (const consumer of running) await consumer.close();
    },
  };
}

// ---- NATS JetStream ----

interface NatsStream {
  stream: string;
  durable: string;
  publish(order: Order): Promise<void>;
  /** Nothing left to deliver and nothing delivered unacked. */
  drained(): Promise<boolean>;
  remove(): Promise<void>;
}

async function natsStream(ackWaitMs: number, maxDeliver = -1): Promise<NatsStream> {
  const nc = await connectNats({ servers: natsUrl });
  const jsm = await jetstreamManager(nc);
  const suffix = randomUUID().slice(0, 8);
  const stream = `queues-guide-${suffix}`;
  const subject = `queues-guide.${suffix}.orders`;
  const durable = 'orders-worker';
  await jsm.streams.add({ name: stream, subjects: [subject], storage: StorageType.Memory });
  await jsm.consumers.add(stream, {
    durable_name: durable,
    ack_policy: AckPolicy.Explicit,
    ack_wait: nanos(ackWaitMs),
    max_deliver: maxDeliver,
  });
  const js = jetstream(nc);
  return {
    stream,
    durable,
    // No Nats-Msg-Id: the stream would drop the copies as duplicates; these must all reach consumers.
    publish: async (order) => void (await js.publish(subject, JSON.stringify(order))),
    drained: async () => {
      const info = await jsm.consumers.info(stream, durable);
      return info.num_pending === 0 && info.num_ack_pending === 0;
    },
    remove: async () => {
      await jsm.streams.delete(stream);
      await nc.close();
    },
  };
}

async function natsConsumers(
  n: number,
  stream: NatsStream,
  place: StorePlace,
  chargeMs: number,
  setup: Setup = {},
): Promise<Consumers> {
  const tally = new Tally();
  const running: { close(): Promise<void> }[] = [];
  let inHand = 0;
  for (let i = 0; i < n; i++) {
    const opened = await openStore(place);
    const engine = consumerEngine(opened.store, '5s', watchEngine(tally), setup.extras);
    const nc = await connectNats({ servers: natsUrl });
    const consumer = await jetstream(nc).consumers.get(stream.stream, stream.durable);
    // Two at a time (a prefetch above 1), so copies of one message reach the three at once.
    const messages = await consumer.consume({ max_messages: 2 });
    // The guide's loop, given messages that count what it does with each.
    async function* watched(): AsyncGenerator<JsMsg> {
      for await (const msg of messages) {
        const id = orderId(msg.data);
        tally.add('delivery', id);
        inHand++;
        const settle = (what: string, call: () => void) => {
          tally.add(what, id);
          inHand--;
          call();
        };
        yield new Proxy(msg, {
          get(target, property) {
            if (property === 'ack') return () => settle('ack', () => target.ack());
            if (property === 'nak') return (delay?: number) => settle('nak', () => target.nak(delay));
            if (property === 'term') return (reason?: string) => settle('term', () => target.term(reason));
            const value = Reflect.get(target, property, target);
            return typeof value === 'function' ? value.bind(target) : value;
          },
        });
      }
    }
    const loop = natsConsumer(natsJs, charger(opened.effect, tally, chargeMs, setup.failures))(watched(), engine);
    running.push({
      close: async () => {
        messages.stop();
        await loop;
        await nc.close();
        await opened.close();
      },
    });
  }
  return {
    tally,
    settled: () => inHand === 0,
    close: async () => {
      for (const consumer of running) await consumer.close();
    },
  };
}

// ---- the consumer process that is killed ----

interface Killable {
  /** Resolves with the first message of the child that says it is `at` that point. */
  reached(at: string): Promise<void>;
  kill(): Promise<NodeJS.Signals | null>;
  /** How it ended: its exit code, or the signal that ended it. */
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

function crashingConsumer(config: CrashConfig): Killable {
  const child: ChildProcess = fork(worker, [JSON.stringify(config)], {
    cwd: root,
    execArgv: ['--import', 'tsx'],
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  const seen = new Set<string>();
  const waiters: { at: string; resolve: () => void }[] = [];
  child.on('message', (message) => {
    const at = (message as { at: string }).at;
    seen.add(at);
    for (const waiter of waiters.filter((w) => w.at === at)) waiter.resolve();
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once('exit', (code, signal) => resolve({ code, signal })),
  );

  return {
    reached: (at) =>
      new Promise<void>((resolve, reject) => {
        if (seen.has(at)) return resolve();
        waiters.push({ at, resolve });
        void exited.then(() => reject(new Error(`the consumer process exited before ${at}`)));
      }),
    kill: async () => {
      child.kill('SIGKILL');
      return (await exited).signal;
    },
    exited,
  };
}

/**
 * Another consumer's run that holds the order's key in progress (its lease renewed) until `release()`,
 * then makes its effect: what a copy of the message meets while the first delivery is being handled.
 */
async function holdKey(place: StorePlace, o: Order) {
  const opened = await openStore(place);
  let claimed = false;
  let release = () => {};
  const holding = new Promise<void>((resolve) => {
    release = resolve;
  });
  const holder = makeIdempotent(
    async (held: Order) => {
      await holding;
      await opened.effect(held.id);
    },
    {
      engine: consumerEngine(opened.store, '5s', (event) => {
        if (event.type === 'claim') claimed = true;
      }),
      operation: 'processOrder',
      key: (held: Order) => held.id,
      payload: (held: Order) => JSON.stringify(held),
    },
  );
  const done = holder(o);
  await until('the holder claimed the key', () => claimed);
  return {
    release,
    /** Releases the key and waits for the holder's run: its effect made. */
    finish: async () => {
      release();
      await done;
    },
    /** Releases the key (if not yet), waits for the holder's run, closes its store. */
    close: async () => {
      release();
      await done.catch(() => undefined);
      await opened.close();
    },
  };
}

const order = (amount = 5): Order => ({ id: `order-${randomUUID().slice(0, 8)}`, amount });

// ---- one set of tests for both brokers ----

/** One test's queue (RabbitMQ) or stream and durable consumer (JetStream), and how to drive it. */
interface Line {
  publish(order: Order): Promise<void>;
  consumers(n: number, place: StorePlace, chargeMs: number, setup?: Setup): Promise<Consumers>;
  /** The guide's consumer in a child process, on this queue or stream, to be killed. */
  crashing(place: StorePlace, mode: CrashConfig['mode']): Killable;
  /** Waits until nothing is in flight: RabbitMQ, no retry timer left; JetStream, nothing pending on the consumer. */
  settled(consumers: Consumers): Promise<void>;
  /** The RabbitMQ queue, for the checks only it allows (its ready count, its dead letters). */
  rabbit: RabbitQueue | undefined;
  remove(): Promise<void>;
}

interface Broker {
  kind: 'rabbitmq' | 'nats';
  name: string;
  available: boolean;
  /** What the guide's consumer does, as the tally names it, with a copy to come back later, and with one it gives up on. */
  returns: 'requeue' | 'nak';
  refuses: 'dead-letter' | 'term';
  /**
   * A fresh queue or stream; `ackWaitMs` is JetStream's ack_wait (RabbitMQ redelivers a dead consumer's
   * at once). Given `limit`, the broker gives a message up past it: RabbitMQ, a quorum queue's
   * `x-delivery-limit` (redeliveries); JetStream, `max_deliver` (deliveries).
   */
  open(ackWaitMs: number, limit?: number): Promise<Line>;
}

const brokers: Broker[] = [
  {
    kind: 'rabbitmq',
    name: 'RabbitMQ',
    available: withRabbit,
    returns: 'requeue',
    refuses: 'dead-letter',
    open: async (_ackWaitMs, limit) => {
      const queue = await rabbitQueue(limit);
      return {
        publish: async (o) => queue.publish(o),
        consumers: (n, place, chargeMs, setup) => rabbitConsumers(n, queue.queue, place, chargeMs, setup),
        crashing: (place, mode) =>
          crashingConsumer({
            broker: 'rabbitmq',
            brokerUrl: rabbitUrl,
            queue: queue.queue,
            durable: '',
            place,
            mode,
            leaseMs: 1_000,
            consumerJs: rabbitJs,
          }),
        settled: (consumers) => until('no retry timer left', consumers.settled),
        rabbit: queue,
        remove: () => queue.remove(),
      };
    },
  },
  {
    kind: 'nats',
    name: 'NATS JetStream',
    available: withNats,
    returns: 'nak',
    refuses: 'term',
    open: async (ackWaitMs, limit) => {
      const stream = await natsStream(ackWaitMs, limit);
      return {
        publish: (o) => stream.publish(o),
        consumers: (n, place, chargeMs, setup) => natsConsumers(n, stream, place, chargeMs, setup),
        crashing: (place, mode) =>
          crashingConsumer({
            broker: 'nats',
            brokerUrl: natsUrl,
            queue: stream.stream,
            durable: stream.durable,
            place,
            mode,
            leaseMs: 1_000,
            consumerJs: natsJs,
          }),
        settled: () => until('nothing pending on the consumer', stream.drained),
        rabbit: undefined,
        remove: () => stream.remove(),
      };
    },
  },
];

/** What {@link withHeldKey} hands its test. */
interface HeldKey {
  place: Place;
  line: Line;
  o: Order;
  holder: Awaited<ReturnType<typeof holdKey>>;
  consumers: Consumers;
}

/**
 * One consumer of the guide's on a fresh `line` (given `limit`, a broker that gives up past it), with
 * the order `o` published while another run holds its key (until `holder.release()`); everything is
 * removed after `run`.
 */
async function withHeldKey(
  backend: { kind: StoreKind; url: string },
  broker: Broker,
  line: { ackWaitMs: number; limit: number; extras?: EngineExtras },
  run: (held: HeldKey) => Promise<void>,
): Promise<void> {
  const place = await freshPlace(backend.kind, backend.url);
  const opened = await broker.open(line.ackWaitMs, line.limit);
  const o = order();
  const holder = await holdKey(place.place, o);
  const consumers = await opened.consumers(1, place.place, 50, line.extras ? { extras: line.extras } : {});
  try {
    await opened.publish(o);
    await run({ place, line: opened, o, holder, consumers });
  } finally {
    await consumers.close();
    await holder.close();
    await opened.remove();
    await place.drop();
  }
}

/**
 * Resolves once the broker has given up a copy whose key is held, on a line like `line` but read by a
 * consumer without `wait` (the "without wait" tests): a hold that lasts until then is one past what
 * the broker's limit allows, measured on the broker's own clock rather than guessed as a fixed time
 * (which, on a loaded machine, can end before the broker would have given up).
 */
async function givenUpWithoutWait(
  backend: { kind: StoreKind; url: string },
  broker: Broker,
  line: { ackWaitMs: number; limit: number },
): Promise<void> {
  const without = { ackWaitMs: line.ackWaitMs, limit: line.limit };
  await withHeldKey(backend, broker, without, async ({ line: control, o, consumers }) => {
    const queue = control.rabbit;
    if (queue) {
      await until('the control copy dead-lettered', async () => (await queue.deadLetters()).length === 1);
    } else {
      await until("the control message nak'd to max_deliver", () => consumers.tally.get('nak', o.id) === without.limit);
      await control.settled(consumers);
    }
  });
}

for (const backend of stores) {
  for (const broker of brokers) {
    const { returns, refuses } = broker;
    const returned = returns === 'requeue' ? 'requeued' : 'nak’d';
    describe
      .runIf(backend.available && broker.available)
      .concurrent(`the guide's ${broker.name} consumer, ${backend.kind} store`, () => {
        it(`5 copies of each message, 3 consumers at once: one effect per id, the in-progress copies ${returned} with retryAfter, every copy acked`, async ({
          expect,
        }) => {
          const place = await freshPlace(backend.kind, backend.url);
          const line = await broker.open(5_000);
          const consumers = await line.consumers(3, place.place, 300);
          try {
            const orders = [order(), order(), order()];
            // A message's copies one after another: the consumers take them at the same time.
            for (const o of orders) for (let copy = 0; copy < 5; copy++) await line.publish(o);
            // JetStream's acks are counted as at least 5, as this test always has.
            const acked = (o: Order) =>
              line.rabbit ? consumers.tally.get('ack', o.id) === 5 : consumers.tally.get('ack', o.id) >= 5;
            await until('every copy acked', () => orders.every(acked));
            await line.settled(consumers);
            for (const o of orders) {
              expect(await place.effects(o.id)).toBe(1);
              expect(consumers.tally.get('charge', o.id)).toBe(1);
            }
            // The copies overlapped: some found their key in progress and went back after retryAfter.
            expect(consumers.tally.total(returns)).toBeGreaterThan(0);
            if (line.rabbit) {
              expect(consumers.tally.total('dead-letter')).toBe(0);
              expect(await line.rabbit.readyCount()).toBe(0);
              expect(await line.rabbit.deadLetters()).toEqual([]);
            } else {
              expect(consumers.settled()).toBe(true);
            }
          } finally {
            await consumers.close();
            await line.remove();
            await place.drop();
          }
        });

        for (const mode of ['before-effect', 'after-effect'] as const) {
          it(`a consumer killed ${mode === 'before-effect' ? 'before its effect' : 'after its effect was stored, before its ack'}: the redelivery ${mode === 'before-effect' ? 'takes the key over after the 1 s lease' : 'replays'}, one effect`, async ({
            expect,
          }) => {
            const place = await freshPlace(backend.kind, backend.url);
            // JetStream redelivers what a dead consumer held only after ack_wait.
            const line = await broker.open(1_000);
            const crashing = line.crashing(place.place, mode);
            let consumers: Consumers | undefined;
            try {
              await crashing.reached('ready');
              const o = order();
              await line.publish(o);
              await crashing.reached(mode === 'before-effect' ? 'charging' : 'acking');
              // Only now do the others start: the message was the dead consumer's.
              consumers = await line.consumers(2, place.place, 50);
              expect(await crashing.kill()).toBe('SIGKILL');
              const survivors = consumers;
              await until('the redelivery acked', () =>
                line.rabbit ? survivors.tally.get('ack', o.id) === 1 : survivors.tally.get('ack', o.id) >= 1,
              );
              await line.settled(survivors);
              expect(await place.effects(o.id)).toBe(1);
              if (mode === 'before-effect') {
                // RabbitMQ redelivered at once, inside the dead consumer's lease: requeued, then taken over.
                if (line.rabbit) expect(survivors.tally.get('requeue', o.id)).toBeGreaterThan(0);
                expect(survivors.tally.get('charge', o.id)).toBe(1);
                expect(survivors.tally.total('recovered')).toBe(1);
              } else {
                expect(survivors.tally.get('charge', o.id)).toBe(0);
              }
              if (line.rabbit) expect(await line.rabbit.readyCount()).toBe(0);
            } finally {
              await crashing.kill();
              await consumers?.close();
              await line.remove();
              await place.drop();
            }
          });
        }

        it(`the same key with another payload is ${broker.kind === 'rabbitmq' ? 'dead-lettered' : 'terminated'}: fingerprint_mismatch, the handler does not run`, async ({
          expect,
        }) => {
          const place = await freshPlace(backend.kind, backend.url);
          const line = await broker.open(5_000);
          const consumers = await line.consumers(3, place.place, 50);
          try {
            const o = order(5);
            await line.publish(o);
            await until('the first acked', () => consumers.tally.get('ack', o.id) === 1);
            await line.publish({ ...o, amount: 6 });
            await until('the other payload refused', () => consumers.tally.get(refuses, o.id) === 1);
            if (line.rabbit) {
              const dead = await line.rabbit.deadLetters();
              expect(dead.map((m) => JSON.parse(m.content.toString('utf8')))).toEqual([{ ...o, amount: 6 }]);
              expect(dead[0]?.properties.headers?.['x-death']?.[0]?.reason).toBe('rejected');
            } else {
              await line.settled(consumers);
            }
            expect(consumers.tally.total('mismatch')).toBe(1);
            expect(consumers.tally.get('charge', o.id)).toBe(1);
            expect(await place.effects(o.id)).toBe(1);
            if (line.rabbit) expect(consumers.settled()).toBe(true);
            else expect(consumers.tally.total('nak')).toBe(0);
          } finally {
            await consumers.close();
            await line.remove();
            await place.drop();
          }
        });

        it(`a handler that throws (storeOutcome 'stripe'): its key released, the message ${returned} with 1 s and run again, one effect, not ${broker.kind === 'rabbitmq' ? 'dead-lettered' : 'terminated'}`, async ({
          expect,
        }) => {
          const place = await freshPlace(backend.kind, backend.url);
          const line = await broker.open(5_000);
          const consumers = await line.consumers(1, place.place, 50, { failures: 1 });
          try {
            const o = order();
            await line.publish(o);
            // Was wrong: the guide dead-lettered (terminated) every error but a retryable
            // IdempotencyError, so a handler's own failure, whose key 'stripe' had released for the
            // redelivery to run it again, was never retried.
            await until('the redelivery acked', () => consumers.tally.get('ack', o.id) === 1);
            await line.settled(consumers);
            expect(consumers.tally.get('charge', o.id)).toBe(2);
            expect(consumers.tally.get(returns, o.id)).toBe(1);
            expect(consumers.tally.get(refuses, o.id)).toBe(0);
            // Not at once: a handler that always fails would loop hot.
            expect(consumers.tally.shortestGap('delivery', o.id)).toBeGreaterThanOrEqual(900);
            expect(await place.effects(o.id)).toBe(1);
            if (line.rabbit) expect(await line.rabbit.deadLetters()).toEqual([]);
          } finally {
            await consumers.close();
            await line.remove();
            await place.drop();
          }
        });

        it(`a handler that throws under storeOutcome 'all': the new failure is ${returned} with 1 s, its replay ${broker.kind === 'rabbitmq' ? 'dead-lettered' : 'terminated'} at once, the handler runs once`, async ({
          expect,
        }) => {
          const place = await freshPlace(backend.kind, backend.url);
          const line = await broker.open(5_000);
          const consumers = await line.consumers(1, place.place, 50, {
            failures: 1,
            extras: { storeOutcome: 'all' },
          });
          try {
            const o = order();
            await line.publish(o);
            // Was wrong: a failure kept under 'all' came back on each redelivery as a plain Error the
            // consumer took for a new failure: sent back every second, the handler never run again,
            // until the queue's delivery limit or max_deliver (none on a classic queue: for ever).
            await until('the replayed failure refused', () => consumers.tally.get(refuses, o.id) === 1);
            await line.settled(consumers);
            expect(consumers.tally.get('charge', o.id)).toBe(1);
            expect(consumers.tally.get(returns, o.id)).toBe(1);
            expect(consumers.tally.get('ack', o.id)).toBe(0);
            expect(await place.effects(o.id)).toBe(0);
            if (line.rabbit) expect(await line.rabbit.deadLetters()).toHaveLength(1);
          } finally {
            await consumers.close();
            await line.remove();
            await place.drop();
          }
        });

        it('conflictRetryAfter: 0: a copy whose key is held elsewhere comes back once a second, not in a hot loop', async ({
          expect,
        }) => {
          const place = await freshPlace(backend.kind, backend.url);
          const line = await broker.open(5_000);
          const o = order();
          const holder = await holdKey(place.place, o);
          const consumers = await line.consumers(1, place.place, 50, { extras: { conflictRetryAfter: 0 } });
          try {
            await line.publish(o);
            await until('three deliveries of the held copy', () => consumers.tally.get('delivery', o.id) >= 3);
            // Was wrong: the guide waited `retryAfter` seconds before its nack, or nak'd with it, and 0
            // is a valid `conflictRetryAfter` (it is sent as `Retry-After: 0`): the copy went round the
            // broker as fast as it could, a store read and a nack each time, for as long as the key was held.
            expect(consumers.tally.shortestGap('delivery', o.id)).toBeGreaterThanOrEqual(900);
            holder.release();
            await until('the copy acked', () => consumers.tally.get('ack', o.id) === 1);
            await line.settled(consumers);
            expect(consumers.tally.get('charge', o.id)).toBe(0);
            expect(await place.effects(o.id)).toBe(1);
          } finally {
            await consumers.close();
            await holder.close();
            await line.remove();
            await place.drop();
          }
        });

        it(`wait '15s' (the guide's setting): 5 copies, 3 consumers at once: the copies wait for the first run's result, none ${returned}, one effect per id`, async ({
          expect,
        }) => {
          const place = await freshPlace(backend.kind, backend.url);
          const line = await broker.open(5_000);
          const consumers = await line.consumers(3, place.place, 300, { extras: { wait: '15s' } });
          try {
            const orders = [order(), order(), order()];
            for (const o of orders) for (let copy = 0; copy < 5; copy++) await line.publish(o);
            await until('every copy acked', () => orders.every((o) => consumers.tally.get('ack', o.id) === 5));
            await line.settled(consumers);
            for (const o of orders) {
              expect(await place.effects(o.id)).toBe(1);
              expect(consumers.tally.get('charge', o.id)).toBe(1);
              if (line.rabbit) expect(consumers.tally.get('delivery', o.id)).toBe(5);
            }
            expect(consumers.tally.total(returns)).toBe(0);
            expect(consumers.tally.total(refuses)).toBe(0);
          } finally {
            await consumers.close();
            await line.remove();
            await place.drop();
          }
        });

        // ---- what only one broker has ----
        if (broker.kind === 'rabbitmq') {
          it('a body that is no JSON is dead-lettered, and the consumer goes on', async ({ expect }) => {
            const place = await freshPlace(backend.kind, backend.url);
            const queue = await rabbitQueue();
            const consumers = await rabbitConsumers(1, queue.queue, place.place, 50);
            try {
              queue.publishRaw(Buffer.from('not json'));
              const o = order();
              queue.publish(o);
              // Was wrong: the guide parsed the body outside its promise chain, so the SyntaxError went
              // into amqplib, which closed the channel: the consumer stopped, every message it held went
              // back, and the poison message went on to close the next consumer's channel.
              await until('the next message acked', () => consumers.tally.get('ack', o.id) === 1);
              await until('the body dead-lettered', () => consumers.tally.get('dead-letter', 'not-json') === 1);
              const dead = await queue.deadLetters();
              expect(dead.map((m) => m.content.toString('utf8'))).toEqual(['not json']);
              expect(await place.effects(o.id)).toBe(1);
            } finally {
              await consumers.close();
              await queue.remove();
              await place.drop();
            }
          });

          it('a consumer whose connection closes while a copy waits out retryAfter does not crash', async ({
            expect,
          }) => {
            const place = await freshPlace(backend.kind, backend.url);
            const line = await broker.open(0);
            const waiting = line.crashing(place.place, 'close-while-waiting');
            let holder: Awaited<ReturnType<typeof holdKey>> | undefined;
            let consumers: Consumers | undefined;
            try {
              const o = order();
              // Another consumer's run holds the key, in progress until released.
              holder = await holdKey(place.place, o);
              await waiting.reached('ready');
              await line.publish(o);
              await waiting.reached('closed');
              // Was wrong: the guide's nack timer fired on the closed channel and amqplib threw
              // IllegalOperationError out of the timer: the process died (exit code 1, an uncaught exception).
              expect(await waiting.exited).toEqual({ code: 0, signal: null });
              await holder.finish();
              // RabbitMQ requeued the copy when the connection closed; a consumer replays it.
              consumers = await line.consumers(1, place.place, 50);
              const survivors = consumers;
              await until('the copy acked', () => survivors.tally.get('ack', o.id) === 1);
              expect(survivors.tally.get('charge', o.id)).toBe(0);
              expect(await place.effects(o.id)).toBe(1);
            } finally {
              await holder?.close();
              await waiting.kill();
              await consumers?.close();
              await line.remove();
              await place.drop();
            }
          });

          it('a consumer whose connection closes while its handler runs does not crash, and the redelivery replays', async ({
            expect,
          }) => {
            const place = await freshPlace(backend.kind, backend.url);
            const line = await broker.open(0);
            const closing = line.crashing(place.place, 'close-while-charging');
            let consumers: Consumers | undefined;
            try {
              await closing.reached('ready');
              const o = order();
              await line.publish(o);
              await closing.reached('closed');
              // Was wrong: the guide acked on the closed channel; amqplib threw, the catch's nack threw
              // again, out of the consume callback's promise: an unhandled rejection ended the process.
              expect(await closing.exited).toEqual({ code: 0, signal: null });
              consumers = await line.consumers(1, place.place, 50);
              const survivors = consumers;
              await until('the redelivery acked', () => survivors.tally.get('ack', o.id) === 1);
              expect(survivors.tally.get('charge', o.id)).toBe(0);
              expect(await place.effects(o.id)).toBe(1);
            } finally {
              await closing.kill();
              await consumers?.close();
              await line.remove();
              await place.drop();
            }
          });

          it("wait '15s': a consumer killed before its effect: the redelivery waits out its 1 s lease and takes the key over, never requeued, one effect", async ({
            expect,
          }) => {
            const place = await freshPlace(backend.kind, backend.url);
            const line = await broker.open(0);
            const crashing = line.crashing(place.place, 'before-effect');
            let consumers: Consumers | undefined;
            try {
              await crashing.reached('ready');
              const o = order();
              await line.publish(o);
              await crashing.reached('charging');
              consumers = await line.consumers(2, place.place, 50, { extras: { wait: '15s' } });
              expect(await crashing.kill()).toBe('SIGKILL');
              const survivors = consumers;
              await until('the redelivery acked', () => survivors.tally.get('ack', o.id) === 1);
              await line.settled(survivors);
              expect(survivors.tally.get('delivery', o.id)).toBe(1);
              expect(survivors.tally.get('requeue', o.id)).toBe(0);
              expect(survivors.tally.get('charge', o.id)).toBe(1);
              expect(survivors.tally.total('recovered')).toBe(1);
              expect(await place.effects(o.id)).toBe(1);
            } finally {
              await crashing.kill();
              await consumers?.close();
              await line.remove();
              await place.drop();
            }
          });

          it("a quorum queue's delivery-limit, without wait: each 'in progress' requeue counts, so a copy is dead-lettered only because another consumer held its key", async ({
            expect,
          }) => {
            await withHeldKey(backend, broker, { ackWaitMs: 0, limit: 1 }, async ({ line, o, consumers }) => {
              const queue = line.rabbit as RabbitQueue;
              // Nothing failed: the key was held elsewhere, and every requeue used up a delivery. This
              // is why the guide sets `wait` and sizes the limit ("Redeliveries and the broker's limit").
              await until('the copy dead-lettered', async () => (await queue.deadLetters()).length === 1);
              const [dead] = await queue.deadLetters();
              expect(dead?.properties.headers?.['x-death']?.[0]?.reason).toBe('delivery_limit');
              expect(consumers.tally.get('requeue', o.id)).toBe(2);
              expect(consumers.tally.get('charge', o.id)).toBe(0);
            });
          });

          it("a quorum queue's delivery-limit, with the guide's wait: a copy held past what the limit would allow waits, is never requeued, and is acked", async ({
            expect,
          }) => {
            const held = { ackWaitMs: 0, limit: 1, extras: { wait: '15s' } } as const;
            await withHeldKey(backend, broker, held, async ({ place, line, o, holder, consumers }) => {
              await until('the copy delivered', () => consumers.tally.get('delivery', o.id) === 1);
              // Held until, without wait, the 1 s requeues have passed the limit (the test above).
              await givenUpWithoutWait(backend, broker, held);
              holder.release();
              await until('the copy acked', () => consumers.tally.get('ack', o.id) === 1);
              expect(consumers.tally.get('delivery', o.id)).toBe(1);
              expect(consumers.tally.get('requeue', o.id)).toBe(0);
              expect(consumers.tally.get('charge', o.id)).toBe(0);
              expect(await place.effects(o.id)).toBe(1);
              expect(await (line.rabbit as RabbitQueue).deadLetters()).toEqual([]);
            });
          });

          it("a quorum queue's delivery-limit sized by the guide's rule: a run that holds its key longer than wait sends the copy back, within the limit", async ({
            expect,
          }) => {
            // Held until the copy has been sent back once and delivered again, with wait 1 s and
            // retryAfter 1 s: H is a little over 2 s, and the rule gives ⌈H / (1 + 1)⌉ = 2 returns.
            const held = { ackWaitMs: 0, limit: 2, extras: { wait: '1s' } } as const;
            await withHeldKey(backend, broker, held, async ({ place, line, o, holder, consumers }) => {
              await until('the copy delivered', () => consumers.tally.get('delivery', o.id) === 1);
              await until('the copy sent back and delivered again', () => consumers.tally.get('delivery', o.id) === 2);
              holder.release();
              await until('the copy acked', () => consumers.tally.get('ack', o.id) === 1);
              await until('no retry timer left', consumers.settled);
              expect(consumers.tally.get('requeue', o.id)).toBeGreaterThanOrEqual(1);
              expect(consumers.tally.get('requeue', o.id)).toBeLessThanOrEqual(2);
              expect(consumers.tally.get('charge', o.id)).toBe(0);
              expect(await place.effects(o.id)).toBe(1);
              expect(await (line.rabbit as RabbitQueue).deadLetters()).toEqual([]);
            });
          });
        } else {
          it("max_deliver, without wait: each 'in progress' nak counts, so a message's deliveries end only because another consumer held its key", async ({
            expect,
          }) => {
            await withHeldKey(backend, broker, { ackWaitMs: 5_000, limit: 2 }, async ({ line, o, consumers }) => {
              await until('both deliveries nak’d', () => consumers.tally.get('nak', o.id) === 2);
              await line.settled(consumers);
              // JetStream delivers it no more: nothing failed, the key was only held elsewhere.
              expect(consumers.tally.get('delivery', o.id)).toBe(2);
              expect(consumers.tally.get('ack', o.id)).toBe(0);
            });
          });

          it("max_deliver, with the guide's wait: a message held past what max_deliver would allow waits, is never nak'd, and is acked", async ({
            expect,
          }) => {
            const held = { ackWaitMs: 5_000, limit: 1, extras: { wait: '15s' } } as const;
            await withHeldKey(backend, broker, held, async ({ place, line, o, holder, consumers }) => {
              await until('the message delivered', () => consumers.tally.get('delivery', o.id) === 1);
              // Held until, without wait, the 'in progress' nak has used up max_deliver (the test above).
              await givenUpWithoutWait(backend, broker, held);
              holder.release();
              await until('the message acked', () => consumers.tally.get('ack', o.id) === 1);
              await line.settled(consumers);
              expect(consumers.tally.get('delivery', o.id)).toBe(1);
              expect(consumers.tally.get('nak', o.id)).toBe(0);
              expect(consumers.tally.get('charge', o.id)).toBe(0);
              expect(await place.effects(o.id)).toBe(1);
            });
          });
        }
      });
  }
}

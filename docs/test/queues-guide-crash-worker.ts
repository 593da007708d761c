// The consumer process queues-guide.int.test.ts kills with SIGKILL: it runs docs/guides/queues.md's
// RabbitMQ or NATS JetStream consumer as written, over an engine with a short lease, and tells the
// parent where it stands so the kill lands at a chosen point:
// - 'before-effect': `chargeCard` says "charging" and never returns: the key is claimed, nothing done;
// - 'after-effect': `chargeCard` counts its effect and returns, the result is stored, and the ack
//   says "acking" instead of acking: the effect is done and stored, the broker still holds the message;
// - 'close-while-waiting' (RabbitMQ): when a delivery finds its key in progress (the guide then waits
//   out `retryAfter` before its nack), the process closes its connection, as a broker restart or a
//   shutdown would, then says "survived" if the pending nack did not crash it;
// - 'close-while-charging' (RabbitMQ): `chargeCard` closes the connection, then counts its effect and
//   returns, so the guide acks on a closed channel; then "survived" as above.
import { type JsMsg, jetstream } from '@nats-io/jetstream';
import { connect as connectNats } from '@nats-io/transport-node';
import { connect as connectRabbit, type Message } from 'amqplib';
import { channelWith, natsConsumer, type Order, rabbitConsumer } from './queues-guide-consumers.js';
import { consumerEngine, openStore, type StorePlace } from './queues-guide-stores.js';

export interface CrashConfig {
  broker: 'rabbitmq' | 'nats';
  brokerUrl: string;
  /** The RabbitMQ queue, or the JetStream stream and durable consumer. */
  queue: string;
  durable: string;
  place: StorePlace;
  mode: 'before-effect' | 'after-effect' | 'close-while-waiting' | 'close-while-charging';
  leaseMs: number;
  /** The guide's consumer, compiled by the test (guideConsumerJs). */
  consumerJs: string;
}

const config = JSON.parse(process.argv[2] ?? '{}') as CrashConfig;
const send = (message: unknown) => new Promise<void>((resolve) => process.send?.(message, () => resolve()));
const { store, effect } = await openStore(config.place);
let closeConnection = async () => undefined as unknown;
const engine = consumerEngine(store, config.leaseMs, (event) => {
  if (event.type !== 'conflict' || config.mode !== 'close-while-waiting') return;
  // After the guide's catch has set its nack timer (1 s): close under it, then outlive it.
  setTimeout(() => void closeAndOutlive(), 100);
});

async function closeAndOutlive(): Promise<void> {
  await closeConnection();
  await send({ at: 'closed' });
  setTimeout(async () => {
    await send({ at: 'survived' });
    process.exit(0);
  }, 1_500);
}

const chargeCard = async (order: Order) => {
  if (config.mode === 'before-effect') {
    await send({ at: 'charging', id: order.id });
    return new Promise<never>(() => undefined);
  }
  if (config.mode === 'close-while-charging') await closeAndOutlive();
  await effect(order.id);
  return { chargeId: `ch_${order.id}` };
};
const acking = (id: string) => void send({ at: 'acking', id });

if (config.broker === 'rabbitmq') {
  const connection = await connectRabbit(config.brokerUrl);
  closeConnection = () => connection.close();
  const channel = await connection.createChannel();
  await channel.prefetch(10);
  // The guide's consumer acks through this channel; its ack is where the process is killed.
  const held = channelWith(channel, {
    ack: (msg: Message) =>
      config.mode === 'after-effect'
        ? acking((JSON.parse(msg.content.toString('utf8')) as Order).id)
        : channel.ack(msg),
  });
  await rabbitConsumer(config.consumerJs, chargeCard)(held, config.queue, engine);
} else {
  const nc = await connectNats({ servers: config.brokerUrl });
  const consumer = await jetstream(nc).consumers.get(config.queue, config.durable);
  const messages = await consumer.consume({ max_messages: 1 });
  async function* held(): AsyncGenerator<JsMsg> {
    for await (const msg of messages) {
      yield new Proxy(msg, {
        get(target, property) {
          if (property === 'ack') return () => acking((msg.json() as Order).id);
          const value = Reflect.get(target, property, target);
          return typeof value === 'function' ? value.bind(target) : value;
        },
      });
    }
  }
  void natsConsumer(config.consumerJs, chargeCard)(held(), engine);
}
await send({ at: 'ready' });

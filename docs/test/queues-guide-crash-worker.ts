// The consumer process queues-guide.int.test.ts kills with SIGKILL: it runs docs/guides/queues.md's
// RabbitMQ or NATS JetStream consumer as written, over an engine with a short lease, and tells the
// parent where it stands so the kill lands at a chosen point:
// - 'before-effect': `chargeCard` says "charging" and never returns: the key is claimed, nothing done;
// - 'after-effect': `chargeCard` counts its effect and returns, the result is stored, and the ack
//   says "acking" instead of acking: the effect is done and stored, the broker still holds the message.
import { type JsMsg, jetstream } from '@nats-io/jetstream';
import { connect as connectNats } from '@nats-io/transport-node';
import { type Channel, connect as connectRabbit, type Message } from 'amqplib';
import { natsConsumer, type Order, rabbitConsumer } from './queues-guide-consumers.js';
import { consumerEngine, openStore, type StorePlace } from './queues-guide-stores.js';

export interface CrashConfig {
  broker: 'rabbitmq' | 'nats';
  brokerUrl: string;
  /** The RabbitMQ queue, or the JetStream stream and durable consumer. */
  queue: string;
  durable: string;
  place: StorePlace;
  mode: 'before-effect' | 'after-effect';
  leaseMs: number;
}

const config = JSON.parse(process.argv[2] ?? '{}') as CrashConfig;
const send = (message: unknown) => new Promise<void>((resolve) => process.send?.(message, () => resolve()));
const { store, effect } = await openStore(config.place);
const engine = consumerEngine(store, config.leaseMs);

const chargeCard = async (order: Order) => {
  if (config.mode === 'before-effect') {
    await send({ at: 'charging', id: order.id });
    return new Promise<never>(() => undefined);
  }
  await effect(order.id);
  return { chargeId: `ch_${order.id}` };
};
const acking = (id: string) => void send({ at: 'acking', id });

if (config.broker === 'rabbitmq') {
  const connection = await connectRabbit(config.brokerUrl);
  const channel = await connection.createChannel();
  await channel.prefetch(10);
  // The guide's consumer acks through this channel; its ack is where the process is killed.
  const held = {
    consume: channel.consume.bind(channel),
    nack: channel.nack.bind(channel),
    ack: (msg: Message) => acking((JSON.parse(msg.content.toString('utf8')) as Order).id),
  } as unknown as Channel;
  await rabbitConsumer(chargeCard)(held, config.queue, engine);
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
  void natsConsumer(chargeCard)(held(), engine);
}
await send({ at: 'ready' });

// The two consumers of docs/guides/queues.md (RabbitMQ and NATS JetStream), and the `retryDelay`
// both call, taken from the page's code blocks at run time and compiled, so queues-guide.int.test.ts and the process it kills run
// the page's own code, never a copy that could drift from it. What the blocks leave to the reader
// (`chargeCard`) is given here. The test compiles them once and hands the JavaScript to the process
// it kills, which so never loads the TypeScript compiler (most of its start-up time).
import { Buffer } from 'node:buffer';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { type IdempotencyEngine, isIdempotencyError, isReplayedFailure, makeIdempotent } from '@idem/core';
import type { JsMsg } from '@nats-io/jetstream';
import type { Channel, Replies } from 'amqplib';

export type Order = { id: string; amount: number };
export type ChargeCard = (order: Order) => Promise<unknown>;

export type RabbitConsumer = (channel: Channel, queue: string, engine: IdempotencyEngine) => Promise<Replies.Consume>;
export type NatsConsumer = (messages: AsyncIterable<JsMsg>, engine: IdempotencyEngine) => Promise<void>;

const guide = fileURLToPath(new URL('../guides/queues.md', import.meta.url));

const tsBlocks = (): string[] =>
  [...readFileSync(guide, 'utf8').matchAll(/^```ts[^\n]*\n([\s\S]*?)^```\s*$/gm)].map((match) => match[1] as string);

/** The top-level `function <name>` of a block, through its closing brace. */
function functionSource(block: string, name: string): string | undefined {
  const start = block.search(new RegExp(`^(?:async )?function ${name}\\(`, 'm'));
  const end = block.indexOf('\n}\n', start);
  return start < 0 || end < 0 ? undefined : block.slice(start, end + 2);
}

/** The `function consumeOrders` of the page's ts block that imports `from`, through its closing brace. */
function consumerSource(from: string): string {
  const block = tsBlocks().find((code) => code.includes(`from '${from}'`));
  if (block === undefined) throw new Error(`docs/guides/queues.md has no ts block importing ${from}`);
  const source = functionSource(block, 'consumeOrders');
  if (source === undefined) throw new Error(`docs/guides/queues.md: the ${from} block has no function consumeOrders`);
  return source;
}

/** The page's `function retryDelay`, which both consumers call. */
function retryDelaySource(): string {
  for (const block of tsBlocks()) {
    const source = functionSource(block, 'retryDelay');
    if (source !== undefined) return source;
  }
  throw new Error('docs/guides/queues.md has no function retryDelay');
}

/** The page's consumer of that block, as JavaScript (a function body that returns `consumeOrders`). */
export async function guideConsumerJs(from: 'amqplib' | '@nats-io/jetstream'): Promise<string> {
  const { default: ts } = await import('typescript');
  return ts.transpileModule(`${retryDelaySource()}\n${consumerSource(from)}\nreturn consumeOrders;`, {
    compilerOptions: { target: ts.ScriptTarget.ES2023 },
  }).outputText;
}

function instantiate(js: string, chargeCard: ChargeCard): unknown {
  return new Function('makeIdempotent', 'isIdempotencyError', 'isReplayedFailure', 'Buffer', 'chargeCard', js)(
    makeIdempotent,
    isIdempotencyError,
    isReplayedFailure,
    Buffer,
    chargeCard,
  );
}

/** The page's RabbitMQ consumer (`guideConsumerJs('amqplib')`), its `chargeCard` being the given one. */
export const rabbitConsumer = (js: string, chargeCard: ChargeCard): RabbitConsumer =>
  instantiate(js, chargeCard) as RabbitConsumer;

/** The page's NATS JetStream consumer (`guideConsumerJs('@nats-io/jetstream')`), with the given `chargeCard`. */
export const natsConsumer = (js: string, chargeCard: ChargeCard): NatsConsumer =>
  instantiate(js, chargeCard) as NatsConsumer;

/**
 * The channel with some of its methods replaced (to count or hold acks): every other property is
 * the channel's own, bound to it, so the guide's code meets a real amqplib channel.
 */
export function channelWith(channel: Channel, replaced: Partial<Pick<Channel, 'ack' | 'nack' | 'consume'>>): Channel {
  return new Proxy(channel, {
    get(target, property) {
      if (Object.hasOwn(replaced, property)) return replaced[property as keyof typeof replaced];
      const value = Reflect.get(target, property, target);
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
}

// The two consumers of docs/guides/queues.md (RabbitMQ and NATS JetStream), taken from the page's
// code blocks at run time and compiled, so queues-guide.int.test.ts and the process it kills run
// the page's own code, never a copy that could drift from it. What the blocks leave to the reader
// (`chargeCard`) is given here.
import { Buffer } from 'node:buffer';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { type IdempotencyEngine, isIdempotencyError, makeIdempotent } from '@idem/core';
import type { JsMsg } from '@nats-io/jetstream';
import type { Channel, Replies } from 'amqplib';
import ts from 'typescript';

export type Order = { id: string; amount: number };
export type ChargeCard = (order: Order) => Promise<unknown>;

export type RabbitConsumer = (channel: Channel, queue: string, engine: IdempotencyEngine) => Promise<Replies.Consume>;
export type NatsConsumer = (messages: AsyncIterable<JsMsg>, engine: IdempotencyEngine) => Promise<void>;

const guide = fileURLToPath(new URL('../guides/queues.md', import.meta.url));

/** The `function consumeOrders` of the page's ts block that imports `from`, through its closing brace. */
function consumerSource(from: string): string {
  const text = readFileSync(guide, 'utf8');
  for (const match of text.matchAll(/^```ts[^\n]*\n([\s\S]*?)^```\s*$/gm)) {
    const block = match[1] as string;
    if (!block.includes(`from '${from}'`)) continue;
    const start = block.search(/^(?:async )?function consumeOrders\(/m);
    const end = block.indexOf('\n}\n', start);
    if (start < 0 || end < 0) throw new Error(`docs/guides/queues.md: the ${from} block has no function consumeOrders`);
    return block.slice(start, end + 2);
  }
  throw new Error(`docs/guides/queues.md has no ts block importing ${from}`);
}

function compile(from: string, chargeCard: ChargeCard): unknown {
  const js = ts.transpileModule(`${consumerSource(from)}\nreturn consumeOrders;`, {
    compilerOptions: { target: ts.ScriptTarget.ES2023 },
  }).outputText;
  return new Function('makeIdempotent', 'isIdempotencyError', 'Buffer', 'chargeCard', js)(
    makeIdempotent,
    isIdempotencyError,
    Buffer,
    chargeCard,
  );
}

/** The page's RabbitMQ consumer, its `chargeCard` being the given one. */
export const rabbitConsumer = (chargeCard: ChargeCard): RabbitConsumer =>
  compile('amqplib', chargeCard) as RabbitConsumer;

/** The page's NATS JetStream consumer, its `chargeCard` being the given one. */
export const natsConsumer = (chargeCard: ChargeCard): NatsConsumer =>
  compile('@nats-io/jetstream', chargeCard) as NatsConsumer;

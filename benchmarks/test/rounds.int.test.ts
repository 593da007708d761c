// `--match` narrows a group to the contenders named by one text or several (A|B), plus the baseline.
import { describe, expect, it } from 'vitest';
// @ts-expect-error: a plain JavaScript module of the runner, without type declarations.
import { runGroup } from '../lib/rounds.mjs';

const group = () => ({
  id: 'g',
  title: 'G',
  unit: 'req/s',
  baseline: 'bare route',
  contenders: [
    'bare route',
    'idem, memoryStore, fresh keys',
    'idem, Redis, fresh keys',
    'minimal layer, fresh keys',
  ].map((name) => ({ name, measure: async () => 100 })),
});

const measured = async (match: string | undefined) => {
  const result = await runGroup(group(), { rounds: 1, quick: false, match }, () => {});
  return result.contenders.map((row: { name: string }) => row.name);
};

describe('runGroup --match', () => {
  it('keeps the baseline and the contenders that contain the text', async () => {
    expect(await measured('Redis')).toEqual(['bare route', 'idem, Redis, fresh keys']);
  });

  it('keeps the contenders that contain any of the texts of A|B', async () => {
    expect(await measured('memoryStore|minimal layer')).toEqual([
      'bare route',
      'idem, memoryStore, fresh keys',
      'minimal layer, fresh keys',
    ]);
  });

  it('keeps every contender without a match', async () => {
    expect(await measured(undefined)).toHaveLength(4);
  });
});

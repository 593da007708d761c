import type { Database } from '../db.js';
import { demoUsers } from '../seed.js';

/** How many stock items are seeded: `item-1` to `item-120`, more than one batch may ask for. */
export const seededStockItems = 120;

const userId = (username: string): string => {
  const user = demoUsers.find((candidate) => candidate.username === username);
  if (!user) throw new Error(`seedApi: demo user ${username} is missing`);
  return user.id;
};

/** The demo photos: three of alice's, two of bob's, so "only the caller's photos" is visible. */
export const demoPhotos = [
  { id: 'photo-alice-1', username: 'alice', title: 'Tea party' },
  { id: 'photo-alice-2', username: 'alice', title: 'Rabbit hole' },
  { id: 'photo-alice-3', username: 'alice', title: 'Looking glass' },
  { id: 'photo-bob-1', username: 'bob', title: 'Scaffolding' },
  { id: 'photo-bob-2', username: 'bob', title: 'Concrete mixer' },
] as const;

/**
 * Seeds the API's demo rows: photos of alice and bob and stock items `item-1` to `item-120`. Rows
 * that exist are kept as they are (a deleted photo stays deleted, a set stock level stays set), so
 * this runs on every start.
 *
 * @example
 * ```ts
 * await migrateApi(db);
 * await seedApi(db);
 * ```
 */
export async function seedApi(db: Database): Promise<void> {
  for (const photo of demoPhotos) {
    await db.query(
      'insert into api_photos (id, owner, title, url) values ($1, $2, $3, $4) on conflict (id) do nothing',
      [photo.id, userId(photo.username), photo.title, `/photos/${photo.id}.jpg`],
    );
  }
  // One statement for every item: generate_series keeps the start fast on PGlite.
  await db.query(
    `insert into api_stock (item, name, level)
       select 'item-' || n, 'Demo item ' || n, (n * 7) % 50
         from generate_series(1, $1::integer) as n
     on conflict (item) do nothing`,
    [seededStockItems],
  );
}

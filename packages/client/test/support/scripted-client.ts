import { type ClientOptions, createClient } from '@idem/client';
import { type Step, scriptedFetch } from './fake-fetch.js';
import { fakeTime, seededRandom } from './fake-time.js';

/** A client on a scripted fetch, a fake clock and a seeded jitter: what it sent is in `seen`. */
export function scriptedClient(steps: Step[], options: Partial<ClientOptions> = {}) {
  const time = fakeTime();
  const { fetch, seen } = scriptedFetch(steps);
  const client = createClient({
    baseUrl: 'https://api.example.test/v1/',
    fetch,
    random: seededRandom(7),
    sleep: time.sleep,
    now: time.now,
    ...options,
  });
  return { client, seen, time };
}

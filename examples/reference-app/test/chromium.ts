// Debian's chromium, driven by playwright-core (never a downloaded browser), for the browser tests.
import { existsSync } from 'node:fs';

/** Where Debian installs chromium (`apt-get install chromium`). */
export const executablePath = '/usr/bin/chromium';

/** Whether it is there. Without it the browser tests skip, except in CI (`CI=true`), where they fail. */
export const hasChromium = existsSync(executablePath);
if (!hasChromium) {
  if (process.env.CI === 'true')
    throw new Error(`${executablePath} is missing and CI=true: the browser tests cannot run`);
  console.warn(
    `\n*** SKIPPING the reference app browser tests: ${executablePath} is missing (apt-get install chromium) ***\n`,
  );
}

/** What every launch passes: headless, and nothing that reaches the network on its own. */
export const chromiumOptions = {
  executablePath,
  headless: true,
  args: [
    '--headless',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
    '--no-first-run',
  ],
};

/**
 * A configuration mistake in an environment variable: `npm start` prints its message, one line that
 * names the variable, and exits 1, instead of a stack trace or a start on something else.
 */
export class ConfigError extends Error {
  override readonly name = 'ConfigError';
}

/**
 * The port in `name`, or `fallback` when it is unset. Set but empty (an unfilled template), or not
 * a whole number from 1 to 65535, is a ConfigError: `Number('')` is 0, which would start the service
 * on a random free port.
 *
 * @example
 * const authPort = envPort(process.env, 'AUTH_PORT', 8081);
 */
export function envPort(env: NodeJS.ProcessEnv, name: string, fallback: number): number {
  const value = env[name];
  if (value === undefined) return fallback;
  const port = wholeNumber(value);
  if (!(port >= 1 && port <= 65_535)) {
    throw new ConfigError(`${name} must be a port number from 1 to 65535, not ${JSON.stringify(value)}`);
  }
  return port;
}

/**
 * The absolute http(s) URL in `name`, or undefined when it is unset or empty. Anything else is a
 * ConfigError: `localhost:8080` would become the tokens' audience and the URL the app calls.
 *
 * @example
 * const baseUrl = envUrl(process.env, 'BASE_URL') ?? 'http://localhost:8080';
 */
export function envUrl(env: NodeJS.ProcessEnv, name: string): string | undefined {
  const value = env[name];
  if (value === undefined || value === '') return undefined;
  let url: URL | undefined;
  try {
    url = new URL(value);
  } catch {
    url = undefined;
  }
  if (url === undefined || (url.protocol !== 'http:' && url.protocol !== 'https:')) {
    throw new ConfigError(`${name} must be an absolute http:// or https:// URL, not ${JSON.stringify(value)}`);
  }
  return value;
}

/**
 * The whole number of seconds from `min` (default 0) to `max` in `name`, or undefined when it is
 * unset. Set but empty (an unfilled template), anything but digits (`30s`, `1.5`, `-1`), or out of
 * bounds is a ConfigError: `Number('')` is 0, which for a reuse interval would turn it off in silence.
 *
 * @example
 * const reuse = envSeconds(process.env, 'REFRESH_TOKEN_REUSE_SECONDS', 1_209_600);
 * const lease = envSeconds(process.env, 'IDEMPOTENCY_LEASE_SECONDS', 604_800, 1);
 * const lifetime = envSeconds(process.env, 'SESSION_LIFETIME_SECONDS', 2_592_000, 1);
 */
export function envSeconds(env: NodeJS.ProcessEnv, name: string, max: number, min = 0): number | undefined {
  const value = env[name];
  if (value === undefined) return undefined;
  const seconds = wholeNumber(value);
  if (!(seconds >= min && seconds <= max)) {
    throw new ConfigError(
      `${name} must be a whole number of seconds from ${min} to ${max}, not ${JSON.stringify(value)}`,
    );
  }
  return seconds;
}

// Digits only (surrounding blanks allowed), else NaN: `Number()` reads '', '1e3', '0x10' and ' 1.5'
// as numbers, each a value nobody meant. At most 15 digits, all exact in a double.
function wholeNumber(value: string): number {
  const trimmed = value.trim();
  return /^\d{1,15}$/.test(trimmed) ? Number(trimmed) : Number.NaN;
}

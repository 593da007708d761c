/** An error as the third-party app's events report it (see {@link withoutToken}). */
export type ReportedError = Error & { error?: string; status?: number; code?: string };

/**
 * The error to report for a token that could not be revoked or refreshed: a new one with the
 * original's name, message, OAuth `error` code, HTTP status and network code (`ECONNREFUSED`), every
 * copy of the token blanked, and nothing else. Never the original: a provider's answer may quote the token back (in an
 * `error_description`, URL-encoded, or in an HTML page left unread in a `Response` cause), and that
 * answer would reach whatever `onEvent` logs.
 */
export function withoutToken(error: unknown, token: string): ReportedError {
  const encoded = encodeURIComponent(token);
  const blank = (text: string) => text.replaceAll(token, '[token]').replaceAll(encoded, '[token]');
  try {
    const source = (typeof error === 'object' && error !== null ? error : {}) as Record<string, unknown>;
    const cause = (typeof source.cause === 'object' && source.cause !== null ? source.cause : {}) as Record<
      string,
      unknown
    >;
    const text = (value: unknown) => (typeof value === 'string' ? blank(value) : undefined);
    const reported = new Error(text(source.message) ?? 'the request to the provider failed');
    reported.name = text(source.name) ?? 'Error';
    const code = text(source.code) ?? text(cause.code);
    return Object.assign(reported, {
      ...(text(source.error) === undefined ? {} : { error: text(source.error) }),
      ...(typeof source.status === 'number' ? { status: source.status } : {}),
      ...(code === undefined ? {} : { code }),
    });
  } catch {
    // A getter that throws, say: the failure is still reported, with nothing of the error.
    return new Error('the request to the provider failed');
  }
}

// isHandshakeRefused is exported for callers with their own retry loop, who must tell a server's
// refusal of their client certificate (final) from a dropped connection exactly as the client does.
// The errors are shaped as undici's fetch gives them: `TypeError: fetch failed`, the cause under it.
import { describe, expect, it } from 'vitest';
import { isHandshakeRefused, isProtocolMismatch } from '../src/index.js';

const fetchFailed = (code: string) =>
  new TypeError('fetch failed', { cause: Object.assign(new Error('ssl3_read_bytes'), { code }) });

describe('isHandshakeRefused', () => {
  it.each([
    'ERR_SSL_TLSV13_ALERT_CERTIFICATE_REQUIRED',
    'ERR_SSL_SSLV3_ALERT_BAD_CERTIFICATE',
    'ERR_SSL_SSL/TLS_ALERT_BAD_CERTIFICATE',
    'ERR_SSL_TLSV1_ALERT_UNKNOWN_CA',
    'ERR_SSL_SSL/TLS_ALERT_HANDSHAKE_FAILURE',
    'ERR_SSL_SSL/TLS_ALERT_CERTIFICATE_EXPIRED',
    'ERR_SSL_TLSV1_ALERT_ACCESS_DENIED',
  ])('%s under fetch failed: true', (code) => {
    expect(isHandshakeRefused(fetchFailed(code))).toBe(true);
  });

  it.each([
    // A dropped connection, TLS 1.3's lost alert among them: the outcome is unknown, not refused.
    'ECONNRESET',
    'UND_ERR_SOCKET',
    'ECONNREFUSED',
    // The client refusing the server's certificate: tls_failed, isCertificateError's business.
    'DEPTH_ZERO_SELF_SIGNED_CERT',
    'ERR_TLS_CERT_ALTNAME_INVALID',
    // An alert about something a retry may fix.
    'ERR_SSL_TLSV1_ALERT_INTERNAL_ERROR',
  ])('%s under fetch failed: false', (code) => {
    expect(isHandshakeRefused(fetchFailed(code))).toBe(false);
  });

  it('is false for what is no error, and stops on a cyclic cause chain', () => {
    expect(isHandshakeRefused(undefined)).toBe(false);
    expect(isHandshakeRefused('ERR_SSL_TLSV1_ALERT_UNKNOWN_CA')).toBe(false);
    const cyclic = new Error('loop') as Error & { cause?: unknown };
    cyclic.cause = cyclic;
    expect(isHandshakeRefused(cyclic)).toBe(false);
  });
});

describe('isProtocolMismatch', () => {
  it.each(['ERR_SSL_TLSV1_ALERT_PROTOCOL_VERSION', 'ERR_SSL_UNSUPPORTED_PROTOCOL', 'ERR_SSL_NO_PROTOCOLS_AVAILABLE'])(
    '%s under fetch failed: true',
    (code) => {
      expect(isProtocolMismatch(fetchFailed(code))).toBe(true);
    },
  );

  it.each([
    'ECONNRESET',
    'UND_ERR_SOCKET',
    'ERR_SSL_TLSV1_ALERT_UNKNOWN_CA',
    'DEPTH_ZERO_SELF_SIGNED_CERT',
    // Also said of a record that is not TLS after the handshake: the request may have gone out.
    'ERR_SSL_WRONG_VERSION_NUMBER',
  ])('%s under fetch failed: false', (code) => {
    expect(isProtocolMismatch(fetchFailed(code))).toBe(false);
  });
});

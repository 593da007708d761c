import { createHash, X509Certificate } from 'node:crypto';
import type { GuardRequest } from './extract-token.js';
import { type NamesAll, refuseUnknownOptions } from './option-names.js';

/**
 * A client certificate as a {@link MtlsOptions.certificate} function gives it: PEM text, DER bytes,
 * a parsed `X509Certificate`, or `undefined` (or `null`) when the request came with none.
 *
 * @example
 * const cert: ClientCertificate = decodeURIComponent(request.headers['x-ssl-client-cert'] as string);
 */
export type ClientCertificate = string | Uint8Array | X509Certificate | null | undefined;

/**
 * mTLS certificate-bound access tokens (RFC 8705 §3) on a guard. A token whose `cnf` holds
 * `x5t#S256` is taken only from a client that presented the certificate with that SHA-256
 * thumbprint. The certificate's chain and validity are the TLS layer's job, not the guard's.
 *
 * @example
 * createGuard({ ...options, mtls: {} }); // the TLS peer certificate of the request's socket
 * createGuard({ ...options, mtls: { certificate: (request) => decodeURIComponent(String(request.headers['x-ssl-client-cert'] ?? '')) || undefined } });
 */
export interface MtlsOptions {
  /**
   * Where the client certificate comes from. Default: the peer certificate of the TLS connection
   * the request came on (`request.socket`, which `guardRequestFromNode` and the framework glue
   * pass). Behind a TLS-terminating proxy, a function reading the header the proxy puts it in: that
   * header must be set by the proxy and removed from what clients send, or a client names any
   * certificate it likes. Called only for a token bound to a certificate, synchronously; a value
   * that is no certificate, or a throw, is read as no certificate (`certificate_missing`).
   */
  certificate?: ((request: GuardRequest) => ClientCertificate) | undefined;
}

const mtlsOptionNames = ['certificate'] as const satisfies readonly (keyof MtlsOptions)[];
const mtlsNamesAll: NamesAll<MtlsOptions, typeof mtlsOptionNames> = true;
void mtlsNamesAll;

/** The checked mTLS settings: how to read a request's client certificate as DER. */
export interface MtlsRuntime {
  certificate: (request: GuardRequest) => ClientCertificate;
}

/**
 * Checks mTLS options; throws a `TypeError` for bad ones.
 *
 * @example
 * const runtime = buildMtls({});
 */
export function buildMtls(options: MtlsOptions): MtlsRuntime {
  if (options === null || typeof options !== 'object') throw new TypeError('mtls must be an object');
  refuseUnknownOptions(options, mtlsOptionNames, 'mtls');
  if (options.certificate !== undefined && typeof options.certificate !== 'function') {
    throw new TypeError('mtls.certificate must be a function of the request returning the client certificate');
  }
  return { certificate: options.certificate ?? socketCertificate };
}

interface PeerCertificateLike {
  raw?: unknown;
}
interface TlsSocketLike {
  encrypted?: unknown;
  getPeerCertificate?: (detailed?: boolean) => PeerCertificateLike | null | undefined;
}

// The certificate the client presented in the TLS handshake, read from a Node TLSSocket. A plain
// socket (no TLS) has none. With `requestCert` off, or a client that sent none, Node answers `{}`:
// no `raw`, so no certificate. `false`: the leaf alone, which is all the thumbprint covers, without
// building the chain objects `true` would.
function socketCertificate(request: GuardRequest): ClientCertificate {
  const socket = request.socket as TlsSocketLike | null | undefined;
  if (typeof socket !== 'object' || socket === null || socket.encrypted !== true) return undefined;
  if (typeof socket.getPeerCertificate !== 'function') return undefined;
  const raw = socket.getPeerCertificate(false)?.raw;
  return raw instanceof Uint8Array && raw.length > 0 ? raw : undefined;
}

// DER of a certificate in any accepted form, or undefined when it is no certificate. Parsed even
// when bytes are given: PEM passed as bytes gives its DER, and bytes that are no certificate give
// none rather than a thumbprint of garbage.
function derOf(value: ClientCertificate): Uint8Array | undefined {
  if (value instanceof X509Certificate) return value.raw;
  // A JavaScript function may return anything: only text and bytes are parsed.
  if (!(typeof value === 'string' || value instanceof Uint8Array) || value.length === 0) return undefined;
  try {
    return new X509Certificate(value).raw;
  } catch {
    return undefined;
  }
}

/**
 * The RFC 8705 §3.1 thumbprint of a certificate: base64url (no padding) of SHA-256 over its DER.
 *
 * @example
 * certificateThumbprint(new X509Certificate(pem)); // 'bwcK0esc3ACC3DB2Y5_lESsXE8o9ltc05O89jdN-dg2'
 */
export function certificateThumbprint(certificate: X509Certificate | Uint8Array): string {
  const der = certificate instanceof X509Certificate ? certificate.raw : certificate;
  return createHash('sha256').update(der).digest('base64url');
}

/**
 * The thumbprint of the request's client certificate, or undefined when it presented none (or none
 * that parses). A throw from a caller's function is read as none: a header value it cannot decode
 * is a bad request, never a 500.
 *
 * @example
 * const x5t = presentedThumbprint(runtime, request);
 */
export function presentedThumbprint(runtime: MtlsRuntime, request: GuardRequest): string | undefined {
  let value: ClientCertificate;
  try {
    value = runtime.certificate(request);
  } catch {
    return undefined;
  }
  const der = derOf(value);
  return der === undefined ? undefined : certificateThumbprint(der);
}

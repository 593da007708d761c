/**
 * The default header carrying the internal token from the gateway to a service.
 *
 * @example
 * req.headers[defaultInternalTokenHeader]; // the gateway's token
 */
export const defaultInternalTokenHeader = 'idem-internal-token';

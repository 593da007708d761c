export { discoverProvider, type ProviderMetadata } from './discovery.js';
export { type GatewayOptions, type RunningGateway, startGateway } from './server.js';

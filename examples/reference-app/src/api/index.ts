export { idempotencyLogger, idempotencyLogLine } from '../idempotency-log.js';
export { type Charge, type ChargeRouteOptions, maxChargeAmount, registerChargeRoutes } from './charges.js';
export { principalOf } from './internal-auth.js';
export { maxPhotoTitle, type Photo, registerPhotoRoutes } from './photos.js';
export { type ApiProblemCode, apiProblemTable, problemType, sendProblem } from './problem.js';
export { type ResourceStackOptions, type RunningResourceStack, startResourceStack } from './resource-stack.js';
export { type ApiOptions, type InternalTokenTrust, type RunningApi, startApi } from './server.js';
export { defaultSettings, registerSettingsRoutes, type Settings, themes } from './settings.js';
export { maxBatchItems, maxStockLevel, registerStockRoutes, type StockLevel } from './stock.js';
export {
  type Checked,
  isIntegerIn,
  jsonObjectBody,
  refuseInvalid,
  resourceId,
  unknownFields,
} from './validation.js';

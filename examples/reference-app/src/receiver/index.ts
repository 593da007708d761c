export {
  applyChargeEvent,
  type ChargeEvent,
  type ChargeState,
  findChargeState,
} from './charges.js';
export {
  findReceivedEvent,
  listReceivedEvents,
  type PaymentSucceeded,
  type ReceivedEventRow,
  recordApplied,
  recordDelivery,
} from './events.js';
export { eventsPage } from './page.js';
export {
  type AdminApiOptions,
  adminApi,
  type ReceiverOptions,
  type RunningReceiver,
  receiverAdminPrefix,
  startReceiver,
} from './server.js';

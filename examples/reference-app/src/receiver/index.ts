export {
  listReceivedEvents,
  type PaymentSucceeded,
  type ReceivedEventRow,
  recordApplied,
  recordDelivery,
} from './events.js';
export { eventsPage } from './page.js';
export { type ReceiverOptions, type RunningReceiver, startReceiver } from './server.js';

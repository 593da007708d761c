import { escapeHtml, htmlPage } from '../html.js';
import type { ReceivedEventRow } from './events.js';

function appliedText(applied: number): string {
  if (applied === 1) return 'once';
  if (applied === 0) return 'not yet';
  return `${applied} times (duplicate effect!)`;
}

/**
 * The receiver's page: every event with how many deliveries it took and how often it was applied.
 * It refreshes itself every 5 seconds (a meta refresh: the page's CSP allows no script).
 *
 * @example
 * ```ts
 * ctx.body = eventsPage(await listReceivedEvents(db));
 * ```
 */
export function eventsPage(events: readonly ReceivedEventRow[]): string {
  const rows = events
    .map(
      (event) => `<tr data-event-id="${escapeHtml(event.id)}">
<td><code>${escapeHtml(event.id)}</code></td>
<td>${escapeHtml(event.type ?? '')}</td>
<td>${event.amount === null ? '' : `${escapeHtml(event.amount)} ${escapeHtml(event.currency ?? '')}`}</td>
<td class="deliveries">${escapeHtml(event.deliveries)}</td>
<td class="applied">${escapeHtml(appliedText(event.applied))}</td>
</tr>`,
    )
    .join('\n');
  const table =
    events.length === 0
      ? '<p>No events yet. Create a charge in the photo app: its <code>payment.succeeded</code> event arrives here.</p>'
      : `<table>
<caption>Webhook events, newest first</caption>
<thead><tr><th scope="col">Event</th><th scope="col">Type</th><th scope="col">Amount</th><th scope="col">Deliveries</th><th scope="col">Applied</th></tr></thead>
<tbody>
${rows}
</tbody>
</table>`;
  return htmlPage(
    'Webhook receiver',
    `<h1>Webhook receiver</h1>
<p>Standard Webhooks signatures are verified; each event id goes through the inbox, so however many
deliveries an event takes, its effect is applied once.</p>
${table}`,
  ).replace('<meta charset="utf-8">', '<meta charset="utf-8">\n<meta http-equiv="refresh" content="5">');
}

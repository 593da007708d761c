import { escapeHtml, htmlPage } from '../html.js';
import type { ReceivedEventRow } from './events.js';

function appliedText(applied: number): string {
  if (applied === 1) return 'once';
  if (applied === 0) return 'not yet';
  return `${applied} times (duplicate effect!)`;
}

/** How {@link eventsPage} is shown: the page token its links carry, and whether it reloads itself. */
export interface EventsPageView {
  token: string;
  refresh: boolean;
}

/**
 * The receiver's page: every event with how many deliveries it took and how often it was applied.
 * It reloads itself every 5 seconds (a meta refresh: the page's CSP allows no script), unless the
 * person reading it stopped that: a reload sends a screen reader back to the top of the page (WCAG
 * 2.2.1), so a "Stop refreshing" link comes first, and the page without refresh offers a link back.
 *
 * @example
 * ```ts
 * ctx.body = eventsPage(await listReceivedEvents(db), { token, refresh: ctx.query.refresh !== 'off' });
 * ```
 */
export function eventsPage(events: readonly ReceivedEventRow[], view: EventsPageView): string {
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
  const token = encodeURIComponent(view.token);
  const still = `?token=${token}&amp;refresh=off`;
  const controls = view.refresh
    ? `<p><a href="${still}">Stop refreshing</a> (this page reloads every 5 seconds)</p>`
    : `<p><a href="${still}">Refresh</a> · <a href="?token=${token}">Refresh every 5 seconds</a></p>`;
  const page = htmlPage(
    'Webhook receiver',
    `<h1>Webhook receiver</h1>
${controls}
<p>Standard Webhooks signatures are verified; each event id goes through the inbox, so however many
deliveries an event takes, its effect is applied once.</p>
${table}`,
  );
  return view.refresh
    ? page.replace('<meta charset="utf-8">', '<meta charset="utf-8">\n<meta http-equiv="refresh" content="5">')
    : page;
}

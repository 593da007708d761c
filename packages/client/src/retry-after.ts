const months: Readonly<Record<string, number>> = {
  Jan: 0,
  Feb: 1,
  Mar: 2,
  Apr: 3,
  May: 4,
  Jun: 5,
  Jul: 6,
  Aug: 7,
  Sep: 8,
  Oct: 9,
  Nov: 10,
  Dec: 11,
};

// The three HTTP-date forms a recipient must accept (RFC 9110 5.6.7). Date.parse is not used: it
// accepts many other shapes and reads the zone-less asctime form as local time.
const imfFixdate = /^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), (\d{2}) ([A-Z][a-z]{2}) (\d{4}) (\d{2}):(\d{2}):(\d{2}) GMT$/;
const rfc850Date =
  /^(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), (\d{2})-([A-Z][a-z]{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2}) GMT$/;
const asctimeDate = /^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) ([A-Z][a-z]{2}) ([ \d]\d) (\d{2}):(\d{2}):(\d{2}) (\d{4})$/;

/**
 * Parses an HTTP-date (IMF-fixdate, obsolete RFC 850 or asctime) to epoch milliseconds, or
 * `undefined` when the text is none of them. `now` (epoch ms) only places the two-digit years of the
 * RFC 850 form in their century.
 *
 * @example
 * parseHttpDate('Sun, 06 Nov 1994 08:49:37 GMT'); // 784111777000
 */
export function parseHttpDate(text: string, now: number = Date.now()): number | undefined {
  const parts = dateParts(text, now);
  if (parts === undefined) return undefined;
  const monthIndex = months[parts.month];
  if (monthIndex === undefined) return undefined;
  // Date.UTC rolls impossible fields over (31 Feb is 3 Mar, 99:99:99 four days later): such a date
  // names no moment, and is no Retry-After. A leap second (:60) is kept, as RFC 9110's grammar has it.
  if (parts.hour > 23 || parts.minute > 59 || parts.second > 60) return undefined;
  const ms = Date.UTC(parts.year, monthIndex, parts.day, parts.hour, parts.minute, parts.second);
  if (Number.isNaN(ms)) return undefined;
  const date = new Date(Date.UTC(parts.year, monthIndex, parts.day));
  return date.getUTCDate() === parts.day && date.getUTCMonth() === monthIndex ? ms : undefined;
}

interface DateParts {
  year: number;
  month: string;
  day: number;
  hour: number;
  minute: number;
  second: number;
}

function dateParts(text: string, now: number): DateParts | undefined {
  const imf = imfFixdate.exec(text);
  if (imf) {
    const [, day, month, year, hour, minute, second] = imf;
    return {
      year: Number(year),
      month: month as string,
      day: Number(day),
      hour: Number(hour),
      minute: Number(minute),
      second: Number(second),
    };
  }
  const rfc850 = rfc850Date.exec(text);
  if (rfc850) {
    const [, day, month, yy, hour, minute, second] = rfc850;
    // RFC 9110: a two-digit year that looks more than 50 years in the future is in the past century.
    const thisYear = new Date(now).getUTCFullYear();
    const year = 2000 + Number(yy) > thisYear + 50 ? 1900 + Number(yy) : 2000 + Number(yy);
    return {
      year,
      month: month as string,
      day: Number(day),
      hour: Number(hour),
      minute: Number(minute),
      second: Number(second),
    };
  }
  const asctime = asctimeDate.exec(text);
  if (asctime) {
    const [, month, day, hour, minute, second, year] = asctime;
    return {
      year: Number(year),
      month: month as string,
      day: Number(day?.trim()),
      hour: Number(hour),
      minute: Number(minute),
      second: Number(second),
    };
  }
  return undefined;
}

// A response with the header twice (a framework and a proxy both set it) reaches fetch's Headers as
// one value, the two joined by ", ". When every copy is the same, that is the value; copies that
// differ are left as they are, and parse as nothing: which one the server meant is unknown. An
// HTTP-date holds a comma itself, so the copies are not found by splitting on commas: one value
// holds at most one ", " (an IMF-fixdate's or an RFC 850 date's), so the first copy ends at the
// first or the second ", " of the text, and the text is that copy repeated, whatever the count.
function onlyValue(text: string): string {
  let end = -1;
  for (let tries = 0; tries < 2; tries++) {
    end = text.indexOf(', ', end + 1);
    if (end < 1) break;
    const copies = (text.length + 2) / (end + 2);
    if (!Number.isInteger(copies)) continue;
    const first = text.slice(0, end);
    if (Array.from({ length: copies }, () => first).join(', ') === text) return first;
  }
  // delay-seconds copies joined without the space, or with more of it.
  const members = text.split(',').map((member) => member.trim());
  if (members.length > 1 && members.every((member) => /^\d+$/.test(member) && member === members[0])) {
    return members[0] as string;
  }
  return text;
}

/**
 * Reads a `Retry-After` field value as a wait in milliseconds from `now` (epoch ms): either
 * delay-seconds (`'3'` gives 3000) or an HTTP-date (a date in the past gives 0); the same value
 * repeated (`'3, 3'`, the header sent twice) is that value. Anything else, or no value, gives
 * `undefined`, and the client falls back to its backoff.
 *
 * @example
 * parseRetryAfter('3', Date.now()); // 3000
 * parseRetryAfter('Wed, 21 Oct 2026 07:28:00 GMT', Date.parse('2026-10-21T07:27:55Z')); // 5000
 */
export function parseRetryAfter(value: string | null | undefined, now: number): number | undefined {
  if (value === null || value === undefined) return undefined;
  const text = onlyValue(value.trim());
  if (/^\d+$/.test(text)) return Number(text) * 1000;
  const at = parseHttpDate(text, now);
  return at === undefined ? undefined : Math.max(0, at - now);
}

/**
 * The wait a response asks for with `Retry-After`, in milliseconds, or `undefined`. An HTTP-date is
 * measured from the response's own `Date` when it has a valid one: both come from the server's
 * clock, so a client whose clock is minutes off still waits what the server meant.
 *
 * @example
 * retryAfterOf(response.headers, Date.now()); // 5000 for Retry-After 5 s after the response's Date
 */
export function retryAfterOf(headers: { get(name: string): string | null }, now: number): number | undefined {
  const value = headers.get('retry-after');
  if (value === null) return undefined;
  const date = headers.get('date');
  // A Date sent twice with one value (a proxy adding its own beside the origin's) is that date.
  const serverNow = date === null ? undefined : parseHttpDate(onlyValue(date.trim()), now);
  return parseRetryAfter(value, serverNow ?? now);
}

// A horizontal bar chart of the targets' ratios, written as plain SVG: one bar per target (its
// median over rounds), a whisker from min to max, and a tick where the target lies. Green bars met
// their target, red ones missed it. No chart library: the markup is small and stays diffable.
import { ratioText } from './stats.mjs';

const escapeXml = (text) =>
  String(text).replaceAll('&', '&amp;').replaceAll('<', '&lt;').replaceAll('>', '&gt;').replaceAll('"', '&quot;');

/**
 * SVG markup for the ratio targets of `evaluated` (rows from evaluateTargets). Targets that are
 * rates rather than ratios, or that were not measured, are left out of the chart (the table has them).
 *
 * @example
 * writeFileSync('docs/benchmarks-ratios.svg', ratioChart(evaluateTargets(groups), 'Ratios, 2026-11-21'));
 */
export function ratioChart(evaluated, title) {
  // A target whose row failed in some round keeps its figures but has no verdict: not drawn either.
  const rows = evaluated.filter((row) => row.kind === 'ratio' && row.measured && row.verdict !== 'not measured');
  const labelWidth = 520;
  const plotWidth = 380;
  const rowHeight = 22;
  const top = 48;
  const width = labelWidth + plotWidth + 60;
  const height = top + rows.length * rowHeight + 40;
  const scaleMax = Math.max(1.2, ...rows.map((row) => Math.max(row.measured.max, row.threshold) * 1.05));
  const x = (value) => labelWidth + (Math.min(value, scaleMax) / scaleMax) * plotWidth;
  const parts = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="system-ui, sans-serif" font-size="12">`,
    `<title>${escapeXml(title)}</title>`,
    `<rect width="${width}" height="${height}" fill="#ffffff"/>`,
    `<text x="12" y="22" font-size="15" font-weight="bold">${escapeXml(title)}</text>`,
    `<text x="12" y="38" fill="#555">Bar: median ratio over rounds; whisker: min to max; black tick: the target. Green met, red missed.</text>`,
  ];
  // Grid lines at a step that keeps the axis labels apart (0.5 up to 3, then 1, then 2).
  const step = scaleMax <= 3 ? 0.5 : scaleMax <= 6 ? 1 : 2;
  for (let tick = 0; tick <= scaleMax + 1e-9; tick += step) {
    const position = x(tick).toFixed(1);
    parts.push(
      `<line x1="${position}" y1="${top - 4}" x2="${position}" y2="${top + rows.length * rowHeight}" stroke="#e3e3e3"/>`,
      `<text x="${position}" y="${top + rows.length * rowHeight + 16}" text-anchor="middle" fill="#555">${tick.toFixed(1)}</text>`,
    );
  }
  rows.forEach((row, index) => {
    const y = top + index * rowHeight;
    const { median, min, max } = row.measured;
    const color = row.verdict === 'met' ? '#2e8b57' : '#c0392b';
    const shown = ratioText(median, row.threshold);
    parts.push(
      `<text x="${labelWidth - 8}" y="${y + 15}" text-anchor="end">${escapeXml(`#${row.issue} ${row.text}`)}</text>`,
      `<rect x="${labelWidth}" y="${y + 4}" width="${(x(median) - labelWidth).toFixed(1)}" height="${rowHeight - 8}" fill="${color}"><title>${escapeXml(`${row.text}: ${shown} (target ${row.threshold})`)}</title></rect>`,
      `<line x1="${x(min).toFixed(1)}" y1="${y + rowHeight / 2}" x2="${x(max).toFixed(1)}" y2="${y + rowHeight / 2}" stroke="#333" stroke-width="1.5"/>`,
      `<line x1="${x(row.threshold).toFixed(1)}" y1="${y + 1}" x2="${x(row.threshold).toFixed(1)}" y2="${y + rowHeight - 1}" stroke="#000" stroke-width="2.5"/>`,
      `<text x="${(x(Math.max(median, max, row.threshold)) + 6).toFixed(1)}" y="${y + 15}" fill="#333">${shown}</text>`,
    );
  });
  parts.push('</svg>');
  return `${parts.join('\n')}\n`;
}

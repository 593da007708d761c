// Summary statistics of a handful of samples. A bench run has 1 to 5 rounds, so the median (the
// middle sample, or the mean of the two middle ones) is the figure reported: one noisy round on a
// shared 2-core box moves it far less than it moves a mean.

/**
 * Median, min and max of numeric samples, or `undefined` when there are none.
 *
 * @example
 * summarize([3, 1, 2]); // { median: 2, min: 1, max: 3 }
 */
export function summarize(values) {
  const finite = values.filter((value) => Number.isFinite(value));
  if (finite.length === 0) return undefined;
  const sorted = [...finite].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  const median = sorted.length % 2 === 1 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2;
  return { median, min: sorted[0], max: sorted[sorted.length - 1] };
}

/**
 * Per-round ratios `numerator[i] / denominator[i]`, skipping rounds where either side has no sample.
 * Ratios are taken round by round (not as a ratio of medians) so that both sides of each ratio saw
 * the same moment of the machine's load.
 *
 * @example
 * roundRatios([10, 12], [20, 20]); // [0.5, 0.6]
 */
export function roundRatios(numerator, denominator) {
  const ratios = [];
  const rounds = Math.min(numerator.length, denominator.length);
  for (let round = 0; round < rounds; round++) {
    const top = numerator[round];
    const bottom = denominator[round];
    if (Number.isFinite(top) && Number.isFinite(bottom) && bottom > 0) ratios.push(top / bottom);
  }
  return ratios;
}

/**
 * A ratio for print beside the `threshold` it is judged against: two decimals, or as many more as it
 * takes (up to six) not to print a ratio below the threshold as the threshold itself, which would
 * read "0.85, missed" beside "≥ 0.85".
 *
 * @example
 * ratioText(0.849, 0.85); // '0.849'
 * ratioText(0.8466, 0.9); // '0.85'
 */
export function ratioText(value, threshold) {
  let digits = 2;
  while (value < threshold && Number(value.toFixed(digits)) >= threshold && digits < 6) digits++;
  return value.toFixed(digits);
}

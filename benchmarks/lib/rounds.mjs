// Contenders of a group take turns, round after round (A B C A B C ...), so drift in the machine's
// load (other processes on the 2 shared cores, the page cache, the database's checkpoints) lands on
// every contender alike. Each ratio is taken within a round and the median over rounds is reported.
import { roundRatios, summarize } from './stats.mjs';

/**
 * Runs one group: every contender once per round, in order, the baseline first. A contender that
 * fails is measured no more and reported as "not measured" with the reason; one that is known to be
 * unavailable up front (`unavailable: 'reason'`) is never started. In quick mode only the
 * contenders marked `quick: true` run.
 *
 * @example
 * const group = await runGroup({
 *   id: 'limits', title: 'Limits', unit: 'req/s', baseline: 'node:http',
 *   contenders: [{ name: 'node:http', measure: () => measureServer(...) }],
 * }, { rounds: 3 }, console.log);
 */
export async function runGroup(fullDefinition, settings, log) {
  // Quick mode only proves the runner works: a group keeps the contenders marked `quick`.
  // `--match` narrows a group to some contenders and the baseline their ratios need.
  const texts = settings.match?.split('|');
  const kept = fullDefinition.contenders.filter(
    (contender) =>
      (!settings.quick || contender.quick) &&
      (!texts || contender.name === fullDefinition.baseline || texts.some((text) => contender.name.includes(text))),
  );
  const definition = { ...fullDefinition, contenders: kept };
  // A baseline left alone by `--match` has nothing to be compared with: skip the whole group.
  if (settings.match && kept.every((contender) => contender.name === fullDefinition.baseline)) {
    definition.contenders = [];
  }
  const samples = new Map(definition.contenders.map((contender) => [contender.name, []]));
  const failures = new Map();
  // The round (from 1) in which a contender that had been measured failed: its earlier samples stay.
  const failedIn = new Map();
  const details = new Map(definition.contenders.map((contender) => [contender.name, []]));
  for (const contender of definition.contenders) {
    if (contender.unavailable) failures.set(contender.name, contender.unavailable);
  }
  for (let round = 0; round < settings.rounds; round++) {
    for (const contender of definition.contenders) {
      const own = samples.get(contender.name);
      if (failures.has(contender.name)) {
        own.push(Number.NaN);
        continue;
      }
      try {
        // A measurement is a rate, or `{ value, details }` with what else the window showed (statuses,
        // p99, the server's CPU per request).
        const measured = await contender.measure();
        const value = typeof measured === 'number' ? measured : measured.value;
        if (typeof measured !== 'number') details.get(contender.name)[round] = measured.details;
        own.push(value);
        log(
          `  [${definition.id}] round ${round + 1}: ${contender.name.padEnd(52)} ${format(value)} ${definition.unit}`,
        );
      } catch (error) {
        own.push(Number.NaN);
        const reason = error instanceof Error ? error.message : String(error);
        failures.set(contender.name, reason);
        failedIn.set(contender.name, round + 1);
        log(`  [${definition.id}] round ${round + 1}: ${contender.name} not measured: ${reason}`);
      }
    }
  }
  const baseline = samples.get(definition.baseline) ?? [];
  const cpuOf = (name) => (details.get(name) ?? []).map((detail) => detail?.cpuMicrosPerRequest ?? Number.NaN);
  const baselineCpu = cpuOf(definition.baseline);
  const result = {
    id: definition.id,
    title: definition.title,
    unit: definition.unit,
    baseline: definition.baseline,
    rounds: settings.rounds,
    ...(definition.note ? { note: definition.note } : {}),
    contenders: definition.contenders.map((contender) => {
      const values = samples.get(contender.name);
      const stats = summarize(values);
      const row = { name: contender.name, samples: values.map((v) => (Number.isFinite(v) ? v : null)) };
      if (!stats) return { ...row, notMeasured: failures.get(contender.name) ?? 'no sample' };
      // Measured in some rounds, then failed: the row keeps those samples and says so, so that no
      // target is called met on the rounds that happened to pass (lib/targets.mjs).
      const failure = failedIn.has(contender.name)
        ? { failure: { round: failedIn.get(contender.name), reason: failures.get(contender.name) } }
        : {};
      const ratio = contender.name === definition.baseline ? undefined : summarize(roundRatios(values, baseline));
      const own = details.get(contender.name);
      const latency = summarize(own.map((detail) => detail?.latencyP99Ms ?? Number.NaN));
      const cpu = summarize(cpuOf(contender.name));
      // The baseline's CPU per request over this one's, round by round: 1 is no overhead, and
      // unlike the throughput ratio it does not depend on how fast the load generator was.
      const cpuRatio =
        contender.name === definition.baseline ? undefined : summarize(roundRatios(baselineCpu, cpuOf(contender.name)));
      return {
        ...row,
        ...stats,
        ...failure,
        ...(ratio ? { ratio } : {}),
        ...(latency ? { latencyP99Ms: latency.median } : {}),
        ...(cpu ? { cpuMicrosPerRequest: cpu } : {}),
        ...(cpuRatio ? { cpuRatio } : {}),
        ...(own.some(Boolean) ? { details: own.map((detail) => detail ?? null) } : {}),
      };
    }),
  };
  // Extra ratios between two contenders other than the baseline, also taken round by round.
  if (definition.comparisons) {
    result.comparisons = definition.comparisons.map(([numerator, denominator]) => ({
      numerator,
      denominator,
      ratio: compare(result, numerator, denominator) ?? null,
    }));
  }
  return result;
}

/**
 * The texts of `--match` (`A|B|...`) that name no contender measured beside a baseline in `groups`
 * (the groups of a run's results): a typo or a wrong case would otherwise measure nothing silently.
 *
 * @example
 * unmatchedTexts('Redis|redis', groups); // ['redis']
 */
export function unmatchedTexts(match, groups) {
  const names = groups.flatMap((group) =>
    group.contenders.filter((row) => row.name !== group.baseline).map((row) => row.name),
  );
  return match.split('|').filter((text) => !names.some((name) => name.includes(text)));
}

/**
 * The contender called `name` in `group` (a group of a run's results), or undefined when the group
 * or the row is missing.
 *
 * @example
 * rowOf(group, 'bare route')?.median;
 */
export function rowOf(group, name) {
  return group?.contenders.find((row) => row.name === name);
}

/**
 * The ratio of two contenders of one group, round by round, summarised; `undefined` when either
 * side has no sample.
 *
 * @example
 * compare(group, 'idem on memoryStore, fresh keys', 'express-idempotency (memory), fresh keys');
 */
export function compare(group, numerator, denominator) {
  const top = rowOf(group, numerator);
  const bottom = rowOf(group, denominator);
  if (!top || !bottom) return undefined;
  const values = (row) => row.samples.map((v) => (v === null ? Number.NaN : v));
  return summarize(roundRatios(values(top), values(bottom)));
}

function format(value) {
  return Math.round(value).toLocaleString('en').padStart(10);
}

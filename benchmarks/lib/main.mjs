// The side-by-side benchmark runner, started by benchmarks/run.mjs under tsx. Runs the suites one
// after the other, writes benchmarks/results/<date>.json (every sample of every round), and for a
// full run of every suite regenerates docs/benchmarks.md and docs/benchmarks-ratios.svg. Quick runs
// and runs of a few suites write their page and chart beside the results file instead, so short,
// noisy figures never replace the published ones.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { adaptersSuite } from '../suites/adapters.mjs';
import { coreSuite } from '../suites/core.mjs';
import { functionLevelSuite } from '../suites/function-level.mjs';
import { guardSuite } from '../suites/guard.mjs';
import { limitsSuite } from '../suites/limits.mjs';
import { referenceAppSuite } from '../suites/reference-app.mjs';
import { storesPostgresSuite } from '../suites/stores-postgres.mjs';
import { storesRedisSuite } from '../suites/stores-redis.mjs';
import { parseArgs, publishable, usage } from './args.mjs';
import { renderReport } from './report.mjs';
import { unmatchedTexts } from './rounds.mjs';
import { checkServices } from './services.mjs';
import { ratioText } from './stats.mjs';
import { ratioChart } from './svg-chart.mjs';
import { evaluateTargets } from './targets.mjs';
import { installedVersions } from './versions.mjs';

const root = dirname(dirname(dirname(fileURLToPath(import.meta.url))));
// A signal would end the runner without its 'exit' listeners, which stop what the suites started
// (the Redis suite's own redis-server): exit instead, so they run. Server children clean up on
// their own when the IPC channel closes (lib/child-process.mjs).
for (const [signal, code] of [
  ['SIGINT', 130],
  ['SIGTERM', 143],
]) {
  process.on(signal, () => process.exit(code));
}
// Cheapest first, so a quick run proves every kind of suite before the long HTTP ones.
const allSuites = [
  coreSuite,
  limitsSuite,
  storesRedisSuite,
  storesPostgresSuite,
  functionLevelSuite,
  adaptersSuite,
  guardSuite,
  referenceAppSuite,
];

let settings;
try {
  settings = parseArgs(process.argv.slice(2), root);
} catch (error) {
  console.error(`${error.message}\n\n${usage}`);
  process.exit(2);
}
if (settings.help) {
  console.log(usage);
  process.exit(0);
}
if (settings.list) {
  for (const suite of allSuites) console.log(`${suite.id.padEnd(16)} ${suite.title}`);
  process.exit(0);
}
if (settings.render) {
  // The page and chart are pure functions of a results file: a format change needs no new run. The
  // targets are evaluated again from the saved groups, so their explanations are those of
  // lib/targets.mjs as it is now (the figures and verdicts come from the same samples as before).
  const read = JSON.parse(readFileSync(settings.render, 'utf8'));
  const saved = {
    ...read,
    targets: evaluateTargets(
      read.suites.flatMap((suite) => suite.groups),
      read.suitesRun ?? read.suites.map((suite) => suite.id),
    ),
  };
  mkdirSync(settings.docsDir, { recursive: true });
  writeFileSync(
    join(settings.docsDir, 'benchmarks-ratios.svg'),
    ratioChart(saved.targets, `idem benchmark ratios, ${saved.startedAt.slice(0, 10)}`),
  );
  writeFileSync(join(settings.docsDir, 'benchmarks.md'), renderReport(saved, 'benchmarks-ratios.svg'));
  console.log(`rewrote ${join(settings.docsDir, 'benchmarks.md')} and the chart from ${settings.render}`);
  process.exit(0);
}
const unknown = settings.suites.filter((id) => !allSuites.some((suite) => suite.id === id));
if (unknown.length > 0) {
  console.error(`unknown suite(s): ${unknown.join(', ')}; --list shows them`);
  process.exit(2);
}
const selected =
  settings.suites.length === 0 ? allSuites : allSuites.filter((suite) => settings.suites.includes(suite.id));

const started = new Date();
const startLoad = loadavg();
const log = (line) => console.log(line);
const services = await checkServices();
for (const [name, reason] of Object.entries(services)) {
  if (reason) console.warn(`\n!! ${name} is not reachable (${reason}): its scenarios are listed as not measured.\n`);
}
const context = {
  log,
  unavailable: (kind) =>
    kind === 'memory' ? undefined : services[kind] ? `${kind} unreachable: ${services[kind]}` : undefined,
};

const suites = [];
const notMeasured = [];
for (const suite of selected) {
  log(`\n== ${suite.id}: ${suite.title}`);
  try {
    const outcome = await suite.run(settings, context);
    suites.push({
      id: suite.id,
      title: suite.title,
      groups: outcome.groups.filter((group) => group.contenders.length > 0),
    });
    notMeasured.push(...(outcome.notMeasured ?? []).map((item) => ({ suite: suite.id, ...item })));
  } catch (error) {
    const reason = error instanceof Error ? error.message : String(error);
    log(`   ${suite.id} failed: ${reason}`);
    notMeasured.push({ suite: suite.id, scenario: suite.title, reason });
  }
}

const finished = new Date();
const groups = suites.flatMap((suite) => suite.groups);
if (settings.match) {
  const unmatched = unmatchedTexts(settings.match, groups);
  const texts = unmatched.map((text) => `"${text}"`).join(', ');
  const where = selected.map((suite) => suite.id).join(', ');
  // Nothing measured at all: no page of empty tables, and a status a script can see.
  if (unmatched.length === settings.match.split('|').length) {
    console.error(`--match measured nothing: no contender of ${where} contains ${texts} (names are case-sensitive)`);
    // A suite that could not run at all (a missing tool, a service down) says why.
    const skipped = notMeasured.filter(
      (item) => !suites.some((suite) => suite.id === item.suite && suite.groups.length),
    );
    for (const item of skipped) console.error(`  ${item.scenario}: ${item.reason}`);
    process.exit(2);
  }
  if (unmatched.length > 0) console.warn(`\n!! --match: no contender of ${where} contains ${texts}\n`);
}
const results = {
  format: 'idem-bench/1',
  startedAt: started.toISOString(),
  finishedAt: finished.toISOString(),
  elapsedSeconds: (finished.getTime() - started.getTime()) / 1_000,
  quick: settings.quick,
  suitesRun: selected.map((suite) => suite.id),
  machine: {
    node: process.version,
    platform: `${process.platform} ${process.arch}`,
    cpus: cpus().length,
    cpuModel: cpus()[0]?.model?.trim() ?? 'unknown',
    loadAverage: startLoad,
    loadAverageAtEnd: loadavg(),
  },
  versions: installedVersions(root),
  settings: {
    rounds: settings.rounds,
    durationSeconds: settings.durationSeconds,
    warmupSeconds: settings.warmupSeconds,
    connections: settings.connections,
    // What was measured: the packages as built (benchmarks/run.mjs); results before this field ran
    // the TypeScript sources under tsx.
    packages: 'dist',
    ...(settings.match ? { match: settings.match } : {}),
  },
  services: Object.fromEntries(Object.entries(services).map(([name, reason]) => [name, reason ?? 'reachable'])),
  suites,
  notMeasured,
  targets: evaluateTargets(
    groups,
    selected.map((suite) => suite.id),
  ),
};

const date = started.toISOString().slice(0, 10);
// Only a full run of every contender, rounds and windows at least the defaults, may replace the
// published page; anything narrower or shorter is a trial.
const complete = publishable(settings);
const base = `${date}${complete ? '' : '-quick'}${settings.suites.length > 0 ? `-${settings.suites.join('-')}` : ''}`;
mkdirSync(settings.outDir, { recursive: true });
const resultsFile = join(settings.outDir, `${base}.json`);
writeFileSync(resultsFile, `${JSON.stringify(results, null, 2)}\n`);
const chartTitle = `idem benchmark ratios, ${date}${settings.quick ? ' (quick mode, not results)' : ''}`;
let page;
if (complete) {
  mkdirSync(settings.docsDir, { recursive: true });
  writeFileSync(join(settings.docsDir, 'benchmarks-ratios.svg'), ratioChart(results.targets, chartTitle));
  page = join(settings.docsDir, 'benchmarks.md');
  writeFileSync(page, renderReport(results, 'benchmarks-ratios.svg'));
} else {
  writeFileSync(join(settings.outDir, `${base}.svg`), ratioChart(results.targets, chartTitle));
  page = join(settings.outDir, `${base}.md`);
  writeFileSync(page, renderReport(results, `${base}.svg`));
}

log('\n== targets');
for (const target of results.targets) {
  if (target.verdict === 'not measured' && !complete) continue;
  const { measured, threshold } = target;
  const value = !measured
    ? '-'
    : target.kind === 'absolute'
      ? measured.median.toFixed(0)
      : ratioText(measured.median, threshold);
  log(`  ${target.verdict.padEnd(12)} #${target.issue} ${target.text}: ${value} (wanted >= ${target.threshold})`);
}
log(`\nwrote ${resultsFile} and ${page} in ${Math.round(results.elapsedSeconds)} s`);
const down = Object.entries(services).filter(([, reason]) => reason);
if (process.env.CI === 'true' && down.length > 0) {
  console.error(`CI=true and ${down.map(([name]) => name).join(', ')} unreachable: failing the run.`);
  process.exit(1);
}

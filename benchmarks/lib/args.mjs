// Command line of `npm run bench`. Kept free of any library so `node benchmarks/run.mjs --help` works
// before anything else is installed.
import { join } from 'node:path';

/** The usage text printed by `--help` and on an unknown option. */
export const usage = `npm run bench [-- options] [suite...]

  --quick          prove the runner works: 1 round, 1 s windows, a few contenders per suite (< 2 min);
                   never touches docs/benchmarks.md
  --rounds N       rounds per group (default 3; quick 1; under 3, the run is a trial)
  --duration S     measured seconds per contender and round (default 2; quick 1; under 2, a trial)
  --out DIR        where results/<date>.json goes (default benchmarks/results)
  --docs DIR       where benchmarks.md and benchmarks-ratios.svg go (default docs; full runs only)
  --match TEXT     run only the contenders whose name contains TEXT, or one of the texts of
                   A|B|... (and each group's baseline); case-sensitive, and a run that matches
                   nothing fails
  --render FILE    rewrite docs/benchmarks.md and the chart from a results file, measuring nothing
  --list           print the suites and exit
  --no-build       measure the packages' dist as it is (by default a stale or missing dist is rebuilt)
  suite...         run only these suites (default: all)`;

/**
 * Parses `process.argv.slice(2)` into the run's settings; throws a TypeError on a bad option.
 *
 * @example
 * parseArgs(['--quick', 'limits'], '/repo'); // { quick: true, suites: ['limits'], rounds: 1, ... }
 */
export function parseArgs(argv, root) {
  const settings = {
    quick: false,
    rounds: undefined,
    durationSeconds: undefined,
    outDir: join(root, 'benchmarks', 'results'),
    docsDir: join(root, 'docs'),
    list: false,
    help: false,
    match: undefined,
    render: undefined,
    build: true,
    suites: [],
  };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const value = () => {
      const next = argv[++i];
      if (next === undefined) throw new TypeError(`${arg} needs a value`);
      return next;
    };
    if (arg === '--quick') settings.quick = true;
    else if (arg === '--rounds') settings.rounds = positiveInteger(arg, value());
    else if (arg === '--duration') settings.durationSeconds = positiveInteger(arg, value());
    else if (arg === '--out') settings.outDir = value();
    else if (arg === '--docs') settings.docsDir = value();
    else if (arg === '--match') settings.match = value();
    else if (arg === '--render') settings.render = value();
    else if (arg === '--list') settings.list = true;
    else if (arg === '--help' || arg === '-h') settings.help = true;
    else if (arg === '--no-build') settings.build = false;
    else if (arg.startsWith('--')) throw new TypeError(`unknown option ${arg}`);
    else settings.suites.push(arg);
  }
  settings.rounds ??= settings.quick ? 1 : 3;
  // Two seconds keeps a full run near 20 minutes on 2 cores; rounds and medians carry the noise.
  settings.durationSeconds ??= settings.quick ? 1 : 2;
  // One second of the same load before every measured window (autocannon's windows are whole seconds).
  settings.warmupSeconds = 1;
  settings.connections = 50;
  return settings;
}

/**
 * Whether a run of `settings` may replace the published page (docs/benchmarks.md and its chart): a
 * run of every suite and every contender, with at least the default 3 rounds of 2 s windows. Fewer
 * rounds give no min and max worth the name, and shorter windows more noise; such a run is a trial,
 * and writes results/<date>-quick*.
 *
 * @example
 * publishable(parseArgs([], '/repo')); // true
 * publishable(parseArgs(['--rounds', '1'], '/repo')); // false
 */
export function publishable(settings) {
  return (
    !settings.quick &&
    settings.suites.length === 0 &&
    settings.match === undefined &&
    settings.rounds >= 3 &&
    settings.durationSeconds >= 2
  );
}

function positiveInteger(name, text) {
  const number = Number(text);
  if (!Number.isInteger(number) || number < 1) throw new TypeError(`${name} takes a positive integer, got ${text}`);
  return number;
}

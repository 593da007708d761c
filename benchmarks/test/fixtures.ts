// Results-file pieces for the tests of the page and the targets: a row of one round, and the
// run-level fields every saved run carries.

/** A contender measured in one round at `rate`, with any other fields (a ratio, CPU figures). */
export function row(name: string, rate: number, extra: Record<string, unknown> = {}) {
  return { name, samples: [rate], median: rate, min: rate, max: rate, ...extra };
}

/** A saved run around `fields` (suites, targets, ...): one round on a 2-core test machine. */
export function savedRun(fields: Record<string, unknown>) {
  return {
    format: 'idem-bench/1',
    startedAt: '2026-11-21T00:00:00.000Z',
    elapsedSeconds: 10,
    machine: { node: 'v24', cpus: 2, cpuModel: 'test', loadAverage: [0, 0, 0], loadAverageAtEnd: [0, 0, 0] },
    settings: { connections: 50, durationSeconds: 2, warmupSeconds: 1, rounds: 1, packages: 'dist' },
    versions: {},
    targets: [],
    notMeasured: [],
    ...fields,
  };
}

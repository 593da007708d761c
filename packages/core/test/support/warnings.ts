import { afterEach, beforeEach } from 'vitest';

/** The process warnings a test saw (`process.emitWarning` delivers them on a later tick). */
export interface Warnings {
  /** Every warning seen since the capture started, in order. */
  readonly all: readonly Error[];
  /** Those whose `code` is `code` (an idem warning code, e.g. `IDEM_STACKED`). */
  withCode(code: string): Error[];
  /** Stops listening; what was seen stays readable. */
  stop(): void;
}

/**
 * Listens to `process.on('warning')` from now until `stop()`.
 *
 * @example
 * const warnings = captureWarnings();
 * try {
 *   // provoke it
 * } finally {
 *   warnings.stop();
 * }
 * await new Promise((resolve) => setImmediate(resolve));
 * expect(warnings.withCode('IDEM_STACKED')).toHaveLength(1);
 */
export function captureWarnings(): Warnings {
  const all: Error[] = [];
  const onWarning = (warning: Error) => void all.push(warning);
  process.on('warning', onWarning);
  return {
    all,
    withCode: (code) => all.filter((warning) => (warning as { code?: string }).code === code),
    stop: () => void process.off('warning', onWarning),
  };
}

/**
 * `captureWarnings()` around every test of the file (or the describe block it is called in): a fresh
 * capture starts before each test and stops after it.
 *
 * @example
 * const warnings = captureWarningsEachTest();
 * it('warns once', async () => {
 *   // provoke it
 *   expect(warnings.withCode('IDEM_UNWRITABLE_REASON_PHRASE')).toHaveLength(1);
 * });
 */
export function captureWarningsEachTest(): Warnings {
  let current: Warnings | undefined;
  beforeEach(() => {
    current = captureWarnings();
  });
  afterEach(() => {
    current?.stop();
  });
  const now = (): Warnings => {
    if (!current) throw new Error('captureWarningsEachTest: read outside a test');
    return current;
  };
  return {
    get all() {
      return now().all;
    },
    withCode: (code) => now().withCode(code),
    stop: () => now().stop(),
  };
}

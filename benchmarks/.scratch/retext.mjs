// Recomputes the target texts of a results file with the current targets.mjs; fails if a verdict changes.
import { readFileSync, writeFileSync } from 'node:fs';
import { evaluateTargets } from '../lib/targets.mjs';
const file = process.argv[2];
const results = JSON.parse(readFileSync(file, 'utf8'));
const groups = results.suites.flatMap((suite) => suite.groups);
const fresh = evaluateTargets(groups, results.suitesRun);
if (fresh.length !== results.targets.length) throw new Error('target count changed');
for (let i = 0; i < fresh.length; i++) {
  const a = results.targets[i], b = fresh[i];
  if (a.verdict !== b.verdict || a.target !== b.target || JSON.stringify(a.measured) !== JSON.stringify(b.measured)) throw new Error(`changed: ${a.target}`);
  if (a.whyIfMissed !== b.whyIfMissed) console.log('text updated:', a.target);
}
results.targets = fresh;
writeFileSync(file, `${JSON.stringify(results, null, 2)}\n`);

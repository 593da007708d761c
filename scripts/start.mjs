// `npm start`: the reference app. It lands with issue 8; until then, say so clearly.
import { existsSync } from 'node:fs';

const entry = new URL('../examples/reference-app/package.json', import.meta.url);
if (!existsSync(entry)) {
  console.log('The reference app (examples/reference-app) is not built yet.');
  console.log('Meanwhile: `npm test` runs the whole suite; the minimal examples start with `npm start -w <example>`.');
  process.exit(0);
}
const { spawn } = await import('node:child_process');
const child = spawn('npm', ['start', '-w', 'examples/reference-app'], { stdio: 'inherit' });
child.on('exit', (code) => process.exit(code ?? 0));

// `npm start`: the reference app (examples/reference-app) on its embedded default store.
import { spawn } from 'node:child_process';

const child = spawn('npm', ['start', '-w', 'examples/reference-app'], { stdio: 'inherit' });
child.on('exit', (code) => process.exit(code ?? 0));

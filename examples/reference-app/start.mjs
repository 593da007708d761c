// `npm start` (at the repository root, or `-w examples/reference-app`): the reference app.
//
// The app runs in this very process (tsx compiles its TypeScript as it loads), not as a child of
// another `npm` and shell: a shell that gets SIGTERM dies without passing it on, which left the app
// running with its ports held when a supervisor (systemd, a container runtime, `kill <pid>`) stopped
// it. Here the signal reaches the app's own handler, which drains requests and closes the stores.
import { register } from 'tsx/esm/api';

register();
await import('./src/main.ts');

// `npm start` itself still runs this file through a shell. When npm is stopped, it signals that
// shell, which dies and leaves this process to init: a new parent means "stop", as SIGTERM would.
const parent = process.ppid;
setInterval(() => {
  if (process.ppid !== parent) process.kill(process.pid, 'SIGTERM');
}, 500).unref();

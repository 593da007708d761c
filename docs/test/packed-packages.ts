// Packs @idem packages into tarballs exactly as `npm pack` would in the repository, without touching
// the checkout: a pack runs `prepack`, which rebuilds the package's dist, and other test files (the
// benchmark runner's, the reference app's) read those dist folders while they run. So the packages'
// sources are copied into a scratch tree laid out like the repository (packages/<name>, the root
// tsconfig for the build, the licence and its copy script), whose node_modules links the
// checkout's dependencies and points `@idem/*` at the copies, and each copy is packed there.
import { execFile } from 'node:child_process';
import { cpSync, mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

export interface PackedPackages {
  /** The tarball of each package, by its name (`@idem/core` → `/tmp/.../idem-core-0.1.0.tgz`). */
  readonly tarballs: ReadonlyMap<string, string>;
  /** Deletes the scratch tree and the tarballs. */
  remove(): void;
}

/**
 * Packs `names` (package folders under `packages/`, in build order: a package after those it
 * imports) from the checkout at `root`, with `npm` from `env`'s PATH.
 *
 * @example
 * const packed = await packPackages(root, ['core', 'guard', 'express'], process.env);
 * packed.tarballs.get('@idem/express'); // '/tmp/idem-pack-.../packs/idem-express-0.1.0.tgz'
 */
export async function packPackages(root: string, names: string[], env: NodeJS.ProcessEnv): Promise<PackedPackages> {
  const tree = mkdtempSync(join(tmpdir(), 'idem-pack-'));
  try {
    for (const file of ['tsconfig.json', 'LICENSE', join('scripts', 'pack-license.mjs')]) {
      cpSync(join(root, file), join(tree, file));
    }
    // Sources, manifest, README and build config; never a dist or test folder of the checkout.
    for (const name of names) {
      cpSync(join(root, 'packages', name), join(tree, 'packages', name), {
        recursive: true,
        filter: (source) => !/[\\/](dist|test|node_modules)$/.test(source),
      });
    }
    const modules = join(tree, 'node_modules');
    mkdirSync(join(modules, '@idem'), { recursive: true });
    for (const entry of readdirSync(join(root, 'node_modules'))) {
      if (entry !== '@idem') symlinkSync(join(root, 'node_modules', entry), join(modules, entry));
    }
    for (const name of names) symlinkSync(join(tree, 'packages', name), join(modules, '@idem', name));
    const packs = join(tree, 'packs');
    mkdirSync(packs);
    const tarballs = new Map<string, string>();
    // One at a time: a package's type declarations are built against those packed before it.
    for (const name of names) {
      const { stdout } = await run('npm', ['pack', '--json', '--pack-destination', packs], {
        cwd: join(tree, 'packages', name),
        env,
        maxBuffer: 16 * 1024 * 1024,
      });
      // npm prints the scripts' output before the JSON report on stdout.
      const [report] = JSON.parse(stdout.slice(stdout.indexOf('\n[') + 1)) as Array<{
        name: string;
        filename: string;
      }>;
      if (report === undefined) throw new Error(`npm pack of ${name} reported nothing:\n${stdout}`);
      tarballs.set(report.name, join(packs, report.filename));
    }
    return { tarballs, remove: () => rmSync(tree, { recursive: true, force: true }) };
  } catch (error) {
    rmSync(tree, { recursive: true, force: true });
    throw error;
  }
}

/**
 * The environment a consumer project's commands run in: the checkout's `node_modules/.bin` first
 * (its Node and TypeScript), and npm quiet about updates, funding and audits.
 */
export function consumerEnv(root: string): NodeJS.ProcessEnv {
  return {
    ...process.env,
    PATH: `${join(root, 'node_modules', '.bin')}:${process.env.PATH ?? ''}`,
    npm_config_update_notifier: 'false',
    npm_config_fund: 'false',
    npm_config_audit: 'false',
  };
}

/** What a command printed (stdout, then stderr) and its exit status. */
export interface CommandRun {
  output: string;
  status: number;
}

/** Runs a command to its end in `cwd`; a failure is a status, never a rejection. */
export async function runIn(command: string, args: string[], cwd: string, env: NodeJS.ProcessEnv): Promise<CommandRun> {
  try {
    const { stdout, stderr } = await run(command, args, { cwd, env, maxBuffer: 32 * 1024 * 1024 });
    return { output: `${stdout}${stderr}`, status: 0 };
  } catch (error) {
    const failed = error as { stdout?: string; stderr?: string; code?: number };
    return { output: `${failed.stdout ?? ''}${failed.stderr ?? ''}`, status: failed.code ?? 1 };
  }
}

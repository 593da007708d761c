// Packs @idem packages into tarballs exactly as `npm pack` would in the repository, without touching
// the checkout: a pack runs `prepack`, which rebuilds the package's dist, and other test files (the
// benchmark runner's, the reference app's) read those dist folders while they run. So the packages'
// sources are copied into a scratch tree laid out like the repository (packages/<name>, the root
// tsconfig for the build, the licence and its copy script), whose node_modules links the
// checkout's dependencies and points `@idem/*` at the copies, and each copy is packed there.
import { execFile } from 'node:child_process';
import { cpSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
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
 * Packs `names` (package folders under `packages/`) from the checkout at `root`, with `npm` from
 * `env`'s PATH: a package after those of `names` its manifest depends on, two at a time otherwise.
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
    const pack = async (name: string): Promise<void> => {
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
    };
    // A package's type declarations are built against the packages it imports, so it is packed once
    // those are; packages that need none of each other are packed two at a time (each pack is a
    // build: about one core's worth, and CI has two).
    await inDependencyOrder(names, siblingsOf(tree, names), 2, pack);
    return { tarballs, remove: () => rmSync(tree, { recursive: true, force: true }) };
  } catch (error) {
    rmSync(tree, { recursive: true, force: true });
    throw error;
  }
}

/** For each folder in `names`, the folders in `names` whose packages its manifest depends on. */
function siblingsOf(tree: string, names: string[]): Map<string, string[]> {
  const folderOf = new Map<string, string>();
  const manifests = new Map<
    string,
    { name: string; dependencies?: object; peerDependencies?: object; devDependencies?: object }
  >();
  for (const name of names) {
    const manifest = JSON.parse(readFileSync(join(tree, 'packages', name, 'package.json'), 'utf8'));
    manifests.set(name, manifest);
    folderOf.set(manifest.name, name);
  }
  const siblings = new Map<string, string[]>();
  for (const [name, manifest] of manifests) {
    const wanted = Object.keys({ ...manifest.dependencies, ...manifest.peerDependencies, ...manifest.devDependencies });
    siblings.set(
      name,
      wanted.flatMap((dependency) => {
        const folder = folderOf.get(dependency);
        return folder === undefined ? [] : [folder];
      }),
    );
  }
  return siblings;
}

/**
 * Runs `task` for every name, at most `limit` at once, each only after the tasks of the names it
 * depends on have finished. The first failure rejects (once the tasks running then have settled).
 */
async function inDependencyOrder(
  names: string[],
  dependsOn: ReadonlyMap<string, readonly string[]>,
  limit: number,
  task: (name: string) => Promise<void>,
): Promise<void> {
  const done = new Set<string>();
  const started = new Set<string>();
  let failure: unknown;
  let running = 0;
  await new Promise<void>((resolve) => {
    const next = (): void => {
      if (failure !== undefined || done.size === names.length) {
        if (running === 0) resolve();
        return;
      }
      for (const name of names) {
        if (running >= limit) break;
        if (started.has(name)) continue;
        if (!(dependsOn.get(name) ?? []).every((dependency) => done.has(dependency) || !names.includes(dependency))) {
          continue;
        }
        started.add(name);
        running += 1;
        task(name).then(
          () => {
            done.add(name);
            running -= 1;
            next();
          },
          (error: unknown) => {
            failure ??= error;
            running -= 1;
            next();
          },
        );
      }
      if (running === 0 && failure === undefined && done.size < names.length) {
        failure = new Error(
          `no package of ${names.filter((name) => !started.has(name)).join(', ')} can be packed first`,
        );
        resolve();
      }
    };
    next();
  });
  if (failure !== undefined) throw failure;
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

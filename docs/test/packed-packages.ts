// Packs @idem packages into tarballs exactly as `npm pack` would in the repository, without touching
// the checkout: a pack runs `prepack`, which rebuilds the package's dist, and other test files (the
// benchmark runner's, the reference app's) read those dist folders while they run. So the packages'
// sources are copied into a scratch tree laid out like the repository (packages/<name>, the root
// tsconfig for the build, the licence and its copy script), whose node_modules links the
// checkout's dependencies and points `@idem/*` at the copies, and each copy is packed there.
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join, sep } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

export interface PackedPackages {
  /** The tarball of each package, by its name (`@idem/core` → `/tmp/.../idem-core-0.1.0.tgz`). */
  readonly tarballs: ReadonlyMap<string, string>;
  /** Deletes the scratch tree (the tarballs stay in the cache, for the next file that packs them). */
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
    const siblings = siblingsOf(tree, names);
    const keys = cacheKeys(root, names, siblings);
    const tarballs = new Map<string, string>();
    const pack = async (name: string): Promise<void> => {
      const packed = await cached(keys.get(name) as string, async (into) => {
        const { stdout } = await run('npm', ['pack', '--json', '--pack-destination', into], {
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
        return { name: report.name, filename: report.filename };
      });
      const file = join(packed.folder, packed.filename);
      // A tarball from the cache: its dist goes into the tree, for the packages built against it.
      if (!existsSync(join(tree, 'packages', name, 'dist'))) {
        await run('tar', ['-xzf', file, '-C', join(tree, 'packages', name), '--strip-components=1', 'package/dist'], {
          env,
        });
      }
      tarballs.set(packed.name, file);
    };
    // A package's type declarations are built against the packages it imports, so it is packed once
    // those are; packages that need none of each other are packed two at a time (each pack is a
    // build: about one core's worth, and CI has two).
    await inDependencyOrder(names, siblings, 2, pack);
    return { tarballs, remove: () => rmSync(tree, { recursive: true, force: true }) };
  } catch (error) {
    rmSync(tree, { recursive: true, force: true });
    throw error;
  }
}

// Tarballs packed once for every test file (and run) that asks for the same sources: the three docs
// files that pack (packaging, getting-started, consumers) share the packages they have in common,
// and each pack is a build (about 8 s of CPU). A tarball is found by the hash of all its build reads:
// the package's folder as copied, the shared build files, the lockfile (the toolchain), the Node
// release, and the hashes of the @idem packages it is built against.
const cacheRoot = join(tmpdir(), 'idem-pack-cache');

function cacheKeys(
  root: string,
  names: string[],
  siblings: ReadonlyMap<string, readonly string[]>,
): Map<string, string> {
  const shared = createHash('sha256').update(process.version);
  for (const file of ['tsconfig.json', 'LICENSE', join('scripts', 'pack-license.mjs'), 'package-lock.json']) {
    shared.update(`\0${file}\0`).update(readFileSync(join(root, file)));
  }
  const base = shared.digest('hex');
  const keys = new Map<string, string>();
  const keyOf = (name: string): string => {
    const known = keys.get(name);
    if (known !== undefined) return known;
    const hash = createHash('sha256').update(base);
    const folder = join(root, 'packages', name);
    const files = readdirSync(folder, { recursive: true, encoding: 'utf8' })
      .filter((file) => !file.split(sep).some((part) => ['dist', 'test', 'node_modules'].includes(part)))
      .filter((file) => statSync(join(folder, file)).isFile())
      .sort();
    for (const file of files) hash.update(`\0${file}\0`).update(readFileSync(join(folder, file)));
    for (const sibling of siblings.get(name) ?? []) hash.update(`\0@idem/${sibling}\0${keyOf(sibling)}`);
    const key = `${name}-${hash.digest('hex').slice(0, 32)}`;
    keys.set(name, key);
    return key;
  };
  for (const name of names) keyOf(name);
  return keys;
}

interface CachedPack {
  folder: string;
  name: string;
  filename: string;
}

/**
 * The cache entry `key`, made by `make` (which packs into the folder it is given) unless it is
 * there. One process makes an entry at a time (a lock folder holding its pid, taken over when that
 * process is gone); the others wait for it. An entry appears whole or not at all (a rename).
 */
async function cached(
  key: string,
  make: (into: string) => Promise<{ name: string; filename: string }>,
): Promise<CachedPack> {
  mkdirSync(cacheRoot, { recursive: true });
  pruneCache();
  const folder = join(cacheRoot, key);
  const report = join(folder, 'pack.json');
  const lock = `${folder}.lock`;
  const found = (): CachedPack | undefined => {
    if (!existsSync(report)) return undefined;
    return { folder, ...(JSON.parse(readFileSync(report, 'utf8')) as { name: string; filename: string }) };
  };
  const waitUntil = Date.now() + 5 * 60_000;
  for (;;) {
    const ready = found();
    if (ready !== undefined) return ready;
    try {
      mkdirSync(lock);
      writeFileSync(join(lock, 'pid'), String(process.pid));
      break;
    } catch {
      // Another process packs it: wait, unless that process is gone or the wait is too long.
      let owner = Number.NaN;
      try {
        owner = Number(readFileSync(join(lock, 'pid'), 'utf8'));
      } catch {
        // the lock is being taken or let go
      }
      if ((Number.isInteger(owner) && !alive(owner)) || Date.now() > waitUntil) {
        rmSync(lock, { recursive: true, force: true });
      }
      await new Promise((resolve) => setTimeout(resolve, 500));
    }
  }
  try {
    const ready = found();
    if (ready !== undefined) return ready;
    const scratch = mkdtempSync(join(cacheRoot, `${key}.making-`));
    try {
      const made = await make(scratch);
      writeFileSync(join(scratch, 'pack.json'), JSON.stringify(made));
      try {
        renameSync(scratch, folder);
      } catch (error) {
        // Made meanwhile by a process whose lock was taken over after the longest wait: keep that one.
        if (found() === undefined) throw error;
      }
    } finally {
      rmSync(scratch, { recursive: true, force: true });
    }
    return found() as CachedPack;
  } finally {
    rmSync(lock, { recursive: true, force: true });
  }
}

// Entries not made in the last week are of sources long changed: removed, so the cache stays small.
let pruned = false;
function pruneCache(): void {
  if (pruned) return;
  pruned = true;
  const weekAgo = Date.now() - 7 * 24 * 3600_000;
  for (const entry of readdirSync(cacheRoot)) {
    try {
      if (statSync(join(cacheRoot, entry)).mtimeMs < weekAgo)
        rmSync(join(cacheRoot, entry), { recursive: true, force: true });
    } catch {
      // removed by another process meanwhile
    }
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
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

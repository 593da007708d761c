// Every options table in the documentation matches the options interface it documents: each option
// the interface declares has a row (its name, in backticks, in the first column), and each row names
// an option that exists. An option added to the code without a row, or a row left behind by a rename,
// is found here, not by a reader.
//
// A table is found as the first block of `|` lines after a marker line of its page: a heading, or the
// sentence that introduces it. An option the page describes in another option's row (as the guides
// do `acknowledgeShortRetention` in the `retention` row) is listed in `inRowOf`, with that row.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));

interface TableSpec {
  /** The source file that declares the interface, from the repository root. */
  source: string;
  interface: string;
  /** The page and the marker lines, in order: the table is the first one after the last marker. */
  doc: string;
  markers: readonly string[];
  /** Only the options the interface declares itself (the page documents the inherited ones elsewhere). */
  ownOnly?: boolean;
  /** Options that have no row of their own: the interface's option, and the row that describes it. */
  inRowOf?: Readonly<Record<string, string>>;
  /** Options left out of the table on purpose (such as the `uri` that `jwksOptions` omits). */
  omit?: readonly string[];
}

const adapterOptions = (guide: string): TableSpec => ({
  source: 'packages/core/src/http-options.ts',
  interface: 'HttpIdempotencyOptions',
  doc: `docs/guides/${guide}.md`,
  markers: ['## Options'],
  inRowOf: { acknowledgeShortRetention: 'retention' },
});

const tables: readonly TableSpec[] = [
  adapterOptions('express'),
  adapterOptions('fastify'),
  adapterOptions('koa'),
  {
    source: 'packages/guard/src/guard-options.ts',
    interface: 'GuardOptions',
    doc: 'docs/guard.md',
    markers: ['### `createGuard(options)`'],
  },
  {
    source: 'packages/guard/src/guard-options.ts',
    interface: 'IssuerOptions',
    doc: 'docs/guard.md',
    markers: ['### Issuers'],
    ownOnly: true,
  },
  {
    source: 'packages/guard/src/key-source.ts',
    interface: 'RemoteJwksOptions',
    doc: 'docs/guard.md',
    markers: ['### Remote JWKS (`jwksOptions`)'],
    omit: ['uri'],
  },
  { source: 'packages/guard/src/dpop.ts', interface: 'DpopOptions', doc: 'docs/guard.md', markers: ['## DPoP'] },
  {
    source: 'packages/guard/src/mtls.ts',
    interface: 'MtlsOptions',
    doc: 'docs/guard.md',
    markers: ['## mTLS-bound tokens (RFC 8705)'],
  },
  {
    source: 'packages/guard/src/internal-token-issuer.ts',
    interface: 'InternalTokenIssuerOptions',
    doc: 'docs/guard.md',
    markers: ['### `createInternalTokenIssuer(options)`'],
  },
  {
    source: 'packages/guard/src/internal-verifier.ts',
    interface: 'InternalVerifierOptions',
    doc: 'docs/guard.md',
    markers: ['### `createInternalVerifier(options)`'],
  },
  {
    source: 'packages/client/src/client-options.ts',
    interface: 'ClientOptions',
    doc: 'docs/client.md',
    markers: ['## Options of `createClient`'],
  },
  {
    source: 'packages/client/src/retry-options.ts',
    interface: 'RetryOptions',
    doc: 'docs/client.md',
    markers: ['## Waits: backoff, Retry-After, limits'],
  },
  {
    source: 'packages/redis/src/redis-store.ts',
    interface: 'RedisStoreOptions',
    doc: 'docs/stores.md',
    markers: ['## Redis', '### Options'],
  },
  {
    source: 'packages/postgres/src/postgres-store.ts',
    interface: 'PostgresStoreOptions',
    doc: 'docs/stores.md',
    markers: ['## PostgreSQL', '### Options'],
  },
  {
    source: 'packages/webhooks/src/outbox.ts',
    interface: 'OutboxOptions',
    doc: 'docs/webhooks.md',
    markers: ['`createOutbox(options)`:'],
  },
  {
    source: 'packages/webhooks/src/relay-options.ts',
    interface: 'RelayOptions',
    doc: 'docs/webhooks.md',
    markers: ['`outbox.relay(options)`:'],
  },
  {
    source: 'packages/webhooks/src/purge.ts',
    interface: 'PurgeOptions',
    doc: 'docs/webhooks.md',
    markers: ['`outbox.purge(db, options)`:'],
  },
  {
    source: 'packages/core/src/make-idempotent.ts',
    interface: 'MakeIdempotentOptions',
    doc: 'docs/guides/queues.md',
    markers: ['## The wrapper', '### Options'],
  },
  // The package READMEs keep a short table of the same options.
  {
    source: 'packages/core/src/engine-options.ts',
    interface: 'IdempotencyOptions',
    doc: 'packages/core/README.md',
    markers: ['## Options of `createIdempotency`'],
  },
  ...[
    ['express', '## Options of `idempotency()`'],
    ['fastify', '## Options of the `idempotency` plugin'],
    ['koa', '## Options of `idempotency()`'],
  ].map(
    ([pkg, marker]): TableSpec => ({
      ...adapterOptions('express'),
      doc: `packages/${pkg}/README.md`,
      markers: [marker as string],
    }),
  ),
  {
    source: 'packages/guard/src/guard-options.ts',
    interface: 'GuardOptions',
    doc: 'packages/guard/README.md',
    markers: ['## Options of `createGuard()`'],
  },
  {
    source: 'packages/webhooks/src/receiver.ts',
    interface: 'ReceiverOptions',
    doc: 'packages/webhooks/README.md',
    markers: ['## Options of `createReceiver()`'],
    inRowOf: { acknowledgeShortRetention: 'retention' },
  },
  {
    source: 'packages/postgres/src/postgres-store.ts',
    interface: 'PostgresStoreOptions',
    doc: 'packages/postgres/README.md',
    markers: ['## Options'],
  },
];

/** The option names of an interface: all of them (inherited ones too), and those it declares itself. */
function optionsOf(program: ts.Program, spec: TableSpec): { all: string[]; own: string[] } {
  const file = program.getSourceFile(join(root, spec.source));
  if (file === undefined) throw new Error(`${spec.source} is not in the program`);
  const checker = program.getTypeChecker();
  let found: ts.InterfaceDeclaration | undefined;
  ts.forEachChild(file, (node) => {
    if (ts.isInterfaceDeclaration(node) && node.name.text === spec.interface) found = node;
  });
  if (found === undefined) throw new Error(`${spec.source} declares no interface ${spec.interface}`);
  const all = checker.getPropertiesOfType(checker.getTypeAtLocation(found.name)).map((symbol) => symbol.name);
  const own = found.members.flatMap((member) =>
    member.name !== undefined && ts.isIdentifier(member.name) ? [member.name.text] : [],
  );
  return { all, own };
}

/** The table after the markers: for each row, the names in its first column and the row's text. */
function tableAfter(doc: string, markers: readonly string[]): { names: string[]; text: string }[] {
  const lines = readFileSync(join(root, doc), 'utf8').split('\n');
  let at = 0;
  for (const marker of markers) {
    const index = lines.findIndex((line, i) => i >= at && line.trim() === marker);
    if (index === -1) throw new Error(`${doc}: no line "${marker}" after line ${at}`);
    at = index + 1;
  }
  const start = lines.findIndex((line, i) => i >= at && line.startsWith('|'));
  if (start === -1) throw new Error(`${doc}: no table after "${markers.at(-1)}"`);
  const rows: { names: string[]; text: string }[] = [];
  // The header row and the delimiter row are skipped; the table ends at the first line that is not a row.
  for (let i = start + 2; i < lines.length && lines[i]?.startsWith('|'); i++) {
    const line = lines[i] as string;
    const first = line.split('|')[1] ?? '';
    rows.push({ names: [...first.matchAll(/`([A-Za-z_$][\w$]*)`/g)].map((m) => m[1] as string), text: line });
  }
  return rows;
}

const program = ts.createProgram(
  [...new Set(tables.map((spec) => join(root, spec.source)))],
  (() => {
    const config = ts.readConfigFile(join(root, 'tsconfig.json'), ts.sys.readFile);
    return { ...ts.parseJsonConfigFileContent(config.config, ts.sys, root).options, noEmit: true };
  })(),
);

describe('options tables in the documentation', () => {
  it('reads a table and its first column', () => {
    const rows = tableAfter('docs/guard.md', ['### Remote JWKS (`jwksOptions`)']);
    expect(rows.flatMap((row) => row.names)).toEqual(expect.arrayContaining(['timeout', 'minTtl', 'maxTtl']));
  });

  for (const spec of tables) {
    it(`${spec.doc}: the table after "${spec.markers.at(-1)}" has a row for every option of ${spec.interface}`, () => {
      const { all, own } = optionsOf(program, spec);
      const rows = tableAfter(spec.doc, spec.markers);
      const documented = new Set(rows.flatMap((row) => row.names));
      const expected = (spec.ownOnly ? own : all).filter((name) => !(spec.omit ?? []).includes(name));
      const missing = expected.filter((name) => {
        if (documented.has(name)) return false;
        const row = spec.inRowOf?.[name];
        // Described in another option's row: that row must exist and name it.
        return !(
          row !== undefined && rows.some((r) => r.names.includes(row) && new RegExp(`\`${name}[\`:]`).test(r.text))
        );
      });
      expect(missing, `options of ${spec.interface} without a row in ${spec.doc}`).toEqual([]);
      const unknown = [...documented].filter((name) => !all.includes(name));
      expect(unknown, `rows of ${spec.doc} that name no option of ${spec.interface}`).toEqual([]);
    });
  }
});

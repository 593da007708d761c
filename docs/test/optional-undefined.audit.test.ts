// Options read from configuration, under `exactOptionalPropertyTypes` (a flag the house style asks
// for, and demanding users set): an option whose value may be `undefined`, passed as it is.
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createClient } from '@idem/client';
import { createIdempotency, memoryStore } from '@idem/core';
import { createGuard } from '@idem/guard';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));

// What the user writes: every setting optional in their configuration, handed on unchanged.
const userCode = `
import { createIdempotency, memoryStore, type Duration } from '@idem/core';
import { createClient } from '@idem/client';
import { createGuard } from '@idem/guard';
declare const config: { wait?: Duration; retention?: Duration; maxEntries?: number; realm?: string; token?: () => string };
createIdempotency({ store: memoryStore({ maxEntries: config.maxEntries }), wait: config.wait, retention: config.retention });
createClient({ baseUrl: 'https://api.example', getToken: config.token });
createGuard({ audience: 'https://api.example', realm: config.realm, issuers: [{ issuer: 'https://id.example', jwksUri: 'https://id.example/jwks' }] });
export {};
`;

function typeErrors(code: string): string[] {
  const file = join(root, 'docs', 'test', '__optional-undefined-user.ts');
  const config = ts.readConfigFile(join(root, 'tsconfig.json'), ts.sys.readFile);
  const parsed = ts.parseJsonConfigFileContent(config.config, ts.sys, root);
  const options = { ...parsed.options, exactOptionalPropertyTypes: true, noEmit: true };
  const host = ts.createCompilerHost(options);
  const readFile = host.readFile.bind(host);
  host.readFile = (name) => (name === file ? code : readFile(name));
  host.fileExists = (
    (exists) => (name: string) =>
      name === file || exists(name)
  )(host.fileExists.bind(host));
  const program = ts.createProgram([file], options, host);
  return ts
    .getPreEmitDiagnostics(program)
    .filter((d) => d.file?.fileName === file)
    .map((d) => ts.flattenDiagnosticMessageText(d.messageText, '\n').split('\n')[0] ?? '');
}

describe('options that may be undefined, under exactOptionalPropertyTypes', () => {
  it('at run time, an option given as undefined is taken as left out (the default applies)', () => {
    expect(() =>
      createIdempotency({ store: memoryStore({ maxEntries: undefined }), wait: undefined, retention: undefined }),
    ).not.toThrow();
    expect(() => createClient({ baseUrl: 'https://api.example', getToken: undefined })).not.toThrow();
    expect(() =>
      createGuard({
        audience: 'https://api.example',
        realm: undefined,
        issuers: [{ issuer: 'https://id.example', jwksUri: 'https://id.example/jwks' }],
      }),
    ).not.toThrow();
  });

  // Was wrong: the run time takes `{ wait: undefined }` as "left out" (above), but the option types
  // declare `wait?: Duration`, without `| undefined`, so under exactOptionalPropertyTypes passing a
  // possibly-undefined setting is TS2379/TS2322 ("Consider adding 'undefined' to the types of the
  // target's properties") and the user must spread it in conditionally. A few option types already
  // take `| undefined` (GuardRequest's url and method, PemKeyInput, DeadLetterOptions' after), most
  // do not (IdempotencyOptions, MemoryStoreOptions, ClientOptions, GuardOptions, every adapter's, the
  // webhooks'); needs a decision:
  //   1. add `| undefined` to every optional option of every public options type (the run time
  //      already treats it as left out): types and run time agree, users pass settings as they are;
  //   2. refuse an explicit `undefined` at run time (a TypeError naming the option) so the run time
  //      agrees with the types: strict, but it breaks JavaScript callers that pass optional settings;
  //   3. keep both and document the conditional spread for exactOptionalPropertyTypes users.
  it.fails('the types accept what the run time accepts: a setting that may be undefined, passed as it is', () => {
    expect(typeErrors(userCode)).toEqual([]);
  }, 60_000);
});

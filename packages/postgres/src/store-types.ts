// pg parses each column with a process-wide table that any code may change
// (`pg.types.setTypeParser`), PGlite with the instance's (`new PGlite({ parsers })`): an application that reads int8 as BigInt, bytea or jsonb as its own
// objects, or text through some wrapper, would change what the store reads back from its own rows,
// and a replay would differ from the answer it stores. pg takes a `types` per query, PGlite
// `parsers`; the store passes its own with every statement of its own, so its reads depend on nothing the application
// set. (A transactional handler's own queries keep the application's parsers: they are its rows.)

type Parser = (text: string) => unknown;

// The types the store's statements and migrate() read back, in pg's text format.
const BOOL = 16;
const BYTEA = 17;
const INT4 = 23;
const TEXT = 25;
const VARCHAR = 1043;
const JSON_OID = 114;
const JSONB = 3802;

// bytea in either output format: `hex` (`\x` and two digits a byte, the default since 9.0) or
// `escape` (a session may set bytea_output): printable bytes as they are, `\\` for a backslash, and
// `\ooo` octal for the rest.
const parseBytea = (text: string): Buffer => {
  if (text.startsWith('\\x')) return Buffer.from(text.slice(2), 'hex');
  const bytes: number[] = [];
  for (let i = 0; i < text.length; ) {
    if (text[i] !== '\\') {
      bytes.push(text.charCodeAt(i));
      i += 1;
    } else if (text[i + 1] === '\\') {
      bytes.push(0x5c);
      i += 2;
    } else {
      bytes.push(Number.parseInt(text.slice(i + 1, i + 4), 8));
      i += 4;
    }
  }
  return Buffer.from(bytes);
};

const parsers: Record<number, Parser> = {
  [BOOL]: (text) => text === 't',
  [BYTEA]: parseBytea,
  [INT4]: (text) => Number.parseInt(text, 10),
  [JSON_OID]: (text) => JSON.parse(text),
  [JSONB]: (text) => JSON.parse(text),
};

// Every other type (text, names) as the string the server sent.
const asText: Parser = (text) => text;

/**
 * The `types` the store passes with each of its own pg queries: its parsers for the types it reads,
 * and every other value (text, names) as the string the server sent.
 *
 * @example
 * await pool.query({ text: 'SELECT true AS ok', values: [], types: storeTypes });
 */
export const storeTypes = {
  // Text format only: a pg client made with `binary: true` is refused (see sql-client.ts).
  getTypeParser(oid: number): Parser {
    return parsers[oid] ?? asText;
  },
};

/**
 * The same parsers as PGlite's per-query `parsers` option, which it lays over the instance's own
 * (`new PGlite({ parsers })`); text and varchar are listed too, since an instance may parse them its
 * own way (migrate() accepts varchar for the text columns; `get` reads them as the table has them).
 *
 * @example
 * await db.query('SELECT true AS ok', [], { parsers: storeParsers });
 */
export const storeParsers: Readonly<Record<number, Parser>> = { ...parsers, [TEXT]: asText, [VARCHAR]: asText };

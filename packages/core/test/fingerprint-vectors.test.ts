import { describe, expect, it } from 'vitest';
import { fingerprintRequest } from '../src/fingerprint.js';

// Fingerprints are stored with every record (Redis, PostgreSQL) and compared with a retry's, which
// may be served by a newer version of idem: the value for a given request must never change. These
// vectors were computed by the first implementation (one hash update per prefix and per part); any
// faster framing has to produce the very same hex.
const vectors: Array<{ name: string; parts: Parameters<typeof fingerprintRequest>; hex: string }> = [
  {
    name: 'JSON body with a charset, unsorted query, nested keys and non-ASCII text',
    parts: [
      {
        method: 'post',
        route: '/charges',
        path: '/charges',
        query: '?b=2&a=1',
        contentType: 'application/json; charset=utf-8',
        body: new TextEncoder().encode('{"b":[1,{"z":null,"a":"é"}],"a":1.5e3}'),
      },
    ],
    hex: '6e41de342d1765fb36d3997e35ae8f51ad60d15d7cb02243421be00ba8efc748',
  },
  {
    name: 'binary body and a non-ASCII path',
    parts: [
      {
        method: 'POST',
        route: '/files/:id',
        path: '/files/ü',
        contentType: 'application/octet-stream',
        body: new Uint8Array([0, 255, 10, 13]),
      },
    ],
    hex: 'b267e901ebf292dcd5496e835c60080fc1b6cf41e1e292da3801fda346a337a0',
  },
  {
    name: 'identity headers and an excluded volatile field',
    parts: [
      {
        method: 'PATCH',
        route: '/x',
        path: '/x',
        contentType: 'application/json',
        body: '{"sentAt":"now","n":1}',
        headers: { 'X-Api-Version': '2024-01', a: '1' },
      },
      { exclude: ['/sentAt'] },
    ],
    hex: '5c55190fcec368d2274825c188c55a7f6794408f1c00504f55b5eb511a2fcc4c',
  },
  {
    name: 'method only',
    parts: [{ method: 'POST' }],
    hex: 'edcaa65d8be714c95aa26a3f22b83285f00b35e654df9b10f2cebec4c93ab64b',
  },
];

describe('fingerprintRequest stays the same across versions', () => {
  for (const vector of vectors) {
    it(vector.name, () => {
      expect(fingerprintRequest(...vector.parts)).toBe(vector.hex);
    });
  }
});

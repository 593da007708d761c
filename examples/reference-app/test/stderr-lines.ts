// What a keyed request through the gateway makes the stack write on stderr: the operators' trail
// (src/idempotency-log.ts) that the API and receiver event tests read.
import { vi } from 'vitest';

/**
 * POSTs `body` as JSON to `url` with a bearer token and an `Idempotency-Key`, and returns the
 * response (its body read) with the lines written on stderr while it ran. Every chunk written is
 * also pushed onto `written`, so a file can check all of them at the end.
 */
export async function postCapturingStderr(
  url: URL,
  request: { token: string; keyHeader: string; body: unknown },
  written: string[],
): Promise<{ response: Response; lines: string[] }> {
  const stderr = vi.spyOn(process.stderr, 'write').mockImplementation((chunk: string | Uint8Array) => {
    written.push(String(chunk));
    return true;
  });
  const from = written.length;
  try {
    const response = await fetch(url, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${request.token}`,
        'content-type': 'application/json',
        'idempotency-key': request.keyHeader,
      },
      body: JSON.stringify(request.body),
    });
    await response.arrayBuffer();
    return { response, lines: written.slice(from).join('').split('\n').filter(Boolean) };
  } finally {
    stderr.mockRestore();
  }
}

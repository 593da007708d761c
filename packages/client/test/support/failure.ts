import { isRequestFailedError, type RequestFailedError } from '@idem/client';

/** The RequestFailedError a request rejects with; anything else (a success, another error) fails the test. */
export async function failure(promise: Promise<unknown>): Promise<RequestFailedError> {
  try {
    await promise;
  } catch (error) {
    if (isRequestFailedError(error)) return error;
    throw error;
  }
  throw new Error('expected the request to fail');
}

import type { AddressInfo } from 'node:net';
import express from 'express';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { methodNotAllowed, routeMethodsAt } from '../src/methods.js';

// The 405 of the reference app's Express servers reads the routes from the app itself: these tests pin
// the parts of Express's router it relies on, so an upgrade that moves them fails here first.

const ok = (_req: express.Request, res: express.Response) => {
  res.send('ok');
};

function buildApp() {
  const app = express();
  app.get('/items', ok);
  app.post('/items', ok);
  app.delete('/items/:id', ok);
  app.all('/anything', ok);
  const nested = express.Router();
  nested.post('/:id/notes', ok);
  nested.route('/any').all(ok);
  nested.use(methodNotAllowed(nested, (_req, res) => res.status(405).send('nested refusal')));
  app.use('/events', nested);
  app.use(methodNotAllowed(app, (_req, res, allow) => res.status(405).json({ allow })));
  app.use((_req, res) => {
    res.status(404).send('not found');
  });
  return app;
}

describe('routeMethodsAt', () => {
  const app = buildApp();

  it('lists the methods of the routes at a path, HEAD with GET, sorted', () => {
    expect(routeMethodsAt(app, '/items')).toEqual(['GET', 'HEAD', 'POST']);
    expect(routeMethodsAt(app, '/items/42')).toEqual(['DELETE']);
  });

  it('reads routes of a router mounted under a prefix, with the prefix taken off', () => {
    expect(routeMethodsAt(app, '/events/e1/notes')).toEqual(['POST']);
    expect(routeMethodsAt(app, '/e1/notes')).toEqual([]);
  });

  it('says * for a route that takes every method, and nothing for a path no route has', () => {
    // route.all() marks the route as taking every method; app.all() registers each method by name.
    expect(routeMethodsAt(app, '/events/any')).toEqual(['*']);
    expect(routeMethodsAt(app, '/anything')).toEqual(expect.arrayContaining(['DELETE', 'GET', 'PATCH', 'POST']));
    expect(routeMethodsAt(app, '/nowhere')).toEqual([]);
    expect(routeMethodsAt(app, '/items/1/2')).toEqual([]);
  });

  it('finds no route for a parameter that does not percent-decode, rather than throw', () => {
    expect(routeMethodsAt(app, '/items/%E0%A4%A')).toEqual([]);
  });
});

describe('methodNotAllowed', () => {
  let base = '';
  let close = () => {};

  beforeAll(async () => {
    const server = buildApp().listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    close = () => server.close();
  });

  afterAll(() => close());

  const send = async (method: string, path: string) => {
    const response = await fetch(base + path, { method });
    return { status: response.status, allow: response.headers.get('allow'), text: await response.text() };
  };

  it('answers another method with 405 and Allow, through the refusal the app gives', async () => {
    expect(await send('PUT', '/items')).toEqual({
      status: 405,
      allow: 'GET, HEAD, POST, OPTIONS',
      text: JSON.stringify({ allow: ['GET', 'HEAD', 'POST', 'OPTIONS'] }),
    });
    expect(await send('GET', '/items/7')).toMatchObject({ status: 405, allow: 'DELETE, OPTIONS' });
  });

  it('answers OPTIONS with 204 and Allow, in an app and in a router', async () => {
    expect(await send('OPTIONS', '/items')).toEqual({ status: 204, allow: 'GET, HEAD, POST, OPTIONS', text: '' });
    expect(await send('OPTIONS', '/events/e1/notes')).toEqual({ status: 204, allow: 'POST, OPTIONS', text: '' });
  });

  it('lets the methods the routes take, a route of every method and unknown paths through', async () => {
    expect(await send('GET', '/items')).toMatchObject({ status: 200, text: 'ok' });
    expect(await send('HEAD', '/items')).toMatchObject({ status: 200, allow: null });
    expect(await send('PATCH', '/anything')).toMatchObject({ status: 200, text: 'ok' });
    expect(await send('PUT', '/events/any')).toMatchObject({ status: 200, text: 'ok' });
    expect(await send('DELETE', '/nowhere')).toEqual({ status: 404, allow: null, text: 'not found' });
  });

  it("refuses in a router's own format for its routes", async () => {
    expect(await send('GET', '/events/e1/notes')).toEqual({
      status: 405,
      allow: 'POST, OPTIONS',
      text: 'nested refusal',
    });
  });
});

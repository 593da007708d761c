import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTcpProxy, type TcpProxy } from '../src/tcp-proxy.js';

// An echo server stands in for a store: whatever reaches it comes straight back.
let echo: net.Server;
let echoPort: number;
let proxy: TcpProxy;

beforeAll(async () => {
  echo = net.createServer((socket) => socket.pipe(socket));
  await new Promise<void>((resolve) => echo.listen(0, '127.0.0.1', () => resolve()));
  echoPort = (echo.address() as net.AddressInfo).port;
  proxy = await createTcpProxy({ target: { host: '127.0.0.1', port: echoPort } });
});

afterAll(async () => {
  await proxy.close();
  await new Promise((resolve) => echo.close(resolve));
});

const connect = () =>
  new Promise<net.Socket>((resolve, reject) => {
    const socket = net.connect(proxy.port, proxy.host, () => resolve(socket));
    socket.once('error', reject);
  });

// Resolves with what arrives within `ms`, or '' when nothing does.
const roundTrip = (socket: net.Socket, text: string, ms = 300) =>
  new Promise<string>((resolve) => {
    let got = '';
    const onData = (chunk: Buffer) => {
      got += chunk.toString();
      if (got.length >= text.length) finish();
    };
    const timer = setTimeout(() => finish(), ms);
    const finish = () => {
      clearTimeout(timer);
      socket.off('data', onData);
      resolve(got);
    };
    socket.on('data', onData);
    socket.write(text);
  });

describe('createTcpProxy', () => {
  it('passes traffic through, and adds latency when told', async () => {
    const socket = await connect();
    expect(await roundTrip(socket, 'ping')).toBe('ping');
    proxy.delay(150);
    const started = Date.now();
    expect(await roundTrip(socket, 'slow', 1_000)).toBe('slow');
    // Two hops of 150 ms each (there and back).
    expect(Date.now() - started).toBeGreaterThanOrEqual(290);
    proxy.restore();
    socket.destroy();
  });

  it('blackholes answers without closing the connection (lost acknowledgements)', async () => {
    const socket = await connect();
    proxy.blackhole('downstream');
    expect(await roundTrip(socket, 'lost', 200)).toBe('');
    expect(socket.destroyed).toBe(false);
    proxy.restore();
    expect(await roundTrip(socket, 'back')).toBe('back');
    socket.destroy();
  });

  it('drops downstream chunks with the given probability', async () => {
    const socket = await connect();
    proxy.lossy(1);
    expect(await roundTrip(socket, 'gone', 200)).toBe('');
    proxy.lossy(0);
    expect(await roundTrip(socket, 'kept')).toBe('kept');
    expect(() => proxy.lossy(2)).toThrow(TypeError);
    proxy.restore();
    socket.destroy();
  });

  it('cuts open connections and refuses new ones until restored', async () => {
    const socket = await connect();
    const closed = new Promise((resolve) => socket.once('close', resolve));
    proxy.cut();
    await closed;
    const refused = await connect().then(
      (s) => new Promise((resolve) => s.once('close', () => resolve('closed'))),
      () => 'refused',
    );
    expect(['closed', 'refused']).toContain(refused);
    proxy.restore();
    const again = await connect();
    expect(await roundTrip(again, 'alive')).toBe('alive');
    again.destroy();
  });
});

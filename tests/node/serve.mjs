// serve: what the Node tests against a live `moeserve serve` share — start
// the server on the tiny model on a free port, wait until it serves, run
// named tests in order, stop it with SIGTERM and require a clean exit; and
// the retry a test needs to see a stream arrive in pieces.
import { spawn } from 'node:child_process';

// Starts the server with extra flags; resolves { port, child, stop, log }.
// stop() sends SIGTERM and resolves the exit { code, sig }; log() is what it
// wrote to stderr so far. opts.model: how the model is named ('positional',
// or 'flag' for vLLM's --model); opts.defaults: false leaves out the test
// defaults after the model (port, KV cache, context, threads, served name)
// for a command line that gives its own.
export async function startServer(extraArgs = [], opts = {}) {
  const bin = process.env.MOESERVE_BIN;
  const modelDir = opts.modelDir ?? process.env.MOESERVE_TINY_MODEL;
  if (!bin || !modelDir) {
    console.error('MOESERVE_BIN and MOESERVE_TINY_MODEL must be set (meson test sets them)');
    process.exit(1);
  }
  const model = opts.model === 'flag' ? ['--model', modelDir] : [modelDir];
  const defaults = opts.defaults === false ? [] : ['--port', '0', '--kv-cache-memory', '64MiB',
    '--max-model-len', '2048', '--threads', '1', '--served-model-name', 'tiny'];
  const child = spawn(bin, ['serve', ...model, ...defaults, ...extraArgs],
    { stdio: ['ignore', 'inherit', 'pipe'] });
  let log = '';
  let exited = null;
  const exitPromise = new Promise((resolve) => child.on('exit', (code, sig) => {
    exited = { code, sig };
    resolve(exited);
  }));
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('the server did not get ready')), 120000);
    child.stderr.on('data', (d) => {
      process.stderr.write(d);
      log += d;
      const m = log.match(/listening on http:\/\/[^ ]*:(\d+)/);
      if (m && log.includes('ready: serving')) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    exitPromise.then((e) => reject(new Error(`the server exited early: ${JSON.stringify(e)}`)));
  });
  const stop = async () => {
    child.kill('SIGTERM');
    return exited ?? await exitPromise;
  };
  return { port, child, stop, log: () => log };
}

// Runs each { name, fn } in order, then stops the server; exits 1 when any
// test failed or the server did not exit 0.
export async function runTests(tests, server) {
  let failed = 0;
  for (const t of tests) {
    try {
      await t.fn();
      console.log(`ok - ${t.name}`);
    } catch (e) {
      failed++;
      console.log(`not ok - ${t.name}\n${e.stack ?? e}`);
    }
  }
  const e = await server.stop();
  if (e.code !== 0) {
    console.log(`not ok - the server exited with ${JSON.stringify(e)} after SIGTERM`);
    failed++;
  }
  console.log(failed ? `${failed} failed` : 'all passed');
  process.exit(failed ? 1 : 0);
}

// A stream's text delta is all the text the engine made since the HTTP
// thread last ran, so on a loaded machine a short answer can be made whole
// before that thread runs once and arrive as one delta: right for a stream,
// but it hides whether the answer was sent as it was made. So a test that
// checks the pieces asks for a longer answer and, while it comes in one
// piece, asks again, up to `tries` times; a server that holds the answer
// back until the end sends one piece every time and still fails the check.
// streamOnce() resolves the events of one streamed request; pieces(events)
// counts its text deltas. Resolves the last try's events.
export async function streamInPieces(streamOnce, pieces, tries = 3) {
  let events;
  for (let i = 0; i < tries; i++) {
    events = await streamOnce();
    if (pieces(events) > 1) break;
  }
  return events;
}

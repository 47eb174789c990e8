// GET /dashboard in headless Chromium (Debian's chromium, driven by
// playwright-core) against a server under load on 2 expert-parallel ranks:
// the page loads nothing from anywhere but the server, polls /metrics, and
// its charts hold data — requests running, KV usage per rank, the imbalance
// gauge, all-to-all time per step per rank, TTFT and ITL percentiles, and
// the heat maps of expert load per rank and layer and per rank and expert —
// read from the values the page exposes in the DOM and from the canvases'
// pixels. A screenshot is kept (tests/dashboard.png in the build folder).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { runTests, startServer } from './serve.mjs';

const exe = process.env.MOESERVE_CHROMIUM;
if (!exe || !fs.existsSync(exe)) {
  console.error('not ok - chromium not found: install it with `apt-get install chromium` '
    + '(deploy/setup.sh does), then run `meson setup --reconfigure build`');
  process.exit(1);
}
const config = JSON.parse(fs.readFileSync(path.join(process.env.MOESERVE_TINY_MODEL, 'config.json'), 'utf8'));
const server = await startServer(['--data-parallel-size', '2', '--enable-expert-parallel', '--threads', '2']);
const base = `http://127.0.0.1:${server.port}`;

// Load: a few clients that keep streams going until told to stop.
let loading = true;
async function client(i) {
  let n = 0;
  while (loading) {
    const r = await fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: `client ${i} request ${n++}` }],
        max_tokens: 48, ignore_eos: true, stream: true }) });
    await r.text();
  }
}
const clients = [0, 1, 2].map(client);

const userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'moeserve-chromium-'));
const context = await chromium.launchPersistentContext(userDataDir, {
  executablePath: exe, headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
  viewport: { width: 1280, height: 1100 },
});
const page = context.pages()[0] ?? await context.newPage();
const requested = [];
const problems = [];
page.on('request', (r) => requested.push(r.url()));
page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
page.on('console', (m) => { if (m.type() === 'error') problems.push(`console: ${m.text()}`); });

const tests = [];
const test = (name, fn) => tests.push({ name, fn });
const data = (id) => page.evaluate((i) => ({ ...document.getElementById(i).dataset }), id);

test('the page loads from the server alone and polls /metrics', async () => {
  const resp = await page.goto(`${base}/dashboard?interval=400`);
  assert.equal(resp.status(), 200);
  assert.match(resp.headers()['content-type'], /^text\/html/);
  assert.match(resp.headers()['content-security-policy'], /default-src 'none'/);
  await page.waitForFunction(() => Number(document.body.dataset.polls) >= 6, null, { timeout: 60000 });
  assert.ok(requested.every((u) => u.startsWith(base)), `only the server is asked: ${requested.filter((u) => !u.startsWith(base))}`);
  assert.ok(requested.some((u) => u === `${base}/metrics`));
  assert.equal(await page.evaluate(() => window.moeDashboard.prefix), 'moeserve');
});

test('requests, KV usage per rank and the imbalance gauge hold data under load', async () => {
  // Running requests and used KV blocks show while the clients run.
  await page.waitForFunction(() => window.moeDashboard.history.some((p) => {
    const s = p.snap.get('moeserve:num_requests_running');
    return s && s[0].value > 0;
  }), null, { timeout: 30000 });
  await page.waitForFunction(() => [...document.querySelectorAll('#kv-table tr')].some((r) => Number(r.dataset.usage) > 0),
    null, { timeout: 30000 });
  const req = await data('requests');
  assert.ok(Number(req.samples) >= 6);
  assert.ok(Number(req.running) >= 0 && Number(req.waiting) >= 0);
  const kv = await data('kv');
  assert.equal(Number(kv.ranks), 2);
  const usages = await page.$$eval('#kv-table tr', (rows) => rows.map((r) => Number(r.dataset.usage)));
  assert.equal(usages.length, 2);
  assert.ok(usages.every((u) => u >= 0 && u <= 1));
  const imb = Number((await data('imbalance')).value);
  assert.ok(imb >= 1 && imb <= 2, `imbalance ${imb} over 2 ranks`);
});

test('all-to-all time per step is drawn for each rank', async () => {
  await page.waitForFunction(() => Number(document.getElementById('a2a').dataset.samples) >= 3, null, { timeout: 30000 });
  const a = await data('a2a');
  assert.equal(Number(a.ranks), 2);
  assert.ok(Number(a.steps) > 0);
  assert.ok(Number(a.rank0Ms) >= 0 && Number(a.rank1Ms) >= 0);
  assert.match(await page.textContent('#a2a-legend'), /rank 0: [\d.]+ ms, rank 1: [\d.]+ ms/);
});

test('TTFT and ITL percentiles come from the histograms, ordered', async () => {
  await page.waitForFunction(() => Number(document.getElementById('latency').dataset.itlCount) > 0, null, { timeout: 30000 });
  const l = await data('latency');
  for (const k of ['ttft', 'itl']) {
    const [p50, p90, p99] = ['P50', 'P90', 'P99'].map((q) => Number(l[k + q]));
    assert.ok(Number(l[k + 'Count']) > 0, `${k} samples`);
    assert.ok(p50 > 0 && p50 <= p90 && p90 <= p99, `${k}: ${p50} ${p90} ${p99}`);
  }
  const cells = await page.$$eval('#ttft-row td', (tds) => tds.map((t) => t.textContent));
  assert.match(cells[1], /ms|s$/);
});

test('the heat maps of expert load per rank and layer and per rank and expert hold data', async () => {
  await page.waitForFunction(() => Number(document.getElementById('heat-layers').dataset.total) > 0, null, { timeout: 30000 });
  const layers = await data('heat-layers');
  assert.equal(Number(layers.rows), 2);
  assert.equal(Number(layers.cols), config.num_hidden_layers);
  assert.ok(Number(layers.nonzero) >= 2, 'both ranks took tokens');
  const experts = await data('heat-experts');
  assert.equal(Number(experts.rows), 2);
  assert.equal(Number(experts.cols), config.num_experts);
  assert.ok(Number(experts.total) > 0);
  // The canvases are painted: more than one colour in each.
  for (const id of ['heat-layers-canvas', 'heat-experts-canvas', 'imbalance-gauge', 'requests-chart']) {
    const colours = await page.evaluate((i) => {
      const c = document.getElementById(i);
      const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
      const seen = new Set();
      for (let p = 0; p < d.length; p += 4 * 7) seen.add(`${d[p]},${d[p + 1]},${d[p + 2]},${d[p + 3]}`);
      return seen.size;
    }, id);
    assert.ok(colours > 2, `${id} has ${colours} colours`);
  }
});

test('a screenshot is taken, and the page raised no errors', async () => {
  const out = path.join(process.env.MOESERVE_BUILD_ROOT ?? os.tmpdir(), 'tests', 'dashboard.png');
  fs.mkdirSync(path.dirname(out), { recursive: true });
  await page.screenshot({ path: out, fullPage: true });
  const png = fs.readFileSync(out);
  assert.equal(png.subarray(1, 4).toString(), 'PNG');
  assert.ok(png.length > 20000, `${png.length} bytes`);
  assert.deepEqual(problems, []);
  console.log(`# screenshot: ${out}`);
});

const originalStop = server.stop;
server.stop = async () => {
  loading = false;
  await Promise.allSettled(clients);
  await context.close();
  fs.rmSync(userDataDir, { recursive: true, force: true });
  return originalStop();
};
await runTests(tests, server);

// nginx_traffic.mjs: streams completions through a balancer until told to
// stop, checking every one: status 200, SSE chunks, a length finish with the
// usage it asked for, `data: [DONE]` last. Usage: node nginx_traffic.mjs
// BASE_URL WORKERS MAX_TOKENS STOP_FILE. Runs until STOP_FILE exists, then
// prints one JSON line {"ok": n, "failed": n, "errors": [...]} and exits 0
// when nothing failed.
import { existsSync } from 'node:fs';

const [base, workersArg, maxTokensArg, stopFile] = process.argv.slice(2);
const workers = Number(workersArg), maxTokens = Number(maxTokensArg);
let ok = 0, failed = 0;
const errors = [];

async function one(i) {
  const body = JSON.stringify({
    model: 'tiny', prompt: `request ${i} through the balancer`, max_tokens: maxTokens,
    ignore_eos: true, stream: true, stream_options: { include_usage: true },
  });
  const res = await fetch(`${base}/v1/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body,
  });
  const text = await res.text();
  if (res.status !== 200) throw new Error(`status ${res.status}: ${text.slice(0, 200)}`);
  const events = text.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6));
  if (events[events.length - 1] !== '[DONE]') throw new Error(`no [DONE] at the end: ${text.slice(-200)}`);
  const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
  const finish = chunks.flatMap((c) => c.choices).map((c) => c.finish_reason).filter((f) => f);
  if (finish.length !== 1 || finish[0] !== 'length') throw new Error(`finish reasons ${JSON.stringify(finish)}`);
  const usage = chunks[chunks.length - 1].usage;
  if (!usage || usage.completion_tokens !== maxTokens) throw new Error(`usage ${JSON.stringify(usage)}`);
}

let next = 0;
async function worker() {
  while (!existsSync(stopFile)) {
    const i = next++;
    try {
      await one(i);
      ok++;
    } catch (e) {
      failed++;
      if (errors.length < 10) errors.push(`request ${i}: ${e.message}`);
    }
  }
}

await Promise.all(Array.from({ length: workers }, worker));
console.log(JSON.stringify({ ok, failed, errors }));
process.exit(failed ? 1 : 0);

// moeserve as a drop-in for a vLLM deployment: a `vllm serve` command line
// copied from vLLM's own documentation starts it (the model a local folder,
// as there is no hub here); one carrying every vLLM flag moeserve takes
// starts and each flag does what it says (--chat-template FILE,
// --generation-config DIR with --override-generation-config,
// --max-logprobs, --root-path, --metrics-prefix vllm, CORS with
// --allowed-origins) or is logged as changing nothing; flags whose meaning
// cannot be honoured (-tp 2, --dtype float16...) are refused with a
// sentence; and the endpoints vLLM and llama-server answer beside the API
// (/ping, /v1/health, /version, /v1/models/{id}) answer. CORS is off unless
// configured.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer } from './serve.mjs';

const bin = process.env.MOESERVE_BIN;
const modelDir = process.env.MOESERVE_TINY_MODEL;
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'moeserve-vllm-'));
const UI = 'http://ui.example:3000';

// A raw request: status, headers and body (fetch would hide CORS headers' absence).
function raw(port, method, url, headers = {}, body = null) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, method, path: url, headers }, (res) => {
      let data = '';
      res.on('data', (d) => { data += d; });
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: data }));
    });
    req.on('error', reject);
    if (body) req.write(body);
    req.end();
  });
}

const results = [];
async function test(name, fn) {
  try {
    await fn();
    console.log(`ok - ${name}`);
  } catch (e) {
    results.push(name);
    console.log(`not ok - ${name}\n${e.stack ?? e}`);
  }
}

// ---- the docs' command line ---------------------------------------------------------------
// vLLM's OpenAI-compatible server page: `vllm serve NousResearch/Meta-Llama-3-8B-Instruct
// --dtype auto --api-key token-abc123`, with `moeserve` for `vllm` and a folder for the model.
{
  const server = await startServer([...['--dtype', 'auto', '--api-key', 'token-abc123']]);
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${server.port}/v1`, apiKey: 'token-abc123', maxRetries: 0 });
  await test('the docs\' `vllm serve MODEL --dtype auto --api-key token-abc123` starts and serves', async () => {
    const r = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'Hello!' }], max_tokens: 3 });
    assert.equal(r.object, 'chat.completion');
    assert.match(server.log(), /--dtype auto: .*changes nothing/);
  });
  await test('CORS is off unless configured: no preflight answer, no CORS headers', async () => {
    const pre = await raw(server.port, 'OPTIONS', '/v1/chat/completions', { Origin: UI,
      'Access-Control-Request-Method': 'POST' });
    assert.equal(pre.status, 405);
    assert.equal(pre.headers['access-control-allow-origin'], undefined);
    const get = await raw(server.port, 'GET', '/v1/models', { Origin: UI, Authorization: 'Bearer token-abc123' });
    assert.equal(get.status, 200);
    assert.equal(get.headers['access-control-allow-origin'], undefined);
  });
  await test('/ping, /v1/health, /version, /v1/models/{id}', async () => {
    for (const p of ['/ping', '/v1/health', '/health']) {
      const r = await raw(server.port, 'GET', p);
      assert.equal(r.status, 200, p);
    }
    assert.equal((await raw(server.port, 'POST', '/ping')).status, 200);
    const v = JSON.parse((await raw(server.port, 'GET', '/version', { Authorization: 'Bearer token-abc123' })).body);
    assert.equal(v.name, 'moeserve');
    assert.match(v.version, /^\d+\.\d+/);
    const m = await client.models.retrieve('tiny');
    assert.equal(m.id, 'tiny');
    assert.equal(m.object, 'model');
    await assert.rejects(client.models.retrieve('nope'), (e) => e instanceof OpenAI.NotFoundError);
  });
  await server.stop();
}

// ---- every vLLM flag moeserve takes --------------------------------------------------------
{
  const template = path.join(dir, 'template.jinja');
  fs.writeFileSync(template, '{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n'
    + '{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\nCUSTOMIZED{% endif %}');
  const genDir = path.join(dir, 'gen');
  fs.mkdirSync(genDir);
  fs.writeFileSync(path.join(genDir, 'generation_config.json'), JSON.stringify({ temperature: 0.3, top_p: 0.7 }));
  const args = ['-tp', '1', '--dtype', 'bfloat16', '--seed', '0', '--trust-remote-code', '--enforce-eager',
    '--disable-log-requests', '--disable-log-stats', '--uvicorn-log-level', 'info', '--max-logprobs', '3',
    '--enable-prompt-tokens-details', '--chat-template', template, '--generation-config', genDir,
    '--override-generation-config', '{"top_p": 0.5}', '--allowed-origins', `["${UI}"]`,
    '--root-path', '/api', '--kv-cache-memory-bytes', '64MiB', '--metrics-prefix', 'vllm',
    '--enable-reasoning', '--reasoning-parser', 'deepseek_r1', '--swap-space', '4', '--block-size', '16',
    '--host', '127.0.0.1', '--port', '0', '--served-model-name', 'tiny', '--max-model-len', '2048',
    '--gpu-memory-utilization', '0.9', '--max-num-seqs', '8', '--threads', '1'];
  const server = await startServer(args, { model: 'flag', defaults: false });
  const base = `http://127.0.0.1:${server.port}`;
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
  await test('flags that change nothing are accepted and logged as such', async () => {
    for (const f of ['--tensor-parallel-size 1', '--dtype bfloat16', '--seed', '--trust-remote-code',
      '--enforce-eager', '--disable-log-requests', '--disable-log-stats', '--enable-prompt-tokens-details',
      '--enable-reasoning', '--swap-space 4'])
      assert.ok(server.log().includes(`${f}`) && new RegExp(`${f.replace(/[-]/g, '\\-')}[^\\n]*changes nothing`).test(server.log()),
        `${f} is logged as changing nothing`);
  });
  await test('--chat-template FILE renders the prompt', async () => {
    const r = await fetch(`${base}/tokenize`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'Hi' }] }) });
    const { tokens } = await r.json();
    const d = await fetch(`${base}/detokenize`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: 'tiny', tokens }) });
    assert.match((await d.json()).prompt, /assistant\nCUSTOMIZED$/);
  });
  await test('--generation-config DIR and --override-generation-config set the default sampling', async () => {
    const r = await client.responses.create({ model: 'tiny', input: 'Hi', max_output_tokens: 2 });
    assert.equal(r.temperature, 0.3, 'from the folder');
    assert.equal(r.top_p, 0.5, 'the override over the folder');
    const given = await client.responses.create({ model: 'tiny', input: 'Hi', max_output_tokens: 2, temperature: 1 });
    assert.equal(given.temperature, 1, 'a request\'s own value wins');
  });
  await test('--max-logprobs bounds top_logprobs and logprobs', async () => {
    const messages = [{ role: 'user', content: 'Hi' }];
    const ok = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 2, logprobs: true, top_logprobs: 3 });
    assert.equal(ok.choices[0].logprobs.content[0].top_logprobs.length, 3);
    await assert.rejects(client.chat.completions.create({ model: 'tiny', messages, max_tokens: 2, logprobs: true, top_logprobs: 4 }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'top_logprobs' && /--max-logprobs/.test(e.message));
    await assert.rejects(client.completions.create({ model: 'tiny', prompt: 'Hi', max_tokens: 2, logprobs: 5 }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'logprobs');
  });
  await test('--root-path: /api/v1/... is /v1/..., and /v1/... is served too', async () => {
    for (const p of ['/api/v1/models', '/v1/models', '/api/health', '/api/v1/models/tiny']) {
      const r = await raw(server.port, 'GET', p);
      assert.equal(r.status, 200, p);
    }
    const c = new OpenAI({ baseURL: `${base}/api/v1`, apiKey: 'unused', maxRetries: 0 });
    const r = await c.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2 });
    assert.equal(r.usage.completion_tokens > 0, true);
  });
  await test('--metrics-prefix vllm: /metrics speaks vLLM\'s names', async () => {
    const t = (await raw(server.port, 'GET', '/metrics')).body;
    assert.match(t, /^vllm:num_requests_waiting\{model_name="tiny"\} \d+$/m);
    assert.match(t, /^vllm:kv_cache_usage_perc\{model_name="tiny",rank="0"\} /m);
    assert.match(t, /^vllm:request_prompt_tokens_count\{model_name="tiny"\} [1-9]/m);
    assert.match(t, /^vllm:cache_config_info\{[^}]*block_size="16"[^}]*\} 1$/m);
    assert.doesNotMatch(t, /moeserve:/);
  });
  await test('CORS: the preflight of an allowed origin is answered, others refused; responses carry the header', async () => {
    const pre = await raw(server.port, 'OPTIONS', '/v1/chat/completions', { Origin: UI,
      'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'content-type, authorization' });
    assert.equal(pre.status, 204);
    assert.equal(pre.headers['access-control-allow-origin'], UI);
    assert.match(pre.headers['access-control-allow-methods'], /POST/);
    assert.match(pre.headers['access-control-allow-headers'], /content-type/i);
    assert.equal(pre.headers.vary, 'Origin');
    const evil = await raw(server.port, 'OPTIONS', '/v1/chat/completions', { Origin: 'http://evil.example',
      'Access-Control-Request-Method': 'POST' });
    assert.equal(evil.status, 403);
    assert.equal(evil.headers['access-control-allow-origin'], undefined);
    const post = await raw(server.port, 'POST', '/v1/chat/completions', { Origin: UI, 'Content-Type': 'application/json' },
      JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2 }));
    assert.equal(post.status, 200);
    assert.equal(post.headers['access-control-allow-origin'], UI);
    const stream = await raw(server.port, 'POST', '/v1/chat/completions', { Origin: UI, 'Content-Type': 'application/json' },
      JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2, stream: true }));
    assert.equal(stream.headers['access-control-allow-origin'], UI, 'streams carry it too');
    const err = await raw(server.port, 'GET', '/v1/models/nope', { Origin: UI });
    assert.equal(err.status, 404);
    assert.equal(err.headers['access-control-allow-origin'], UI, 'errors carry it too, so the page can read them');
    const other = await raw(server.port, 'GET', '/v1/models', { Origin: 'http://evil.example' });
    assert.equal(other.headers['access-control-allow-origin'], undefined);
  });
  const e = await server.stop();
  await test('the server with every flag stops cleanly', async () => assert.equal(e.code, 0));
}

// ---- what cannot be honoured is refused, with a sentence ----------------------------------
// ---- add_special_tokens, on a tokenizer whose post-processor adds a BOS ---------------------
// Llama-style checkpoints put a BOS through TemplateProcessing (Qwen3's adds
// nothing): vLLM adds it to a raw prompt (completions, /tokenize prompt) and
// not to a rendered chat, whose template writes its own; the request's
// add_special_tokens overrides either way.
{
  const bosDir = path.join(dir, 'bos-model');
  fs.mkdirSync(bosDir);
  for (const f of fs.readdirSync(modelDir)) if (f !== 'tokenizer.json') fs.symlinkSync(path.join(modelDir, f), path.join(bosDir, f));
  const tj = JSON.parse(fs.readFileSync(path.join(modelDir, 'tokenizer.json'), 'utf8'));
  const BOS = 151643; // <|endoftext|>
  tj.post_processor = { type: 'TemplateProcessing',
    single: [{ SpecialToken: { id: '<|endoftext|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
    pair: [{ Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
    special_tokens: { '<|endoftext|>': { id: '<|endoftext|>', ids: [BOS], tokens: ['<|endoftext|>'] } } };
  fs.writeFileSync(path.join(bosDir, 'tokenizer.json'), JSON.stringify(tj));
  const server = await startServer([], { modelDir: bosDir });
  const base = `http://127.0.0.1:${server.port}`;
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 });
  await test('add_special_tokens: a BOS on raw prompts, none on chats, unless the request says otherwise', async () => {
    const tokenize = async (body) => (await (await fetch(`${base}/tokenize`, { method: 'POST',
      headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ model: 'tiny', ...body }) })).json()).tokens;
    const messages = [{ role: 'user', content: 'Hi' }];
    const raw = await tokenize({ prompt: 'Hi' });
    assert.equal(raw[0], BOS);
    assert.deepEqual(await tokenize({ prompt: 'Hi', add_special_tokens: false }), raw.slice(1));
    const chat = await tokenize({ messages });
    assert.notEqual(chat[0], BOS);
    assert.deepEqual(await tokenize({ messages, add_special_tokens: true }), [BOS, ...chat]);
    const used = async (create, p) => (await create(p)).usage.prompt_tokens;
    const cmpl = (p) => client.completions.create({ model: 'tiny', prompt: 'Hi', max_tokens: 1, ...p });
    assert.equal(await used(cmpl, {}), raw.length);
    assert.equal(await used(cmpl, { add_special_tokens: false }), raw.length - 1);
    const chatc = (p) => client.chat.completions.create({ model: 'tiny', messages, max_tokens: 1, ...p });
    assert.equal(await used(chatc, {}), chat.length);
    assert.equal(await used(chatc, { add_special_tokens: true }), chat.length + 1);
  });
  await server.stop();
}

// ---- a checkpoint whose config files name no eos_token_id ---------------------------------
// vLLM falls back to the tokenizer's eos_token; so does moeserve (answers,
// grammars and stop reasons need one), saying so in the log.
{
  const noEos = path.join(dir, 'no-eos-model');
  fs.mkdirSync(noEos);
  for (const f of fs.readdirSync(modelDir)) {
    if (f === 'config.json' || f === 'generation_config.json') {
      const c = JSON.parse(fs.readFileSync(path.join(modelDir, f), 'utf8'));
      delete c.eos_token_id;
      fs.writeFileSync(path.join(noEos, f), JSON.stringify(c));
    } else {
      fs.symlinkSync(path.join(modelDir, f), path.join(noEos, f));
    }
  }
  const server = await startServer([], { modelDir: noEos });
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${server.port}/v1`, apiKey: 'unused', maxRetries: 0 });
  // A config that names another id only (<|endoftext|>): the tokenizer's
  // eos still ends answers as the model's own end (stop_reason null), as in
  // vLLM, and the config's id stops by name.
  const otherEos = path.join(dir, 'other-eos-model');
  fs.mkdirSync(otherEos);
  for (const f of fs.readdirSync(modelDir)) {
    if (f === 'generation_config.json') {
      const c = JSON.parse(fs.readFileSync(path.join(modelDir, f), 'utf8'));
      c.eos_token_id = [151643];
      fs.writeFileSync(path.join(otherEos, f), JSON.stringify(c));
    } else {
      fs.symlinkSync(path.join(modelDir, f), path.join(otherEos, f));
    }
  }
  const other = await startServer([], { modelDir: otherEos });
  const oc = new OpenAI({ baseURL: `http://127.0.0.1:${other.port}/v1`, apiKey: 'unused', maxRetries: 0 });
  await test('the tokenizer\'s eos_token ends answers even when the config lists other ids only', async () => {
    const ask = (id) => oc.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'Hi' }],
      max_tokens: 5, logit_bias: { [id]: 100 } });
    let r = await ask(151645);
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.equal(r.choices[0].stop_reason, null);
    r = await ask(151643);
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.equal(r.choices[0].stop_reason, 151643);
  });
  await other.stop();
  await test('no eos_token_id in the config files: the tokenizer\'s eos_token ends answers', async () => {
    assert.match(server.log(), /no eos_token_id .*using the tokenizer's eos_token "<\|im_end\|>" \(id 151645\)/);
    const r = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'Hi' }],
      max_tokens: 5, logit_bias: { 151645: 100 } });
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.equal(r.usage.completion_tokens, 1);
    const j = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'Hi' }],
      max_tokens: 200, seed: 1, temperature: 1, reasoning_effort: 'none', response_format: { type: 'json_object' } });
    assert.equal(typeof JSON.parse(j.choices[0].message.content), 'object');
  });
  await server.stop();
}

await test('flags whose meaning moeserve cannot honour are refused with a sentence', async () => {
  const cases = [
    [['-tp', '2'], /--tensor-parallel-size 2 cannot be honoured: .*--data-parallel-size 2 --enable-expert-parallel/],
    [['--tensor-parallel-size=4'], /tensor parallelism/],
    [['--pipeline-parallel-size', '2'], /pipeline/],
    [['--dtype', 'float16'], /--dtype float16 cannot be honoured/],
    [['--block-size', '32'], /blocks hold 16 tokens/],
    [['--max-logprobs', '50'], /at most 20/],
    [['--metrics-prefix', 'prom'], /--metrics-prefix must be moeserve or vllm/],
    [['--tool-call-parser', 'mistral'], /--tool-call-parser mistral is not served; hermes .*qwen3_coder/],
    [['--override-generation-config', '[1]'], /must be a JSON object/],
    [['--allowed-origins', '["a",'], /--allowed-origins must be a JSON list/],
    [['--model', '/elsewhere'], /two models/],
  ];
  for (const [extra, want] of cases) {
    const r = spawnSync(bin, ['serve', modelDir, '--port', '0', ...extra], { encoding: 'utf8', timeout: 30000 });
    assert.equal(r.status, 2, `${extra.join(' ')}: ${r.stderr}`);
    assert.match(r.stderr, want, extra.join(' '));
  }
  for (const [extra, want] of [[['--generation-config', path.join(dir, 'nope')], /--generation-config .*generation_config\.json/],
    [['--chat-template', path.join(dir, 'nope.jinja')], /--chat-template .*not a readable file/]]) {
    const r = spawnSync(bin, ['serve', modelDir, '--port', '0', '--kv-cache-memory', '64MiB', '--threads', '1', ...extra],
      { encoding: 'utf8', timeout: 60000 });
    assert.equal(r.status, 1, `${extra.join(' ')}: ${r.stderr}`);
    assert.match(r.stderr, want, extra.join(' '));
  }
});

fs.rmSync(dir, { recursive: true, force: true });
console.log(results.length ? `${results.length} failed` : 'all passed');
process.exit(results.length ? 1 : 0);

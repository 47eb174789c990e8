// The Qwen3 2507 releases' template kinds on a live server, each written here
// in that model's style (its shape, not its text), so that the test needs no
// download:
// - Instruct-2507's never thinks: it writes <think> only to replay earlier
//   turns, and has no enable_thinking. The reasoning parser stays off
//   (--reasoning-parser auto), so structured output and forced calls hold
//   from the first token (they had waited for a </think> that never comes).
// - Thinking-2507's generation prompt opens <think> itself: the parser is on,
//   and the grammar takes over after the model's </think>.
// - A thinking template that refuses the start-up probe (one user message:
//   this one wants a system message first) leaves the parser off with a
//   warning that names the flag turning it on, and the flag does.
// - A model folder's chat_template.jinja wins over tokenizer_config.json's
//   chat_template, as in transformers and vLLM.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { runTests, startServer } from './serve.mjs';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'moeserve-2507-'));
const turns = (genPrompt) => `{%- for m in messages %}
{%- if m.role == 'assistant' %}<|im_start|>assistant
{%- if m.reasoning_content %}
<think>
{{ m.reasoning_content }}
</think>
{% endif %}
{{ m.content }}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}${genPrompt}{% endif %}`;
const instruct = path.join(dir, 'instruct.jinja');
const thinking = path.join(dir, 'thinking.jinja');
fs.writeFileSync(instruct, turns('<|im_start|>assistant\n'));
fs.writeFileSync(thinking, turns('<|im_start|>assistant\n<think>\n'));
const strict = path.join(dir, 'strict.jinja');
fs.writeFileSync(strict, "{%- if messages[0].role != 'system' %}{{ raise_exception('a system message comes first') }}" +
  '{% endif %}' + turns('<|im_start|>assistant\n<think>\n'));

// A copy of the tiny model whose chat_template.jinja says so.
const modelDir = path.join(dir, 'model');
fs.mkdirSync(modelDir);
for (const f of fs.readdirSync(process.env.MOESERVE_TINY_MODEL))
  fs.symlinkSync(path.join(process.env.MOESERVE_TINY_MODEL, f), path.join(modelDir, f));
fs.writeFileSync(path.join(modelDir, 'chat_template.jinja'),
  '{% for m in messages %}FROM-THE-JINJA-FILE {{ m.content }}\n{% endfor %}');

const messages = [{ role: 'user', content: 'Give me a number.' }];
const schema = { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'] };
const tools = [{ type: 'function', function: { name: 'f', parameters: { type: 'object',
  properties: { x: { type: 'integer' } }, required: ['x'] } } }];
const clientOf = (s) => new OpenAI({ baseURL: `http://127.0.0.1:${s.port}/v1`, apiKey: 'unused', maxRetries: 0 });

const tests = [];
const test = (name, fn) => tests.push({ name, fn });

test('Instruct-2507 style: no reasoning split; structured output and forced calls hold at once', async () => {
  const s = await startServer(['--chat-template', instruct]);
  try {
    assert.match(s.log(), /reasoning parser off/);
    const client = clientOf(s);
    const r = await client.chat.completions.create({ model: 'tiny', messages, temperature: 0, max_tokens: 80,
      response_format: { type: 'json_schema', json_schema: { name: 'n', schema } } });
    assert.ok(Number.isInteger(JSON.parse(r.choices[0].message.content).a), r.choices[0].message.content);
    const t = await client.chat.completions.create({ model: 'tiny', messages, tools, tool_choice: 'required',
      temperature: 0, max_tokens: 120 });
    assert.equal(t.choices[0].finish_reason, 'tool_calls', JSON.stringify(t.choices[0].message));
    assert.ok(Number.isInteger(JSON.parse(t.choices[0].message.tool_calls[0].function.arguments).x));
  } finally {
    await s.stop();
  }
});

test('Thinking-2507 style: the prompt opens <think>; the grammar starts after </think>', async () => {
  const s = await startServer(['--chat-template', thinking]);
  try {
    assert.match(s.log(), /reasoning parser qwen3/);
    // The bias makes </think> the first token: empty reasoning, then the choice.
    const r = await clientOf(s).chat.completions.create({ model: 'tiny', messages, max_tokens: 20,
      logit_bias: { 151668: 100 }, structured_outputs: { choice: ['Answer'] } });
    assert.equal(r.choices[0].message.content, 'Answer');
  } finally {
    await s.stop();
  }
});

test('a thinking template that refuses the probe: the parser off, a warning naming the flag, which turns it on',
  async () => {
    const s = await startServer(['--chat-template', strict]);
    try {
      assert.match(s.log(), /the chat template holds <think> but refused a one-message probe \(.*a system message comes first.*\): the reasoning parser stays off; --reasoning-parser qwen3 turns it on/);
      assert.match(s.log(), /reasoning parser off/);
    } finally {
      await s.stop();
    }
    const on = await startServer(['--chat-template', strict, '--reasoning-parser', 'qwen3']);
    try {
      assert.match(on.log(), /reasoning parser qwen3/);
      assert.doesNotMatch(on.log(), /refused a one-message probe/);
    } finally {
      await on.stop();
    }
  });

const server = await startServer([], { modelDir });
test('chat_template.jinja wins over tokenizer_config.json\'s chat_template', async () => {
  const post = async (p, body) => (await fetch(`http://127.0.0.1:${server.port}${p}`, { method: 'POST',
    headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })).json();
  const t = await post('/tokenize', { model: 'tiny', messages });
  const d = await post('/detokenize', { model: 'tiny', tokens: t.tokens });
  assert.equal(d.prompt, 'FROM-THE-JINJA-FILE Give me a number.\n');
});

await runTests(tests, server);
fs.rmSync(dir, { recursive: true, force: true });

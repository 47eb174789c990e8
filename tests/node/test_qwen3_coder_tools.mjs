// Qwen3-Coder's tool calls (vLLM's --tool-call-parser qwen3_coder) on a live
// server: a chat template in that model's style (it shows the model
// <tool_call><function=NAME><parameter=KEY>VALUE</parameter> calls, and
// renders earlier calls from their arguments as objects) makes the server
// read calls in that format by itself (--tool-call-parser auto); a forced
// output spelling such a call comes back as OpenAI tool_calls whose values
// take the types the tool's parameters give them, streamed as whole; the
// history of a call renders from its arguments; tool_choice required still
// gives a valid call. The template is written here, in the shape of the
// model's (its format, not its text), so that the test needs no download.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { runTests, startServer } from './serve.mjs';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'moeserve-coder-'));
const template = path.join(dir, 'coder.jinja');
fs.writeFileSync(template, `{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{%- if m.content %}
{{ m.content }}{% endif %}
{%- for c in m.tool_calls %}
<tool_call>
<function={{ c.function.name }}>
{% for k, v in c.function.arguments|items %}<parameter={{ k }}>
{{ v | tojson if v is mapping or (v is sequence and v is not string) else v | string }}
</parameter>
{% endfor %}</function>
</tool_call>
{%- endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{% if loop.first and tools %}Call functions as <tool_call>
<function=NAME>
<parameter=KEY>
VALUE
</parameter>
</function>
</tool_call> with these: {{ tools | tojson }}
{% endif %}{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}`);

const server = await startServer(['--chat-template', template]);
const client = new OpenAI({ baseURL: `http://127.0.0.1:${server.port}/v1`, apiKey: 'unused', maxRetries: 0 });
const tools = [{ type: 'function', function: { name: 'write_file', description: 'Write a file',
  parameters: { type: 'object', properties: { path: { type: 'string', maxLength: 12 }, lines: { type: 'integer' },
    force: { type: 'boolean' }, meta: { type: 'object' } }, required: ['path'] } } }];
const messages = [{ role: 'user', content: 'Write it.' }];
const call = '<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/a b.txt\n</parameter>\n' +
  '<parameter=lines>\n42\n</parameter>\n<parameter=force>\ntrue\n</parameter>\n' +
  '<parameter=meta>\n{"mode": "w"}\n</parameter>\n</function>\n</tool_call>';
const want = { path: '/tmp/a b.txt', lines: 42, force: true, meta: { mode: 'w' } };

const tests = [];
const test = (name, fn) => tests.push({ name, fn });

test('the template\'s format is picked by itself (--tool-call-parser auto)', async () => {
  assert.match(server.log(), /tool calls parsed when tools are given \(qwen3_coder\)/);
});

test('an XML call comes back as tool_calls with typed arguments, streamed as whole', async () => {
  const params = { model: 'tiny', messages, tools, structured_outputs: { choice: [`Writing.\n${call}`] }, max_tokens: 200 };
  const r = await client.chat.completions.create(params);
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls');
  assert.equal(c.message.content, 'Writing.');
  assert.equal(c.message.tool_calls.length, 1);
  assert.equal(c.message.tool_calls[0].function.name, 'write_file');
  assert.deepEqual(JSON.parse(c.message.tool_calls[0].function.arguments), want);
  let args = '', content = '', finish = null;
  for await (const chunk of await client.chat.completions.create({ ...params, stream: true })) {
    const d = chunk.choices[0]?.delta;
    if (d?.content) content += d.content;
    for (const tc of d?.tool_calls ?? []) args += tc.function?.arguments ?? '';
    if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.equal(content, 'Writing.');
  assert.equal(args, c.message.tool_calls[0].function.arguments);
  assert.equal(finish, 'tool_calls');
});

test('a call in the history renders from its arguments as an object', async () => {
  const history = [...messages, { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
    function: { name: 'write_file', arguments: JSON.stringify(want) } }] },
  { role: 'tool', tool_call_id: 'call_1', content: 'ok' }];
  const post = async (p, body) => (await fetch(`http://127.0.0.1:${server.port}${p}`, { method: 'POST',
    headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ model: 'tiny', ...body }) })).json();
  const { tokens } = await post('/tokenize', { messages: history, tools });
  const { prompt } = await post('/detokenize', { tokens });
  // (true | string is Python's "True", as transformers renders it)
  assert.ok(prompt.includes('<function=write_file>\n<parameter=path>\n/tmp/a b.txt\n</parameter>\n' +
    '<parameter=lines>\n42\n</parameter>\n<parameter=force>\nTrue\n</parameter>\n' +
    '<parameter=meta>\n{"mode": "w"}\n</parameter>\n</function>'), prompt);
  const r = await client.chat.completions.create({ model: 'tiny', messages: history, tools, max_tokens: 2 });
  assert.equal(r.usage.prompt_tokens, tokens.length); // /tokenize adds the generation prompt too
  // Empty or missing arguments are no arguments (vLLM's {}), not a template error.
  for (const args of ['', null]) {
    const h = [...messages, { role: 'assistant', content: null, tool_calls: [{ id: 'c', type: 'function',
      function: { name: 'write_file', arguments: args } }] }, { role: 'tool', tool_call_id: 'c', content: 'ok' }];
    const t = await post('/tokenize', { messages: h, tools });
    assert.ok(Array.isArray(t.tokens), JSON.stringify(t));
  }
});

test('tool_choice required gives a valid call of the tool', async () => {
  for (const seed of [1, 2]) {
    const r = await client.chat.completions.create({ model: 'tiny', messages, tools, tool_choice: 'required',
      seed, temperature: 1, max_tokens: 600 });
    const tc = r.choices[0].message.tool_calls?.[0];
    assert.ok(tc, JSON.stringify(r.choices[0].message));
    assert.equal(tc.function.name, 'write_file');
    assert.equal(typeof JSON.parse(tc.function.arguments).path, 'string');
  }
});

await runTests(tests, server);
fs.rmSync(dir, { recursive: true, force: true });

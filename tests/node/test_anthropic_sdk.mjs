// Drives POST /v1/messages and /v1/messages/count_tokens on `moeserve serve`
// (tiny model: random weights, the real Qwen3 tokenizer and template) with
// Anthropic's official SDK (@anthropic-ai/sdk): messages.create and
// messages.stream (events in Anthropic's order, the helper's final message
// equal to the whole answer), a tool_use round trip (tool_choice any gives a
// tool_use block whose input validates — the grammar guarantees it — and a
// tool_result goes back), thinking blocks, stop_sequences, countTokens, the
// x-api-key header, and Anthropic's error shape and classes.
import assert from 'node:assert/strict';
import Ajv from 'ajv';
import Anthropic from '@anthropic-ai/sdk';
import { runTests, startServer, streamInPieces } from './serve.mjs';

const KEY = 'anthropic-test-key';
const server = await startServer(['--api-key', KEY, '--reasoning-parser', 'qwen3']);
const baseURL = `http://127.0.0.1:${server.port}`;
const client = new Anthropic({ baseURL, apiKey: KEY, maxRetries: 0 });
const ajv = new Ajv({ strict: false, allErrors: true });
const messages = [{ role: 'user', content: 'Tell me about the sea.' }];
const greedy = { model: 'tiny', temperature: 0, ignore_eos: true };

const weather = {
  name: 'get_weather', description: 'The weather in a city',
  input_schema: { type: 'object', properties: { city: { type: 'string', maxLength: 20 },
    unit: { enum: ['c', 'f'] } }, required: ['city', 'unit'] },
};

function validate(schema, value, what) {
  const v = ajv.compile(schema);
  if (!v(value)) throw new Error(`${what}: ${JSON.stringify(value)} fails: ${ajv.errorsText(v.errors)}`);
}

// The raw events of a streamed create, in order.
async function rawEvents(params) {
  const stream = await client.messages.create({ ...params, stream: true });
  const all = [];
  for await (const ev of stream) all.push(ev);
  return all;
}

const text = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');

const tests = [];
const test = (name, fn) => tests.push({ name, fn });

test('messages.create: the Message, its id, content and usage (x-api-key)', async () => {
  const m = await client.messages.create({ ...greedy, messages, max_tokens: 8 });
  assert.equal(m.type, 'message');
  assert.match(m.id, /^msg_[0-9a-f]{24}$/);
  assert.equal(m.role, 'assistant');
  assert.equal(m.model, 'tiny');
  assert.equal(m.content.length, 1);
  assert.equal(m.content[0].type, 'text');
  assert.equal(typeof m.content[0].text, 'string');
  assert.equal(m.stop_reason, 'max_tokens');
  assert.equal(m.stop_sequence, null);
  assert.equal(m.usage.output_tokens, 8);
  assert.ok(m.usage.input_tokens > 0);
  assert.equal(m.usage.cache_read_input_tokens + m.usage.input_tokens > 0, true);
});

test('system prompts (string and blocks) reach the prompt; countTokens agrees with usage', async () => {
  const bare = await client.messages.countTokens({ model: 'tiny', messages });
  const sys = await client.messages.countTokens({ model: 'tiny', messages, system: 'You are terse.' });
  const blocks = await client.messages.countTokens({ model: 'tiny', messages,
    system: [{ type: 'text', text: 'You are terse.' }] });
  assert.ok(sys.input_tokens > bare.input_tokens);
  assert.equal(blocks.input_tokens, sys.input_tokens);
  const m = await client.messages.create({ ...greedy, messages, system: 'You are terse.', max_tokens: 1 });
  assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, sys.input_tokens);
});

test('stream: message_start, content blocks with text_delta, message_delta, message_stop', async () => {
  const params = { ...greedy, messages, max_tokens: 48 };
  const whole = await client.messages.create(params);
  const isDelta = (e) => e.type === 'content_block_delta';
  const all = await streamInPieces(() => rawEvents(params), (evs) => evs.filter(isDelta).length);
  const types = all.map((e) => e.type);
  assert.equal(types[0], 'message_start');
  assert.equal(all[0].message.id.startsWith('msg_'), true);
  assert.deepEqual(all[0].message.content, []);
  assert.equal(all[0].message.stop_reason, null);
  assert.deepEqual(types.slice(-2), ['message_delta', 'message_stop']);
  assert.equal(types.at(-3), 'content_block_stop');
  const start = all.find((e) => e.type === 'content_block_start');
  assert.deepEqual(start.content_block, { type: 'text', text: '' });
  const deltas = all.filter(isDelta);
  assert.ok(deltas.length > 1, 'the text comes in several deltas');
  assert.ok(deltas.every((d) => d.index === 0 && d.delta.type === 'text_delta'));
  assert.equal(deltas.map((d) => d.delta.text).join(''), text(whole));
  const md = all.at(-2);
  assert.equal(md.delta.stop_reason, 'max_tokens');
  assert.equal(md.usage.output_tokens, 48);
});

// A prompt asked again is read from the prefix cache: message_start counts
// the cached share apart from input_tokens, as message_delta does (a proxy
// that meters from message_start must not count it as new input).
test('stream: message_start usage splits the cached prefix as message_delta does', async () => {
  const params = { ...greedy, system: 'You answer in one short sentence. '.repeat(12), messages, max_tokens: 4 };
  await client.messages.create(params);
  const all = await rawEvents(params);
  const start = all[0].message.usage, delta = all.at(-2).usage;
  assert.ok(delta.cache_read_input_tokens > 0, JSON.stringify(delta));
  assert.equal(start.cache_read_input_tokens, delta.cache_read_input_tokens);
  assert.equal(start.input_tokens, delta.input_tokens);
});

test('messages.stream helper: text events and finalMessage equal the whole answer', async () => {
  const params = { ...greedy, messages, max_tokens: 10 };
  const whole = await client.messages.create(params);
  const stream = client.messages.stream(params);
  let streamed = '';
  stream.on('text', (t) => { streamed += t; });
  const final = await stream.finalMessage();
  assert.equal(streamed, text(whole));
  assert.equal(text(final), text(whole));
  assert.equal(final.stop_reason, 'max_tokens');
  assert.equal(final.usage.output_tokens, 10);
});

test('tool_use round trip: tool_choice any gives a valid call, its tool_result goes back', async () => {
  const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const params = { model: 'tiny', messages: ask, tools: [weather], tool_choice: { type: 'any' },
    max_tokens: 300, temperature: 1, thinking: { type: 'disabled' } };
  const got = [];
  for (const seed of [1, 2, 3]) {
    const m = await client.messages.create({ ...params, seed });
    assert.equal(m.stop_reason, 'tool_use', JSON.stringify(m.content));
    const uses = m.content.filter((b) => b.type === 'tool_use');
    assert.equal(uses.length, 1);
    assert.match(uses[0].id, /^toolu_[0-9a-f]{24}$/);
    assert.equal(uses[0].name, 'get_weather');
    validate(weather.input_schema, uses[0].input, `seed ${seed}`);
    got.push(m);
  }
  // Streamed: input_json_delta pieces; the helper parses them into the same input.
  const stream = client.messages.stream({ ...params, seed: 1 });
  let partial = '';
  stream.on('inputJson', (delta) => { partial += delta; });
  const final = await stream.finalMessage();
  const use = final.content.find((b) => b.type === 'tool_use');
  assert.deepEqual(use.input, got[0].content.find((b) => b.type === 'tool_use').input);
  assert.deepEqual(JSON.parse(partial), use.input);
  assert.equal(final.stop_reason, 'tool_use');
  const raw = await rawEvents({ ...params, seed: 1 });
  const start = raw.find((e) => e.type === 'content_block_start' && e.content_block.type === 'tool_use');
  assert.equal(start.content_block.name, 'get_weather');
  assert.deepEqual(start.content_block.input, {});
  // The call and a tool_result go back; the model answers on.
  const toolUse = got[0].content.find((b) => b.type === 'tool_use');
  const back = await client.messages.create({ ...greedy, max_tokens: 6, tools: [weather], messages: [
    ...ask, { role: 'assistant', content: got[0].content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: toolUse.id, content: '21 degrees, sunny' },
      { type: 'text', text: 'Thanks. Summarise.' }] },
  ] });
  assert.equal(back.stop_reason, 'max_tokens');
  const prompt = (u) => u.input_tokens + u.cache_read_input_tokens;
  assert.ok(prompt(back.usage) > prompt(got[0].usage), 'the call and its result are in the prompt');
  assert.ok(back.usage.cache_read_input_tokens > 0, 'the shared prefix came from the prefix cache');
  // tool_choice tool names one.
  const named = await client.messages.create({ ...params, seed: 5, tool_choice: { type: 'tool', name: 'get_weather' } });
  validate(weather.input_schema, named.content.find((b) => b.type === 'tool_use').input, 'named');
});

// A forced output that spells Qwen3's thinking: a thinking block, then text.
test('thinking: text up to </think> is a thinking block, streamed as thinking_delta', async () => {
  const params = { model: 'tiny', messages, max_tokens: 100, thinking: { type: 'disabled' },
    structured_outputs: { choice: ['<think>pondering</think>The answer.'] } };
  const m = await client.messages.create(params);
  assert.deepEqual(m.content.map((b) => b.type), ['thinking', 'text']);
  assert.equal(m.content[0].thinking, 'pondering');
  assert.equal(m.content[1].text, 'The answer.');
  assert.equal(m.stop_reason, 'end_turn');
  const raw = await rawEvents(params);
  const thinking = raw.filter((e) => e.type === 'content_block_delta' && e.delta.type === 'thinking_delta')
    .map((e) => e.delta.thinking).join('');
  assert.equal(thinking, 'pondering');
  const starts = raw.filter((e) => e.type === 'content_block_start').map((e) => [e.index, e.content_block.type]);
  assert.deepEqual(starts, [[0, 'thinking'], [1, 'text']]);
  const final = await client.messages.stream(params).finalMessage();
  assert.equal(final.content[0].thinking, 'pondering');
  assert.equal(final.content[1].text, 'The answer.');
});

test('stop_sequences end the answer with stop_reason stop_sequence', async () => {
  const whole = await client.messages.create({ ...greedy, messages, max_tokens: 20 });
  const t = text(whole);
  const stop = t.slice(6, 9);
  assert.ok(stop.trim().length > 0, `a stop string from "${t}"`);
  const m = await client.messages.create({ ...greedy, messages, max_tokens: 20, stop_sequences: [stop] });
  assert.equal(m.stop_reason, 'stop_sequence');
  assert.equal(m.stop_sequence, stop);
  assert.ok(t.startsWith(text(m)));
  assert.ok(text(m).length < t.length);
});

// What Claude Code and the SDK's helpers send beside the basics.
test('no thinking unless asked, as Anthropic\'s default; context_management edits; long MCP tool names', async () => {
  const count = async (extra) => (await client.messages.countTokens({ model: 'tiny', messages, ...extra })).input_tokens;
  // Leaving thinking out renders as thinking disabled (Qwen3's empty think block), not as enabled.
  assert.equal(await count({}), await count({ thinking: { type: 'disabled' } }));
  assert.notEqual(await count({}), await count({ thinking: { type: 'enabled', budget_tokens: 1024 } }));
  // With thinking on, Claude Code asks to clear old thinking: a no-op here.
  const m = await client.messages.create({ ...greedy, messages, max_tokens: 4,
    thinking: { type: 'enabled', budget_tokens: 1024 },
    context_management: { edits: [{ type: 'clear_thinking_20251015', keep: 'all' },
      { type: 'clear_tool_uses_20250919' }] } });
  assert.equal(m.usage.output_tokens, 4);
  await assert.rejects(client.messages.create({ ...greedy, messages, max_tokens: 4, context_management: { edits: [{ type: 'rewrite_history' }] } }),
    (e) => e instanceof Anthropic.BadRequestError && /context_management\.edits\[0\]\.type/.test(e.error.error.message));
  const mcp = { ...weather, name: 'mcp__github_enterprise_server__list_pull_request_review_comments_for_repo' };
  const named = await client.messages.create({ model: 'tiny', messages, tools: [mcp],
    tool_choice: { type: 'tool', name: mcp.name }, temperature: 1, seed: 2, max_tokens: 300 });
  assert.equal(named.content.find((b) => b.type === 'tool_use').name, mcp.name);
});

test('output_config.format holds the answer to its schema (messages.parse); a bad schema names the field', async () => {
  const schema = { type: 'object', properties: { answer: { type: 'integer', minimum: 0, maximum: 99 },
    unit: { enum: ['m', 'km'] } }, required: ['answer', 'unit'], additionalProperties: false };
  for (const seed of [1, 2]) {
    const r = await client.messages.parse({ model: 'tiny', messages, max_tokens: 300, temperature: 1, seed,
      output_config: { format: { type: 'json_schema', schema }, effort: 'low' } });
    validate(schema, r.parsed_output, `seed ${seed}`);
  }
  const beta = await client.messages.create({ model: 'tiny', messages, max_tokens: 300, temperature: 1, seed: 3,
    output_format: { type: 'json_schema', schema } });
  validate(schema, JSON.parse(text(beta)), 'output_format');
  await assert.rejects(client.messages.create({ model: 'tiny', messages, max_tokens: 4,
    output_config: { format: { type: 'json_schema', schema } }, output_format: { type: 'json_schema', schema } }),
  (e) => e instanceof Anthropic.BadRequestError && /give one of them/.test(e.error.error.message));
  // A forced call beside a format names the format as the request did.
  await assert.rejects(client.messages.create({ model: 'tiny', messages, max_tokens: 4, tools: [weather],
    tool_choice: { type: 'any' }, output_config: { format: { type: 'json_schema', schema } } }),
  (e) => e instanceof Anthropic.BadRequestError && /'output_config\.format\.schema'/.test(e.error.error.message) &&
    !/response_format/.test(e.error.error.message));
  for (const [field, body] of [['output_config.format.schema', { output_config: { format: { type: 'json_schema', schema: { $ref: '#' } } } }],
    ['output_format.schema', { output_format: { type: 'json_schema', schema: { $ref: '#' } } }]])
    await assert.rejects(client.messages.create({ model: 'tiny', messages, max_tokens: 4, ...body }),
      (e) => e instanceof Anthropic.BadRequestError && e.error.error.message.includes(`'${field}'`), field);
});

// Claude Code asks for 32k-64k tokens on top of a long prompt: as the API
// does, the answer runs to the end of the context and says so; only a prompt
// that alone is too long is refused, in Anthropic's words.
test('max_tokens past the context runs to its end (model_context_window_exceeded); too long a prompt is refused', async () => {
  const ask = (k) => [{ role: 'user', content: 'x' + ' a'.repeat(k) }];
  const base = (await client.messages.countTokens({ model: 'tiny', messages: ask(0) })).input_tokens;
  const k = 2048 - 6 - base;
  assert.equal((await client.messages.countTokens({ model: 'tiny', messages: ask(k) })).input_tokens, 2042);
  const m = await client.messages.create({ ...greedy, messages: ask(k), max_tokens: 16000 }); // the SDK streams above ~21k
  assert.equal(m.stop_reason, 'model_context_window_exceeded');
  assert.equal(m.usage.output_tokens, 6);
  const s = await client.messages.stream({ ...greedy, messages: ask(k), max_tokens: 64000 }).finalMessage();
  assert.equal(s.stop_reason, 'model_context_window_exceeded');
  // A max_tokens that fits ends as max_tokens.
  assert.equal((await client.messages.create({ ...greedy, messages: ask(k), max_tokens: 5 })).stop_reason, 'max_tokens');
  await assert.rejects(client.messages.create({ ...greedy, messages: ask(k + 6), max_tokens: 100 }),
    (e) => e instanceof Anthropic.BadRequestError && /^prompt is too long: 2048 tokens > 2047 maximum$/.test(e.error.error.message),
    'the prompt alone fills the context');
  // Far past the context too, N is the prompt's own count (clients cut by
  // N - M), as count_tokens counts it.
  const far = (await client.messages.countTokens({ model: 'tiny', messages: ask(3000) })).input_tokens;
  assert.equal(far, base + 3000);
  await assert.rejects(client.messages.create({ ...greedy, messages: ask(3000), max_tokens: 100 }),
    (e) => e instanceof Anthropic.BadRequestError &&
      e.error.error.message === `prompt is too long: ${far} tokens > 2047 maximum`);
  // A max_tokens refused for itself is not called a long prompt.
  await assert.rejects(client.messages.create({ ...greedy, messages, max_tokens: 3000000000, stream: true }),
    (e) => e instanceof Anthropic.BadRequestError && /max_tokens/.test(e.error.error.message) &&
      !/prompt is too long/.test(e.error.error.message));
});

// A final assistant message is a prefill: the answer continues it and
// holds only what follows.
test('a final assistant message is continued (prefill)', async () => {
  const prefill = [{ role: 'user', content: 'What is six times seven?' }, { role: 'assistant', content: 'The answer is (' }];
  const m = await client.messages.create({ model: 'tiny', messages: prefill, max_tokens: 20,
    structured_outputs: { choice: ['42).'] } });
  assert.deepEqual(m.content, [{ type: 'text', text: '42).' }]);
  assert.equal(m.stop_reason, 'end_turn');
  const counted = (await client.messages.countTokens({ model: 'tiny', messages: prefill })).input_tokens;
  assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, counted);
  const closed = (await client.messages.countTokens({ model: 'tiny',
    messages: [...prefill, { role: 'user', content: 'Go on.' }] })).input_tokens;
  assert.ok(closed > counted);
  // The continuation keeps its leading space ("The answer is" + " 42."), streamed too.
  const glue = [prefill[0], { role: 'assistant', content: 'The answer is' }];
  const sp = { model: 'tiny', messages: glue, max_tokens: 20, structured_outputs: { regex: ' 42\\.' } };
  assert.equal(text(await client.messages.create(sp)), ' 42.');
  assert.equal(text(await client.messages.stream(sp).finalMessage()), ' 42.');
});

// The SDK's toolRunner threads by default; a refused thread comes back in the
// shape it reads, so it can fall back to sending the whole history.
test('thread is refused with the details the SDK reads (thread_unsupported_request)', async () => {
  const r = await fetch(`${baseURL}/v1/messages?beta=true`, { method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': KEY, 'anthropic-version': '2023-06-01' },
    body: JSON.stringify({ model: 'tiny', max_tokens: 3, messages, thread: { type: 'create' } }) });
  assert.equal(r.status, 400);
  const body = await r.json();
  assert.equal(body.type, 'error');
  assert.deepEqual(body.error.details, { error_code: 'thread_unsupported_request', unsupported: ['thread'] });
});

test('models.list and models.retrieve give Anthropic\'s model info; the Message carries its null fields', async () => {
  const page = await client.models.list();
  assert.equal(page.data.length, 1);
  const info = page.data[0];
  assert.equal(info.type, 'model');
  assert.equal(info.id, 'tiny');
  assert.equal(info.display_name, 'tiny');
  assert.ok(Math.abs(Date.parse(info.created_at) - Date.now()) < 3600e3, info.created_at);
  assert.equal(page.has_more, false);
  assert.deepEqual(await client.models.retrieve('tiny'), info);
  const m = await client.messages.create({ ...greedy, messages, max_tokens: 2 });
  for (const k of ['stop_details', 'container']) assert.equal(m[k], null, k);
  const final = await client.messages.stream({ ...greedy, messages, max_tokens: 2 }).finalMessage();
  assert.equal(final.stop_details, null);
});

test('errors come in Anthropic\'s shape with the SDK\'s classes', async () => {
  await assert.rejects(client.messages.create({ model: 'tiny', messages }), // no max_tokens
    (e) => e instanceof Anthropic.BadRequestError && e.error.type === 'error' &&
      e.error.error.type === 'invalid_request_error' && /max_tokens/.test(e.error.error.message));
  await assert.rejects(client.messages.create({ model: 'claude-nope', messages, max_tokens: 4 }),
    (e) => e instanceof Anthropic.NotFoundError && e.error.error.type === 'not_found_error');
  await assert.rejects(client.messages.create({ model: 'tiny', max_tokens: 4,
    messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }] }),
  (e) => e instanceof Anthropic.BadRequestError && /image/.test(e.error.error.message));
  await assert.rejects(client.messages.create({ model: 'tiny', max_tokens: 4, messages,
    tools: [{ type: 'bash_20250124', name: 'bash' }] }),
  (e) => e instanceof Anthropic.BadRequestError && /tools\[0\]\.type/.test(e.error.error.message));
  const wrong = new Anthropic({ baseURL, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(wrong.messages.create({ model: 'tiny', messages, max_tokens: 4 }),
    (e) => e instanceof Anthropic.AuthenticationError && e.error.error.type === 'authentication_error');
  // Authorization: Bearer works too (the SDK's authToken).
  const bearer = new Anthropic({ baseURL, authToken: KEY, apiKey: null, maxRetries: 0 });
  const m = await bearer.messages.create({ ...greedy, messages, max_tokens: 2 });
  assert.equal(m.usage.output_tokens, 2);
});

await runTests(tests, server);

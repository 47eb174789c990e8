// Drives POST /v1/responses on `moeserve serve` (tiny model: random weights,
// the real Qwen3 tokenizer and template) with the official OpenAI SDK's
// responses.create (streamed and not) and responses.stream() helper: the
// Response object's shape, ids and usage; the typed events in their order
// with increasing sequence numbers, adding up to the whole answer; a
// function tool round trip (tool_choice required gives a call whose
// arguments validate against the schema — the grammar guarantees it — and
// its output goes back as a function_call_output item); text.format
// json_schema; reasoning items; and the 400s for what is not served
// (store true, previous_response_id, hosted tools).
import assert from 'node:assert/strict';
import Ajv from 'ajv';
import OpenAI from 'openai';
import { runTests, startServer, streamInPieces } from './serve.mjs';

const server = await startServer(['--reasoning-parser', 'qwen3']);
const client = new OpenAI({ baseURL: `http://127.0.0.1:${server.port}/v1`, apiKey: 'unused', maxRetries: 0 });
const ajv = new Ajv({ strict: false, allErrors: true });
const greedy = { model: 'tiny', temperature: 0, ignore_eos: true };

const weather = {
  type: 'function', name: 'get_weather', description: 'The weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 20 },
    unit: { enum: ['c', 'f'] } }, required: ['city', 'unit'], additionalProperties: false },
};

function validate(schema, value, what) {
  const v = ajv.compile(schema);
  if (!v(value)) throw new Error(`${what}: ${JSON.stringify(value)} fails: ${ajv.errorsText(v.errors)}`);
}

// Every event of a streamed create, checked for order and numbering.
async function events(params) {
  const stream = await client.responses.create({ ...params, stream: true });
  const all = [];
  for await (const ev of stream) all.push(ev);
  all.forEach((ev, i) => assert.equal(ev.sequence_number, i, `event ${i} (${ev.type}) is numbered in order`));
  assert.equal(all[0].type, 'response.created');
  assert.equal(all[1].type, 'response.in_progress');
  assert.equal(all[0].response.status, 'in_progress');
  assert.deepEqual(all[0].response.output, []);
  assert.ok(['response.completed', 'response.incomplete'].includes(all.at(-1).type));
  return all;
}

function messageText(r) {
  return r.output.filter((o) => o.type === 'message').flatMap((o) => o.content).map((c) => c.text).join('');
}

const tests = [];
const test = (name, fn) => tests.push({ name, fn });

test('responses.create: the Response object, its id, output and usage', async () => {
  const r = await client.responses.create({ ...greedy, input: 'Tell me about the sea.', max_output_tokens: 8 });
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_[0-9a-f]{24}$/);
  assert.equal(r.model, 'tiny');
  assert.equal(r.status, 'incomplete');
  assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  assert.equal(r.store, false);
  assert.equal(r.max_output_tokens, 8);
  assert.equal(r.output.length, 1);
  const m = r.output[0];
  assert.equal(m.type, 'message');
  assert.match(m.id, /^msg_/);
  assert.equal(m.role, 'assistant');
  assert.equal(m.content[0].type, 'output_text');
  assert.equal(r.output_text, m.content[0].text, 'the SDK\'s output_text is the message');
  assert.equal(r.usage.output_tokens, 8);
  assert.ok(r.usage.input_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + 8);
  assert.equal(r.usage.output_tokens_details.reasoning_tokens, 0);
});

test('instructions and message items reach the prompt', async () => {
  const bare = await client.responses.create({ ...greedy, input: 'Hi', max_output_tokens: 1 });
  const instr = await client.responses.create({ ...greedy, input: 'Hi', instructions: 'Be brief and kind.', max_output_tokens: 1 });
  assert.ok(instr.usage.input_tokens > bare.usage.input_tokens);
  assert.equal(instr.instructions, 'Be brief and kind.');
  const items = await client.responses.create({ ...greedy, max_output_tokens: 1, input: [
    { role: 'developer', content: 'Be brief.' },
    { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Hi' }] },
    { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'Hello!' }] },
    { role: 'user', content: 'And again?' },
  ] });
  assert.ok(items.usage.input_tokens > instr.usage.input_tokens);
});

test('stream: created, in_progress, the item and part events, deltas adding up to the whole answer', async () => {
  const params = { ...greedy, input: 'Tell me about the sea.', max_output_tokens: 48 };
  const whole = await client.responses.create(params);
  const isDelta = (e) => e.type === 'response.output_text.delta';
  const all = await streamInPieces(() => events(params), (evs) => evs.filter(isDelta).length);
  const types = all.map((e) => e.type);
  const deltas = all.filter(isDelta);
  assert.ok(deltas.length > 1, 'the text comes in several deltas');
  const first = types.indexOf('response.output_text.delta');
  assert.deepEqual(types.slice(2, first), ['response.output_item.added', 'response.content_part.added']);
  assert.deepEqual(types.slice(-4), ['response.output_text.done', 'response.content_part.done',
    'response.output_item.done', 'response.incomplete']);
  const added = all.find((e) => e.type === 'response.output_item.added');
  assert.equal(added.item.status, 'in_progress');
  assert.deepEqual(added.item.content, []);
  const text = deltas.map((d) => d.delta).join('');
  assert.ok(deltas.every((d) => d.item_id === added.item.id && d.output_index === 0 && d.content_index === 0));
  assert.equal(text, messageText(whole), 'the stream carries the same answer (greedy)');
  const done = all.find((e) => e.type === 'response.output_text.done');
  assert.equal(done.text, text);
  const last = all.at(-1);
  assert.equal(last.response.id, all[0].response.id);
  assert.equal(messageText(last.response), text);
  assert.equal(last.response.usage.output_tokens, 48);
});

test('responses.stream() helper accumulates the events into the final Response', async () => {
  const params = { ...greedy, input: 'Tell me about the sea.', max_output_tokens: 10 };
  const whole = await client.responses.create(params);
  const stream = client.responses.stream(params);
  let deltas = '';
  stream.on('response.output_text.delta', (e) => { deltas += e.delta; });
  const final = await stream.finalResponse();
  assert.equal(final.output_text, whole.output_text);
  assert.equal(deltas, whole.output_text);
});

test('function tool round trip: a valid call (tool_choice required), then its output as an item', async () => {
  const input = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const params = { model: 'tiny', input, tools: [weather], tool_choice: 'required', temperature: 1,
    max_output_tokens: 300, reasoning: { effort: 'none' } };
  const seen = [];
  for (const seed of [1, 2, 3]) {
    const r = await client.responses.create({ ...params, seed });
    assert.equal(r.status, 'completed', JSON.stringify(r.output));
    const calls = r.output.filter((o) => o.type === 'function_call');
    assert.equal(calls.length, 1, JSON.stringify(r.output));
    const call = calls[0];
    assert.match(call.id, /^fc_/);
    assert.match(call.call_id, /^call_[0-9a-f]{24}$/);
    assert.equal(call.name, 'get_weather');
    assert.equal(call.status, 'completed');
    validate(weather.parameters, JSON.parse(call.arguments), `seed ${seed}`);
    seen.push(r);
  }
  // Streamed: the arguments arrive as deltas and add up to the item's.
  const all = await events({ ...params, seed: 1 });
  const added = all.find((e) => e.type === 'response.output_item.added' && e.item.type === 'function_call');
  assert.equal(added.item.name, 'get_weather');
  const args = all.filter((e) => e.type === 'response.function_call_arguments.delta').map((e) => e.delta).join('');
  const argsDone = all.find((e) => e.type === 'response.function_call_arguments.done');
  assert.equal(argsDone.arguments, args);
  assert.equal(args, seen[0].output.find((o) => o.type === 'function_call').arguments, 'seed 1 streamed = whole');
  assert.equal(all.at(-1).type, 'response.completed');
  // The call and its output go back; the model answers on.
  const call = seen[0].output.find((o) => o.type === 'function_call');
  const back = await client.responses.create({ ...greedy, max_output_tokens: 6, tools: [weather],
    input: [...input, call, { type: 'function_call_output', call_id: call.call_id, output: '{"temp": 21, "unit": "c"}' }] });
  assert.ok(['completed', 'incomplete'].includes(back.status));
  assert.ok(back.usage.input_tokens > seen[0].usage.input_tokens, 'the call and its output are in the prompt');
  assert.ok(back.output.length >= 1);
});

test('text.format json_schema: the output validates', async () => {
  const schema = { type: 'object', properties: { name: { type: 'string', maxLength: 12 },
    age: { type: 'integer', minimum: 0, maximum: 99 } }, required: ['name', 'age'], additionalProperties: false };
  for (const seed of [4, 5]) {
    const r = await client.responses.create({ model: 'tiny', input: 'A person, please.', temperature: 1, seed,
      max_output_tokens: 300, reasoning: { effort: 'none' },
      text: { format: { type: 'json_schema', name: 'person', schema, strict: true } } });
    assert.equal(r.status, 'completed');
    validate(schema, JSON.parse(r.output_text), `seed ${seed}`);
    assert.equal(r.text.format.type, 'json_schema');
  }
});

// A forced output that spells Qwen3's thinking: a reasoning item, then the message.
test('reasoning: text up to </think> is a reasoning item with reasoning_text, streamed as reasoning_text deltas', async () => {
  const params = { model: 'tiny', input: 'Think first.', reasoning: { effort: 'none' }, max_output_tokens: 100,
    structured_outputs: { choice: ['<think>pondering</think>The answer.'] } };
  const r = await client.responses.create(params);
  assert.deepEqual(r.output.map((o) => o.type), ['reasoning', 'message']);
  assert.match(r.output[0].id, /^rs_/);
  assert.equal(r.output[0].content[0].type, 'reasoning_text');
  assert.equal(r.output[0].content[0].text, 'pondering');
  assert.equal(r.output_text, 'The answer.');
  assert.ok(r.usage.output_tokens_details.reasoning_tokens > 0);
  assert.ok(r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens);
  const all = await events(params);
  const reasoning = all.filter((e) => e.type === 'response.reasoning_text.delta').map((e) => e.delta).join('');
  assert.equal(reasoning, 'pondering');
  const items = all.filter((e) => e.type === 'response.output_item.done').map((e) => [e.output_index, e.item.type]);
  assert.deepEqual(items, [[0, 'reasoning'], [1, 'message']]);
  const final = await client.responses.stream(params).finalResponse();
  assert.equal(final.output[0].content[0].text, 'pondering');
  assert.equal(final.output_text, 'The answer.');
});

test('what is not served is a 400 naming the parameter', async () => {
  const cases = [
    [{ store: true }, 'store'],
    [{ previous_response_id: 'resp_abc' }, 'previous_response_id'],
    [{ max_output_tokens: 0 }, 'max_output_tokens'],
    [{ tools: [{ type: 'web_search' }] }, 'tools[0].type'],
    [{ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'x' }] }] }, 'input[0].content[0].type'],
    [{ input: [{ type: 'item_reference', id: 'x' }] }, 'input[0].type'],
    [{ tools: [weather], tool_choice: { type: 'function', name: 'nope' } }, 'tool_choice.name'],
    [{ text: { format: { type: 'json_schema', name: 'x', schema: 'nope' } } }, 'text.format.schema'],
    // a schema that parses but cannot be enforced (refused when it compiles)
    [{ text: { format: { type: 'json_schema', name: 'x', schema: { $ref: '#' } } } }, 'text.format.schema'],
  ];
  for (const [extra, param] of cases) {
    await assert.rejects(client.responses.create({ model: 'tiny', input: 'Hi', max_output_tokens: 4, ...extra }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === param && e.message.length > 0,
      `${param}: ${JSON.stringify(extra)}`);
  }
  await assert.rejects(client.responses.create({ model: 'nope', input: 'Hi' }),
    (e) => e instanceof OpenAI.NotFoundError);
  // store false is the stateless default, served.
  const r = await client.responses.create({ ...greedy, input: 'Hi', max_output_tokens: 2, store: false });
  assert.equal(r.store, false);
});

await runTests(tests, server);

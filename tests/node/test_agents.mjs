// Drives `moeserve serve` on the tiny model (random weights, the real Qwen3
// tokenizer and template) as agent frameworks do, and checks every answer
// with an independent validator (Ajv): structured output (response_format
// json_schema, json_object, vLLM's structured_outputs) and forced tool calls
// (tool_choice named and required) over nested objects, arrays, enums,
// anyOf and $ref, streamed and not, always parse and validate — the output
// is gibberish, but constrained output is always valid; the stream equals
// the whole answer; the reasoning split; the SDK's chat.completions.parse();
// LangChain's bindTools and withStructuredOutput; hostile schemas refused.
import assert from 'node:assert/strict';
import Ajv from 'ajv';
import OpenAI from 'openai';
import { ChatOpenAI } from '@langchain/openai';
import { runTests, startServer } from './serve.mjs';

// vLLM's agent flags, and a server-wide default that turns thinking off.
const server = await startServer(['--enable-auto-tool-choice', '--tool-call-parser', 'hermes',
  '--reasoning-parser', 'qwen3', '--default-chat-template-kwargs', '{"enable_thinking": false}']);
const baseURL = `http://127.0.0.1:${server.port}/v1`;
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0 });
const ajv = new Ajv({ strict: false, allErrors: true, validateFormats: false });
const messages = [{ role: 'user', content: 'Answer as the schema asks.' }];
// Thinking off: with random weights </think> may never come, and the grammar
// governs only the answer after it.
const base = { model: 'tiny', messages, max_tokens: 1200, temperature: 1, reasoning_effort: 'none' };

const schemas = {
  nested: {
    type: 'object',
    properties: {
      user: { type: 'object', properties: { name: { type: 'string', maxLength: 20 },
        age: { type: 'integer', minimum: 0, maximum: 120 } }, required: ['name', 'age'] },
      tags: { type: 'array', items: { type: 'string', maxLength: 10 }, minItems: 1, maxItems: 3 },
    },
    required: ['user', 'tags'],
  },
  enum_anyof: {
    type: 'object',
    properties: {
      unit: { enum: ['celsius', 'fahrenheit'] },
      value: { anyOf: [{ type: 'number', minimum: -100, maximum: 100 }, { type: 'null' }] },
    },
    required: ['unit', 'value'],
  },
  refs: {
    $defs: { point: { type: 'object', properties: { x: { type: 'integer' }, y: { type: 'integer' } },
      required: ['x', 'y'] } },
    type: 'object',
    properties: { a: { $ref: '#/$defs/point' }, b: { $ref: '#/$defs/point' } },
    required: ['a', 'b'],
  },
  // A pointer into the schema itself (not $defs): for a forced tool call it
  // must keep pointing into the parameters, not the call's wrapper.
  property_ref: {
    type: 'object',
    properties: { name: { enum: ['north', 'south'] }, alias: { $ref: '#/properties/name' } },
    required: ['name', 'alias'],
  },
  // A root $id (as some schema generators write): a forced call re-roots the
  // parameters, whose $refs must still resolve.
  with_id: {
    $id: 'https://example.com/schemas/with-id',
    $defs: { unit: { enum: ['c', 'f'] } },
    type: 'object',
    properties: { unit: { $ref: '#/$defs/unit' } },
    required: ['unit'],
  },
  optional_const: {
    type: 'object',
    properties: { kind: { const: 'event' }, day: { type: 'string', format: 'date' },
      note: { type: 'string', maxLength: 15 }, done: { type: 'boolean' } },
    required: ['kind', 'day'],
  },
};
const arraySchema = { type: 'array', items: { type: 'object', properties: { ok: { type: 'boolean' },
  n: { type: 'integer', minimum: 0, maximum: 9 } }, required: ['ok', 'n'] }, maxItems: 3 };

function validate(schema, value, what) {
  const v = ajv.compile(schema);
  if (!v(value)) throw new Error(`${what}: ${JSON.stringify(value)} fails: ${ajv.errorsText(v.errors)}`);
}

// The stream's pieces put back together: content, reasoning, tool calls by index.
async function collect(params) {
  const stream = await client.chat.completions.create({ ...params, stream: true });
  const out = { content: '', reasoning: '', calls: [], finish: null };
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    if (c.delta.content) out.content += c.delta.content;
    if (c.delta.reasoning_content) out.reasoning += c.delta.reasoning_content;
    for (const tc of c.delta.tool_calls ?? []) {
      if (!out.calls[tc.index]) {
        assert.ok(tc.id?.startsWith('call_'), 'a call\'s first delta carries its id');
        assert.equal(tc.type, 'function');
        out.calls[tc.index] = { id: tc.id, name: tc.function.name, arguments: '' };
      }
      out.calls[tc.index].arguments += tc.function?.arguments ?? '';
    }
    if (c.finish_reason) out.finish = c.finish_reason;
  }
  return out;
}

const tests = [];
const test = (name, fn) => tests.push({ name, fn });

for (const [name, schema] of Object.entries({ ...schemas, array: arraySchema })) {
  test(`response_format json_schema ${name}: every answer validates, streamed = whole`, async () => {
    for (const seed of [1, 2, 3]) {
      const params = { ...base, seed, response_format: { type: 'json_schema',
        json_schema: { name, schema, strict: true } } };
      const r = await client.chat.completions.create(params);
      const m = r.choices[0].message;
      assert.equal(r.choices[0].finish_reason, 'stop', `seed ${seed}: ${m.content}`);
      validate(schema, JSON.parse(m.content), `seed ${seed}`);
      const s = await collect(params);
      assert.equal(s.content, m.content, 'the stream carries the same answer');
      assert.equal(s.finish, 'stop');
    }
  });
}

for (const [name, schema] of Object.entries(schemas)) {
  test(`tool_choice named, parameters ${name}: the call validates, streamed = whole`, async () => {
    const tools = [{ type: 'function', function: { name: `fn_${name}`, parameters: schema } }];
    for (const seed of [4, 5]) {
      const params = { ...base, seed, tools,
        tool_choice: { type: 'function', function: { name: `fn_${name}` } } };
      const r = await client.chat.completions.create(params);
      const c = r.choices[0];
      assert.equal(c.finish_reason, 'tool_calls');
      assert.equal(c.message.content, null);
      assert.equal(c.message.tool_calls.length, 1);
      const call = c.message.tool_calls[0];
      assert.match(call.id, /^call_/);
      assert.equal(call.function.name, `fn_${name}`);
      validate(schema, JSON.parse(call.function.arguments), `seed ${seed}`);
      const s = await collect(params);
      assert.equal(s.finish, 'tool_calls');
      assert.equal(s.calls.length, 1);
      assert.equal(s.calls[0].name, call.function.name);
      assert.equal(s.calls[0].arguments, call.function.arguments);
      assert.equal(s.content, '', 'no raw <tool_call> text in content');
    }
  });
}

test('tool_choice required over several tools: one valid call of one of them', async () => {
  const names = Object.keys(schemas);
  const tools = names.map((n) => ({ type: 'function', function: { name: n, parameters: schemas[n] } }));
  const seen = new Set();
  for (const seed of [6, 7, 8, 9, 10, 11]) {
    const r = await client.chat.completions.create({ ...base, seed, tools, tool_choice: 'required' });
    const call = r.choices[0].message.tool_calls?.[0];
    assert.ok(call, JSON.stringify(r.choices[0].message));
    assert.ok(names.includes(call.function.name));
    validate(schemas[call.function.name], JSON.parse(call.function.arguments), `seed ${seed}`);
    seen.add(call.function.name);
  }
  assert.ok(seen.size >= 2, `the draws reached more than one tool (${[...seen]})`);
});

// A call's arguments are a JSON object (the parser keeps no other), so a
// forced call of a tool whose parameters say nothing of their type ({}, as
// clients send for a tool without arguments) or allow others is still one;
// parameters that allow no object are refused, naming the field.
test('tool_choice required with parameters {} or a type list: a call with object arguments; no object: 400', async () => {
  const open = [{ type: 'function', function: { name: 'ping', parameters: {} } }];
  const list = [{ type: 'function', function: { name: 'opt', parameters: { type: ['object', 'null'],
    properties: { n: { type: 'integer' } } } } }];
  for (const [tools, seeds] of [[open, [1, 2, 3, 4, 5]], [list, [1, 2, 3]]]) {
    for (const seed of seeds) {
      const r = await client.chat.completions.create({ ...base, seed, tools, tool_choice: 'required' });
      const c = r.choices[0];
      assert.equal(c.finish_reason, 'tool_calls', `${tools[0].function.name}, seed ${seed}: ${JSON.stringify(c.message)}`);
      const args = JSON.parse(c.message.tool_calls[0].function.arguments);
      assert.ok(args !== null && typeof args === 'object' && !Array.isArray(args), JSON.stringify(args));
      validate(tools[0].function.parameters, args, `${tools[0].function.name}, seed ${seed}`);
    }
  }
  const str = [{ type: 'function', function: { name: 'say', parameters: { type: 'string' } } }];
  await assert.rejects(client.chat.completions.create({ ...base, tools: str, tool_choice: 'required' }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'tools' && /'say'.*"type": "object"/.test(e.message));
});

test('json_object, structured_outputs regex / choice / grammar', async () => {
  let r = await client.chat.completions.create({ ...base, seed: 1, response_format: { type: 'json_object' } });
  const o = JSON.parse(r.choices[0].message.content);
  assert.equal(typeof o, 'object');
  assert.ok(o !== null && !Array.isArray(o));
  r = await client.chat.completions.create({ ...base, seed: 2, structured_outputs: { regex: '[A-Z][a-z]{2,5} [0-9]{3}' } });
  assert.match(r.choices[0].message.content, /^[A-Z][a-z]{2,5} [0-9]{3}$/);
  r = await client.chat.completions.create({ ...base, seed: 3, structured_outputs: { choice: ['red', 'green', 'blue'] } });
  assert.ok(['red', 'green', 'blue'].includes(r.choices[0].message.content));
  r = await client.completions.create({ model: 'tiny', prompt: 'Colour:', max_tokens: 50, seed: 3,
    structured_outputs: { grammar: 'root ::= ("yes" | "no") " " [0-9]' } });
  assert.match(r.choices[0].text, /^(yes|no) [0-9]$/);
});

// A forced output that spells Qwen3's thinking: the parser splits it.
test('reasoning: text up to </think> is reasoning_content and reasoning; include_reasoning false drops it', async () => {
  const params = { ...base, structured_outputs: { choice: ['<think>pondering</think>The answer.'] } };
  let r = await client.chat.completions.create(params);
  let m = r.choices[0].message;
  assert.equal(m.content, 'The answer.');
  assert.equal(m.reasoning_content, 'pondering');
  assert.equal(m.reasoning, 'pondering');
  const s = await collect(params);
  assert.equal(s.content, 'The answer.');
  assert.equal(s.reasoning, 'pondering');
  r = await client.chat.completions.create({ ...params, include_reasoning: false });
  m = r.choices[0].message;
  assert.equal(m.content, 'The answer.');
  assert.equal(m.reasoning_content, undefined);
});

// A forced output that spells two Hermes calls, with tool_choice auto:
// parallel_tool_calls false keeps the first (vLLM's rule), streamed and not.
test('parallel_tool_calls false keeps only the first of the calls the model writes', async () => {
  const two = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n' +
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>';
  const tools = [{ type: 'function', function: { name: 'get_weather',
    parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
  const params = { ...base, tools, tool_choice: 'auto', structured_outputs: { choice: [two] } };
  for (const parallel of [undefined, true, false]) {
    const p = parallel === undefined ? params : { ...params, parallel_tool_calls: parallel };
    const want = parallel === false ? ['Paris'] : ['Paris', 'Rome'];
    const r = await client.chat.completions.create(p);
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls');
    assert.equal(c.message.content, null);
    assert.deepEqual(c.message.tool_calls.map((t) => JSON.parse(t.function.arguments).city), want,
      `parallel_tool_calls ${parallel}`);
    const s = await collect(p);
    assert.deepEqual(s.calls.map((t) => JSON.parse(t.arguments).city), want, `streamed, ${parallel}`);
    assert.equal(s.content, '');
  }
});

test('the SDK\'s chat.completions.parse() gets a parsed object', async () => {
  const schema = { ...schemas.nested, additionalProperties: false };
  schema.properties.user = { ...schema.properties.user, additionalProperties: false };
  const r = await client.chat.completions.parse({ ...base, seed: 7, response_format: { type: 'json_schema',
    json_schema: { name: 'person', schema, strict: true } } });
  const parsed = r.choices[0].message.parsed;
  assert.ok(parsed && typeof parsed === 'object');
  validate(schema, parsed, 'parse()');
});

test('LangChain: bindTools and withStructuredOutput', async () => {
  const llm = new ChatOpenAI({ model: 'tiny', apiKey: 'unused', configuration: { baseURL },
    temperature: 1, maxRetries: 0, maxTokens: 1200, modelKwargs: { reasoning_effort: 'none', seed: 3 } });
  const weather = { type: 'function', function: { name: 'get_weather', description: 'Weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 16 },
      unit: { enum: ['c', 'f'] } }, required: ['city', 'unit'] } } };
  const msg = await llm.bindTools([weather], { tool_choice: 'get_weather' }).invoke('Weather in Paris?');
  assert.equal(msg.tool_calls.length, 1);
  assert.equal(msg.tool_calls[0].name, 'get_weather');
  validate(weather.function.parameters, msg.tool_calls[0].args, 'bindTools');
  const structured = llm.withStructuredOutput(schemas.enum_anyof, { name: 'reading' });
  validate(schemas.enum_anyof, await structured.invoke('A temperature reading, please.'), 'withStructuredOutput');
});

// Without reasoning_effort the server's default kwargs decide: thinking off,
// so the grammar governs from the first token (with thinking on it would
// wait for a </think> that random weights seldom write).
test('--default-chat-template-kwargs turns thinking off for every request', async () => {
  const { reasoning_effort, ...noEffort } = base;
  assert.equal(reasoning_effort, 'none');
  for (const seed of [21, 22]) {
    const r = await client.chat.completions.create({ ...noEffort, seed, response_format: { type: 'json_schema',
      json_schema: { name: 'x', schema: schemas.enum_anyof } } });
    validate(schemas.enum_anyof, JSON.parse(r.choices[0].message.content), `seed ${seed}`);
  }
});

// A request's own chat_template_kwargs.enable_thinking wins over its
// reasoning_effort, as vLLM's build_chat_params has it: the prompt is the
// thinking one (Qwen3 adds an empty think block to a prompt without it).
test('chat_template_kwargs.enable_thinking wins over reasoning_effort', async () => {
  const promptTokens = async (extra) => (await client.chat.completions.create({ model: 'tiny', messages,
    max_tokens: 1, ...extra })).usage.prompt_tokens;
  const on = await promptTokens({ chat_template_kwargs: { enable_thinking: true } });
  const off = await promptTokens({ chat_template_kwargs: { enable_thinking: false } });
  assert.ok(off > on);
  assert.equal(await promptTokens({ reasoning_effort: 'none', chat_template_kwargs: { enable_thinking: true } }), on);
  assert.equal(await promptTokens({ reasoning_effort: 'high', chat_template_kwargs: { enable_thinking: false } }), off);
  assert.equal(await promptTokens({ reasoning_effort: 'high' }), on);
});

test('hostile schemas and grammars are refused with a 400 naming the field, or bounded', async () => {
  // A huge enum is within the engine's limits: it compiles (in well under a
  // second here) and the answer is one of its values.
  const values = Array.from({ length: 20000 }, (_, i) => `v${i}`);
  const r = await client.chat.completions.create({ ...base, seed: 1, response_format: { type: 'json_schema',
    json_schema: { name: 'x', schema: { enum: values } } } });
  assert.ok(values.includes(JSON.parse(r.choices[0].message.content)));
  let deep = { type: 'string' };
  for (let i = 0; i < 200; i++) deep = { type: 'object', properties: { a: deep }, required: ['a'] };
  const cases = [
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: deep } } }, 'response_format.json_schema.schema'],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { $ref: '#' } } } }, 'response_format.json_schema.schema'],
    [{ structured_outputs: { regex: '(a{1,1000}){1,1000}' } }, 'structured_outputs.regex'],
    [{ structured_outputs: { grammar: 'root ::= root' } }, 'structured_outputs.grammar'],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', patternProperties: { '^a': {} } } } } }, 'response_format.json_schema.schema'],
  ];
  for (const [extra, param] of cases) {
    await assert.rejects(client.chat.completions.create({ ...base, ...extra }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === param && e.message.length > 0,
      `${param}: ${JSON.stringify(extra).slice(0, 80)}`);
  }
});

await runTests(tests, server);

// Drives `moeserve serve` on the tiny model with the official OpenAI SDK
// (npm `openai`) as a real client: chat and completions, streaming and not,
// n > 1, logprobs, stop strings, include_usage, /v1/models, and the error
// classes the SDK must raise (BadRequestError, AuthenticationError,
// NotFoundError). Exits non-zero on the first failure.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { runTests, startServer } from './serve.mjs';

const KEY = 'sdk-test-key';
const server = await startServer(['--api-key', KEY]);
const { port } = server;

const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: KEY, maxRetries: 0 });
const greedy = { temperature: 0, ignore_eos: true };
const messages = [{ role: 'user', content: 'Tell me about the sea.' }];

const tests = [];
const test = (name, fn) => tests.push({ name, fn });

test('chat completion, not streamed', async () => {
  const r = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 10, ...greedy });
  assert.equal(r.object, 'chat.completion');
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.model, 'tiny');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 10);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 10);
});

test('chat stream concatenates to the whole answer, with include_usage', async () => {
  const whole = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 16, ...greedy });
  const stream = await client.chat.completions.create({
    model: 'tiny', messages, max_tokens: 16, ...greedy, stream: true,
    stream_options: { include_usage: true },
  });
  let text = '';
  let first = true;
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) {
      assert.equal(chunk.choices.length, 0);
      usage = chunk.usage;
      continue;
    }
    const c = chunk.choices[0];
    if (first) {
      assert.equal(c.delta.role, 'assistant');
      first = false;
    }
    text += c.delta.content ?? '';
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 16);
  assert.equal(usage.prompt_tokens, whole.usage.prompt_tokens);
});

test('n > 1 gives indexed choices, streamed or not', async () => {
  const r = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 4, n: 3, temperature: 1, seed: 3, ignore_eos: true });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  assert.equal(r.usage.completion_tokens, 12);
  const stream = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 4, n: 2, ...greedy, stream: true });
  const texts = ['', ''];
  for await (const chunk of stream) for (const c of chunk.choices) texts[c.index] += c.delta.content ?? '';
  assert.equal(texts[0], texts[1]); // greedy: the same twice
});

test('chat logprobs with top_logprobs', async () => {
  const r = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 5, ...greedy, logprobs: true, top_logprobs: 2 });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, 5);
  for (const e of lp) {
    assert.equal(typeof e.token, 'string');
    assert.ok(e.logprob <= 0);
    assert.ok(Array.isArray(e.bytes));
    assert.equal(e.top_logprobs.length, 2);
  }
});

test('stop strings cut the output', async () => {
  const prompt = 'Once upon a time';
  const full = (await client.completions.create({ model: 'tiny', prompt, max_tokens: 32, ...greedy })).choices[0].text;
  const m = full.slice(Math.floor(full.length / 3)).match(/[!-~]{2}/);
  assert.ok(m, `no ASCII pair in ${JSON.stringify(full)}`);
  const stop = m[0];
  const r = await client.completions.create({ model: 'tiny', prompt, max_tokens: 32, ...greedy, stop: [stop] });
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.choices[0].text, full.slice(0, full.indexOf(stop)));
  // vLLM's include_stop_str_in_output keeps it, streamed or not.
  const kept = { model: 'tiny', prompt, max_tokens: 32, ...greedy, stop: [stop], include_stop_str_in_output: true };
  const k = await client.completions.create(kept);
  assert.equal(k.choices[0].text, full.slice(0, full.indexOf(stop) + stop.length));
  assert.equal(k.choices[0].stop_reason, stop);
  let streamed = '';
  for await (const ch of await client.completions.create({ ...kept, stream: true })) streamed += ch.choices[0]?.text ?? '';
  assert.equal(streamed, k.choices[0].text);
});

test('completions: string, list, stream, legacy logprobs, echo', async () => {
  const r = await client.completions.create({ model: 'tiny', prompt: ['a b c', 'd e f'], max_tokens: 3, ...greedy, logprobs: 1 });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices.length, 2);
  for (const c of r.choices) {
    assert.equal(c.logprobs.tokens.length, 3);
    assert.equal(c.logprobs.token_logprobs.length, 3);
    assert.equal(c.logprobs.text_offset.length, 3);
  }
  const whole = await client.completions.create({ model: 'tiny', prompt: 'Hello', max_tokens: 8, ...greedy, echo: true });
  assert.ok(whole.choices[0].text.startsWith('Hello'));
  const stream = await client.completions.create({ model: 'tiny', prompt: 'Hello', max_tokens: 8, ...greedy, echo: true, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, whole.choices[0].text);
});

test('models.list', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.deepEqual(ids, ['tiny']);
});

test('the shape clients expect: refusal, system_fingerprint, stop_reason on eos, default max_tokens, developer role, usage', async () => {
  let r = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 3, temperature: 0 });
  assert.equal(r.choices[0].message.refusal, null);
  assert.ok('system_fingerprint' in r);
  // The model's own end of sequence: finish_reason stop, stop_reason null.
  r = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 5, logit_bias: { 151645: 100 } });
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.choices[0].stop_reason, null);
  // vLLM's min_tokens holds the eos off that long, however favoured.
  const eosAt = r.usage.completion_tokens;
  r = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 8, logit_bias: { 151645: 100 }, min_tokens: 3 });
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.usage.completion_tokens, eosAt + 3);
  await assert.rejects(client.chat.completions.create({ model: 'tiny', messages, max_tokens: 2, min_tokens: 3 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'min_tokens');
  // generation_config's other eos id (<|endoftext|>) names itself, as vLLM's stop_token_ids do.
  r = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 5, logit_bias: { 151643: 100 } });
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.choices[0].stop_reason, 151643);
  // Completions default to 16 tokens, as OpenAI and vLLM do.
  const c = await client.completions.create({ model: 'tiny', prompt: 'Once', ignore_eos: true, temperature: 0 });
  assert.equal(c.usage.completion_tokens, 16);
  // developer messages are system messages to the template.
  const tok = async (role) => (await (await fetch(`http://127.0.0.1:${port}/tokenize`, { method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ model: 'tiny', messages: [{ role, content: 'Be brief.' }, ...messages] }) })).json()).tokens;
  assert.deepEqual(await tok('developer'), await tok('system'));
  // Continuous usage only with include_usage; the first chunk already knows the prompt.
  let chunks = [];
  for await (const ch of await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 3, stream: true,
    stream_options: { continuous_usage_stats: true } })) chunks.push(ch);
  assert.ok(chunks.every((ch) => !ch.usage));
  chunks = [];
  for await (const ch of await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 3, stream: true,
    stream_options: { include_usage: true, continuous_usage_stats: true } })) chunks.push(ch);
  assert.ok(chunks.every((ch) => ch.usage && ch.usage.prompt_tokens > 0), JSON.stringify(chunks[0]));
  // store, modalities and include_obfuscation are accepted as the no-ops they are here.
  r = await client.chat.completions.create({ model: 'tiny', messages, max_tokens: 2, store: true, modalities: ['text'] });
  assert.equal(r.object, 'chat.completion');
});

// vLLM's continue_final_message: the answer goes on from the assistant's
// final message (a prefill), which the prompt leaves open.
test('continue_final_message continues the final assistant message', async () => {
  const prefill = [{ role: 'user', content: 'What is six times seven?' }, { role: 'assistant', content: 'The answer is (' }];
  const post = async (p, body) => (await fetch(`http://127.0.0.1:${port}${p}`, { method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ model: 'tiny', ...body }) })).json();
  const { tokens } = await post('/tokenize', { messages: prefill, continue_final_message: true, add_generation_prompt: false });
  const { prompt } = await post('/detokenize', { tokens });
  assert.ok(prompt.endsWith('<|im_start|>assistant\n<think>\n\n</think>\n\nThe answer is ('), prompt);
  const r = await client.chat.completions.create({ model: 'tiny', messages: prefill, continue_final_message: true,
    add_generation_prompt: false, structured_outputs: { choice: ['42).'] }, max_tokens: 20 });
  assert.equal(r.choices[0].message.content, '42).');
  assert.equal(r.usage.prompt_tokens, tokens.length);
  // Whitespace around the final message: cut after its stripped text, as transformers does.
  const padded = [prefill[0], { role: 'assistant', content: '  Hello there  ' }];
  const pt = await post('/tokenize', { messages: padded, continue_final_message: true, add_generation_prompt: false });
  assert.ok((await post('/detokenize', { tokens: pt.tokens })).prompt.endsWith('Hello there'));
  await assert.rejects(client.chat.completions.create({ model: 'tiny', messages: prefill, continue_final_message: true }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'continue_final_message');
});

// vLLM's truncate_prompt_tokens: the prompt's last k tokens, also for a
// prompt far past the context (tokenized whole, then cut); echo shows what
// the model saw.
test('truncate_prompt_tokens keeps the prompt\'s last tokens', async () => {
  const ids = [9707, 11, 1879, 0, 358, 1079, 6529, 13, 3555, 374];
  const r = await client.completions.create({ model: 'tiny', prompt: ids, max_tokens: 1, truncate_prompt_tokens: 4,
    echo: true, temperature: 0 });
  assert.equal(r.usage.prompt_tokens, 4);
  const post = async (p, body) => (await fetch(`http://127.0.0.1:${port}${p}`, { method: 'POST',
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ model: 'tiny', ...body }) })).json();
  const tail = (await post('/detokenize', { tokens: ids.slice(-4) })).prompt;
  assert.ok(r.choices[0].text.startsWith(tail), JSON.stringify(r.choices[0].text));
  const long = 'word '.repeat(3000); // about 3000 tokens, past the 2048-token context
  const t = await client.completions.create({ model: 'tiny', prompt: long, max_tokens: 1, truncate_prompt_tokens: 1000 });
  assert.equal(t.usage.prompt_tokens, 1000);
  const c = await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: long }], max_tokens: 1,
    truncate_prompt_tokens: 500 });
  assert.equal(c.usage.prompt_tokens, 500);
  // vLLM's allowed_token_ids: only those are drawn ("Hello", 9707).
  const only = await client.completions.create({ model: 'tiny', prompt: 'Say', max_tokens: 3, allowed_token_ids: [9707] });
  assert.equal(only.choices[0].text, 'HelloHelloHello');
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: 'hi', max_tokens: 1, allowed_token_ids: [] }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'allowed_token_ids');
  // With a grammar that none of them continues: the answer ends saying so.
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: 'x', max_tokens: 3, allowed_token_ids: [9707],
    structured_outputs: { choice: ['yes'] } }), (e) => /allowed_token_ids leave no token/.test(e.message));
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: 'hi', max_tokens: 1, truncate_prompt_tokens: 0 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'truncate_prompt_tokens');
});

test('BadRequestError names the parameter', async () => {
  await assert.rejects(client.chat.completions.create({ model: 'tiny', messages, temperature: 5 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'temperature');
  await assert.rejects(client.chat.completions.create({ model: 'tiny', messages, max_tokens: -3 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'max_tokens');
  await assert.rejects(client.chat.completions.create({ model: 'tiny', messages: [] }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'messages');
  await assert.rejects(client.chat.completions.create({ model: 'tiny', messages, response_format: { type: 'yaml' } }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'response_format.type');
  // Ids past the tokenizer's 151669 are the model's padded rows: no text,
  // so no prompt (vLLM: out of vocabulary), though logit_bias may name them.
  await assert.rejects(client.completions.create({ model: 'tiny', prompt: [9707, 151700], max_tokens: 1 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'prompt[1]' && /0 to 151668/.test(e.message));
  const c = await client.completions.create({ model: 'tiny', prompt: [9707, 151668], max_tokens: 1,
    logit_bias: { 151935: -100 }, echo: true });
  assert.ok(c.choices[0].text.startsWith('Hello</think>'), c.choices[0].text);
});

test('AuthenticationError for a wrong key', async () => {
  const bad = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.chat.completions.create({ model: 'tiny', messages }),
    (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
  await assert.rejects(bad.models.list(), (e) => e instanceof OpenAI.AuthenticationError);
});

test('NotFoundError for an unknown model', async () => {
  await assert.rejects(client.chat.completions.create({ model: 'gpt-5', messages }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404 && e.code === 'model_not_found');
});

await runTests(tests, server);

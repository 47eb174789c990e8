// A small OpenAI-shaped streaming server on loopback: the fixture the bench
// client's tests talk to (the client is the unit under test). It streams
// max_tokens chunks per request and can misbehave on purpose.
//   node openai_stream_server.js [--ttft-ms N] [--itl-ms N] [--fail-every N]
//        [--break-every N] [--error-event-every N] [--crlf] [--split]
//        [--no-usage] [--nul-text] [--api-key KEY]
// --nul-text: every token's text is one NUL byte ("\u0000" in the JSON), which
// a model may emit.
// Prints the port it listens on as the first line of stdout.
// GET /stats returns what it saw: requests, max_in_flight, bodies.
'use strict';
const http = require('http');

const args = process.argv.slice(2);
const opt = { ttft: 0, itl: 0, failEvery: 0, breakEvery: 0, errorEvery: 0, crlf: false, split: false,
              usage: true, nul: false, apiKey: null };
for (let i = 0; i < args.length; i++) {
  const a = args[i];
  if (a === '--ttft-ms') opt.ttft = Number(args[++i]);
  else if (a === '--itl-ms') opt.itl = Number(args[++i]);
  else if (a === '--fail-every') opt.failEvery = Number(args[++i]);
  else if (a === '--break-every') opt.breakEvery = Number(args[++i]);
  else if (a === '--error-event-every') opt.errorEvery = Number(args[++i]);
  else if (a === '--crlf') opt.crlf = true;
  else if (a === '--split') opt.split = true;
  else if (a === '--no-usage') opt.usage = false;
  else if (a === '--nul-text') opt.nul = true;
  else if (a === '--api-key') opt.apiKey = args[++i];
  else { console.error('unknown argument ' + a); process.exit(2); }
}

const MODEL = 'fixture-model';
const stats = { requests: 0, in_flight: 0, max_in_flight: 0, bodies: [], auth: [] };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function sendJSON(res, code, obj) {
  const s = JSON.stringify(obj);
  res.writeHead(code, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(s) });
  res.end(s);
}

function error(res, code, message, param) {
  sendJSON(res, code, { error: { message, type: 'invalid_request_error', param: param || null, code: null } });
}

// Writes one SSE event, in 1-3 byte pieces when --split is on.
async function event(res, data) {
  const nl = opt.crlf ? '\r\n' : '\n';
  const s = 'data: ' + data + nl + nl;
  if (!opt.split) { res.write(s); return; }
  for (let i = 0; i < s.length;) {
    const n = 1 + (i % 3);
    res.write(s.slice(i, i + n));
    i += n;
    await sleep(0);
  }
}

async function stream(req, res, body, chat, nth) {
  const maxTokens = chat ? (body.max_completion_tokens || body.max_tokens) : body.max_tokens;
  const prompt = chat ? body.messages[body.messages.length - 1].content : body.prompt;
  const promptTokens = Array.isArray(prompt) ? prompt.length : String(prompt).split(' ').length;
  const id = (chat ? 'chatcmpl-' : 'cmpl-') + nth;
  const created = Math.floor(Date.now() / 1000);
  const object = chat ? 'chat.completion.chunk' : 'text_completion';
  const chunk = (choice) => JSON.stringify({ id, object, created, model: MODEL, choices: [choice] });
  res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
  res.write(': keep-alive comment\n\n');
  if (chat) await event(res, chunk({ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }));
  await sleep(opt.ttft);
  for (let t = 0; t < maxTokens; t++) {
    if (t > 0) await sleep(opt.itl);
    if (opt.breakEvery && nth % opt.breakEvery === 0 && t === Math.floor(maxTokens / 2)) {
      res.destroy(); // the connection drops mid-stream
      return;
    }
    if (opt.errorEvery && nth % opt.errorEvery === 0 && t === 1) {
      await event(res, JSON.stringify({ error: { message: 'engine fell over', type: 'InternalServerError', code: 500 } }));
      res.end();
      return;
    }
    const text = opt.nul ? '\0' : 'tok' + t + ' ';
    await event(res, chunk(chat ? { index: 0, delta: { content: text }, finish_reason: null }
                                : { index: 0, text, logprobs: null, finish_reason: null }));
  }
  await event(res, chunk(chat ? { index: 0, delta: {}, finish_reason: 'length' }
                              : { index: 0, text: '', logprobs: null, finish_reason: 'length' }));
  if (opt.usage && body.stream_options && body.stream_options.include_usage)
    await event(res, JSON.stringify({ id, object, created, model: MODEL, choices: [],
      usage: { prompt_tokens: promptTokens, completion_tokens: maxTokens, total_tokens: promptTokens + maxTokens } }));
  await event(res, '[DONE]');
  res.end();
}

const server = http.createServer((req, res) => {
  if (req.method === 'GET' && req.url === '/stats') return sendJSON(res, 200, stats);
  if (req.method === 'GET' && req.url === '/v1/models')
    return sendJSON(res, 200, { object: 'list', data: [{ id: MODEL, object: 'model', owned_by: 'fixture' }] });
  const chat = req.url === '/v1/chat/completions';
  if (req.method !== 'POST' || (!chat && req.url !== '/v1/completions')) return error(res, 404, 'no route ' + req.url);
  let raw = '';
  req.on('data', (d) => { raw += d; });
  req.on('end', async () => {
    stats.requests++;
    const nth = stats.requests;
    stats.auth.push(req.headers.authorization || null);
    let body;
    try { body = JSON.parse(raw); } catch (e) { return error(res, 400, 'body is not JSON'); }
    stats.bodies.push(body);
    if (opt.apiKey && req.headers.authorization !== 'Bearer ' + opt.apiKey) return error(res, 401, 'bad api key');
    if (body.model !== MODEL) return error(res, 404, 'The model `' + body.model + '` does not exist.', 'model');
    if (opt.failEvery && nth % opt.failEvery === 0) return error(res, 500, 'fixture failure ' + nth);
    stats.in_flight++;
    stats.max_in_flight = Math.max(stats.max_in_flight, stats.in_flight);
    try { await stream(req, res, body, chat, nth); } finally { stats.in_flight--; }
  });
});
server.keepAliveTimeout = 30000;
server.listen(0, '127.0.0.1', () => { console.log(String(server.address().port)); });
process.on('SIGTERM', () => process.exit(0));

// Server tests: starts `turbokv server` on a free loopback port (--port 0) and drives it with curl
// and the official `openai` npm client: models, chat completions and completions (plain and
// streamed), 16 concurrent streams (dense and TurboQuant mixed in one batch) against the same
// requests made alone, per-request KV options, the API key, and bad requests that must get an
// OpenAI error body while the server keeps serving. The prefix cache: concurrent requests
// sharing a long prefix equal the same requests on a server without it. Slots: id_slot reuse,
// save/restore through files confined to --slot-save-path.
//
// usage: node server_test.mjs <turbokv binary> [model dir]
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';

const [binary, modelDir] = process.argv.slice(2);
if (!binary) {
  console.error('usage: node server_test.mjs <turbokv binary> [model dir]');
  process.exit(2);
}
const MAX_BODY = 65536;
// Per token per KV head (docs/design.md, "TurboQuant"): TurboQuant K3/V4 116 B, dense fp16 512 B; 6 layers, the last
// kept dense, 2 KV heads.
const TQ35_BYTES_PER_TOKEN = 2 * (5 * 116 + 512);

// vocab_size 512, 257 tokenizer ids (tests/fixtures/padded-vocab/README.md).
const PADDED_MODEL = fileURLToPath(new URL('../fixtures/padded-vocab', import.meta.url));

function startServer(extraArgs = [], model = modelDir) {
  const args = ['server', '--port', '0', '--max-body-bytes', String(MAX_BODY),
                '--max-tokens-limit', '512', ...extraArgs];
  if (model) args.push('--model', model);
  const child = spawn(binary, args, { stdio: ['ignore', 'pipe', 'inherit'] });
  return new Promise((resolve, reject) => {
    let out = '';
    child.on('exit', (code) => reject(new Error(`server exited early with ${code}`)));
    child.stdout.on('data', (data) => {
      out += data;
      const m = out.match(/listening on (http:\/\/\S+)/);
      if (m) resolve({ child, url: m[1] });
    });
  });
}

// curl; returns {status, json, text}. body is sent from stdin so any size works; chunked sends
// it with Transfer-Encoding: chunked.
function curl(url, { method = 'GET', body, headers = {}, chunked = false } = {}) {
  const args = ['-s', '-X', method, '-w', '\n%{http_code}', url];
  if (chunked) args.push('-H', 'Transfer-Encoding: chunked');
  for (const [k, v] of Object.entries(headers)) args.push('-H', `${k}: ${v}`);
  if (body !== undefined) args.push('-H', 'Content-Type: application/json', '--data-binary', '@-');
  return new Promise((resolve, reject) => {
    const child = spawn('curl', args);
    let out = '';
    child.stdout.on('data', (d) => { out += d; });
    child.on('error', reject);
    child.on('close', () => {
      const cut = out.lastIndexOf('\n');
      const text = out.slice(0, cut);
      let json;
      try { json = JSON.parse(text); } catch { json = undefined; }
      resolve({ status: Number(out.slice(cut + 1)), json, text });
    });
    if (body !== undefined) child.stdin.end(typeof body === 'string' ? body : JSON.stringify(body));
    else child.stdin.end();
  });
}

function assertOpenAIError(res, status, what) {
  assert.equal(res.status, status, `${what}: status ${res.status}, body ${res.text}`);
  const e = res.json?.error;
  assert.ok(e, `${what}: no error object in ${res.text}`);
  assert.equal(typeof e.message, 'string');
  assert.equal(typeof e.type, 'string');
  assert.ok('param' in e && 'code' in e, `${what}: error lacks param/code`);
}

async function streamText(client, kind, params) {
  const stream = kind === 'chat'
    ? await client.chat.completions.create({ ...params, stream: true })
    : await client.completions.create({ ...params, stream: true });
  let text = '';
  let finish = null;
  for await (const chunk of stream) {
    const choice = chunk.choices[0];
    if (!choice) continue;
    text += kind === 'chat' ? (choice.delta?.content ?? '') : choice.text;
    if (choice.finish_reason) finish = choice.finish_reason;
  }
  return { text, finish };
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const EOS = 8189;  // tinycode-llama's <|endoftext|>: banned with logit_bias for long requests

// /metrics as {name: value}.
async function metrics(url) {
  const out = {};
  for (const line of (await curl(`${url}/metrics`)).text.split('\n')) {
    const m = line.match(/^(turbokv_\w+) (\S+)$/);
    if (m) out[m[1]] = Number(m[2]);
  }
  return out;
}

// Polls until pred(metrics) holds; fails after ms.
async function metricsReach(url, pred, ms, what) {
  const deadline = Date.now() + ms;
  let m;
  while (Date.now() < deadline) {
    m = await metrics(url);
    if (pred(m)) return m;
    await sleep(50);
  }
  throw new Error(`${what}: metrics never got there: ${JSON.stringify(m)}`);
}

// A raw TCP connection; `ended` resolves when the server closes it.
function rawConnection(url) {
  const { hostname, port } = new URL(url);
  const socket = net.connect(Number(port), hostname);
  socket.on('error', () => {});
  socket.ended = new Promise((resolve) => socket.on('close', resolve));
  socket.on('data', () => {});
  return new Promise((resolve) => socket.on('connect', () => resolve(socket)));
}

const tests = [];
const test = (name, fn) => tests.push({ name, fn });

const chatParams = {
  model: 'tinycode-llama',
  messages: [{ role: 'user', content: 'Write a Python function that reverses a list.' }],
  max_tokens: 40,
  temperature: 0,
};
const completionParams = { model: 'tinycode-llama', prompt: 'def fibonacci(n):', max_tokens: 48,
                           temperature: 0 };

test('health and models list (curl and openai)', async ({ url, client }) => {
  const health = await curl(`${url}/health`);
  assert.equal(health.status, 200);
  assert.equal(health.json.status, 'ok');
  const models = await curl(`${url}/v1/models`);
  assert.equal(models.status, 200);
  assert.equal(models.json.object, 'list');
  assert.equal(models.json.data[0].id, 'tinycode-llama');
  const page = await client.models.list();
  assert.deepEqual(page.data.map((m) => m.id), ['tinycode-llama']);
});

test('chat completion, plain and streamed with usage, agree', async ({ url, client }) => {
  const plain = await client.chat.completions.create(chatParams);
  assert.equal(plain.object, 'chat.completion');
  assert.equal(plain.choices[0].message.role, 'assistant');
  assert.equal(typeof plain.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(plain.choices[0].finish_reason));
  assert.ok(plain.usage.prompt_tokens > 0);

  const stream = await client.chat.completions.create({
    ...chatParams, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let usage = null;
  let role = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    const delta = chunk.choices[0]?.delta;
    if (delta?.role) role = delta.role;
    text += delta?.content ?? '';
  }
  assert.equal(role, 'assistant');
  assert.equal(text, plain.choices[0].message.content);
  assert.equal(usage.completion_tokens, plain.usage.completion_tokens);
  assert.equal(usage.prompt_tokens, plain.usage.prompt_tokens);

  const raw = await curl(`${url}/v1/chat/completions`, { method: 'POST', body: chatParams });
  assert.equal(raw.status, 200);
  assert.equal(raw.json.choices[0].message.content, plain.choices[0].message.content);
});

test('completion, plain and streamed, writes Python and agrees', async ({ client }) => {
  const plain = await client.completions.create(completionParams);
  assert.equal(plain.object, 'text_completion');
  const text = plain.choices[0].text;
  assert.match(text, /return|if|fibonacci|\(/);
  const streamed = await streamText(client, 'completion', completionParams);
  assert.equal(streamed.text, text);
  assert.equal(streamed.finish, plain.choices[0].finish_reason);
});

test('16 concurrent streams (dense and 3.5-bit mixed) equal the same requests made alone',
     async ({ url, client }) => {
  // 8 distinct requests (4 prompts x dense / TurboQuant 3.5), each sent by two clients at once.
  const prompts = ['import os\n', 'class Stack:\n', 'def main():\n', 'for i in range(10):\n'];
  const distinct = [];
  for (const prompt of prompts) {
    for (const kv of [{}, { kv_bits: 3.5 }]) {
      distinct.push({ model: 'tinycode-llama', prompt, max_tokens: 48, temperature: 0, ...kv });
    }
  }
  const alone = [];
  for (const r of distinct) alone.push((await streamText(client, 'completion', r)).text);
  const passes = async () => Number((await curl(`${url}/metrics`)).text
    .match(/^turbokv_forward_passes_total (\d+)/m)[1]);
  const before = await passes();
  const clients = [...distinct, ...distinct];
  const together = await Promise.all(clients.map((r) => streamText(client, 'completion', r)));
  const after = await passes();
  together.forEach((r, i) => assert.equal(r.text, alone[i % 8], `client ${i}`));
  // Batching: far fewer forward passes than one per client per token.
  assert.ok(after - before < 16 * 48, `forward passes ${after - before} for 16 clients`);
});

test('per-request KV options and their exact KV bytes', async ({ url, client }) => {
  const body = { ...completionParams, max_tokens: 16, kv_bits: 3.5 };
  const tq = await curl(`${url}/v1/completions`, { method: 'POST', body });
  assert.equal(tq.status, 200, tq.text);
  const u = tq.json.usage;
  assert.equal(u.kv_scheme, 'turboquant');
  const cached = u.prompt_tokens + u.completion_tokens -
                 (tq.json.choices[0].finish_reason === 'length' ? 1 : 0);
  assert.equal(u.kv_bytes, cached * TQ35_BYTES_PER_TOKEN);
  assert.equal(u.kv_bytes_dense, cached * 2 * 6 * 512);
  const uniform = await curl(`${url}/v1/completions`,
                             { method: 'POST', body: { ...body, kv_bits: 4 } });
  assert.equal(uniform.json.usage.kv_scheme, 'uniform');
  const tq4 = await curl(`${url}/v1/completions`, {
    method: 'POST', body: { ...body, kv_bits: 4, kv_quant_scheme: 'turboquant' } });
  assert.equal(tq4.json.usage.kv_scheme, 'turboquant');
  for (const bad of [{ kv_bits: 0.3 }, { kv_bits: 2.25 }, { kv_bits: 9 }, { kv_bits: 'abc' },
                     { kv_bits: 4, kv_quant_scheme: 'foo' }]) {
    const res = await curl(`${url}/v1/completions`, { method: 'POST', body: { ...body, ...bad } });
    assertOpenAIError(res, 400, JSON.stringify(bad));
    assert.match(res.json.error.message, /kv_/);
  }
  // The TurboQuant levers per request: fp16 sink rows cost bytes; a lever without a quantized
  // cache, or out of range, is a 400 naming it.
  const sinks = await curl(`${url}/v1/completions`, {
    method: 'POST', body: { ...body, kv_sink_tokens: 8, kv_centering: 'keys',
                            kv_recent_tokens: 3 } });
  assert.equal(sinks.status, 200, sinks.text);
  assert.ok(sinks.json.usage.kv_bytes > u.kv_bytes, sinks.text);
  // Through the openai client: every layer at 116 B per token and KV head.
  const every = await client.completions.create({ ...body, kv_quantize_last_layer: true });
  const everyCached = every.usage.prompt_tokens + every.usage.completion_tokens -
                      (every.choices[0].finish_reason === 'length' ? 1 : 0);
  assert.equal(every.usage.kv_bytes, everyCached * 2 * 6 * 116);
  for (const [bad, param] of [[{ kv_bits: null, kv_centering: 'keys' }, 'kv_centering'],
                              [{ kv_recent_tokens: 5000 }, 'kv_recent_tokens'],
                              [{ kv_allocation: 'auto' }, 'kv_allocation']]) {
    const res = await curl(`${url}/v1/completions`, { method: 'POST', body: { ...body, ...bad } });
    assertOpenAIError(res, 400, JSON.stringify(bad));
    assert.equal(res.json.error.param, param);
  }
});

test('bad requests get 4xx OpenAI errors and the server keeps serving', async ({ url, client }) => {
  const post = (path, body) => curl(`${url}${path}`, { method: 'POST', body });
  const before = await client.completions.create(completionParams);
  assertOpenAIError(await post('/v1/chat/completions', '{"messages": [ oops'), 400, 'bad JSON');
  assertOpenAIError(await post('/v1/chat/completions', '[1, 2]'), 400, 'not an object');
  assertOpenAIError(await post('/v1/chat/completions', { ...chatParams, max_tokens: 'ten' }),
                    400, 'max_tokens string');
  assertOpenAIError(await post('/v1/chat/completions', { ...chatParams, messages: 'hi' }), 400,
                    'messages string');
  assertOpenAIError(await post('/v1/chat/completions', { ...chatParams, temperature: 'hot' }),
                    400, 'temperature string');
  assertOpenAIError(await post('/v1/completions', { ...completionParams, prompt: 42 }), 400,
                    'prompt number');
  assertOpenAIError(await post('/v1/completions', { ...completionParams, stream: 'yes' }), 400,
                    'stream string');
  for (const n of [0, -5]) {
    const res = await post('/v1/completions', { ...completionParams, max_tokens: n });
    assertOpenAIError(res, 400, `max_tokens ${n}`);
    assert.equal(res.json.error.param, 'max_tokens');
  }
  const big = { ...completionParams, prompt: 'x'.repeat(MAX_BODY + 1000) };
  assertOpenAIError(await post('/v1/completions', big), 413, 'oversized body');
  // ~6000 tokens in a body under the size limit: longer than the 4096-token context.
  const long = { ...completionParams, prompt: 'x = 1\n'.repeat(2000) };
  const tooLong = await post('/v1/completions', long);
  assertOpenAIError(tooLong, 400, 'prompt longer than the context');
  assert.equal(tooLong.json.error.code, 'context_length_exceeded');
  assertOpenAIError(await curl(`${url}/v1/nothing`), 404, 'unknown endpoint');
  await assert.rejects(client.chat.completions.create({ ...chatParams, max_tokens: 0 }),
                       (e) => e.status === 400);

  assert.equal((await curl(`${url}/health`)).status, 200);
  const after = await client.completions.create(completionParams);
  assert.equal(after.choices[0].text, before.choices[0].text);
});

// A ~400-token module header shared by every request, then different function openings.
const SHARED_PREFIX = Array.from({ length: 12 }, (_, i) =>
  `def helper_${i}(values, scale=${i + 1}):\n    total = 0\n    for v in values:\n` +
  `        total += v * scale\n    return total\n\n`).join('');
const ENDINGS = ['def main():\n', 'class Runner:\n', 'def test_helpers():\n',
                 'if __name__ == "__main__":\n'];

async function sharedPrefixRequests(client, concurrent) {
  const requests = [];
  for (const ending of ENDINGS) {
    for (const kv of [{}, { kv_bits: 3.5 }]) {
      requests.push({ model: 'tinycode-llama', prompt: SHARED_PREFIX + ending, max_tokens: 24,
                      temperature: 0, ...kv });
    }
  }
  if (!concurrent) {
    const out = [];
    for (const r of requests) out.push((await client.completions.create(r)).choices[0].text);
    return out;
  }
  // Every request twice (half streamed), plus streams of the same prompts abandoned after
  // their first chunk: their caches, partly filled, also go into the prefix cache.
  const all = [...requests, ...requests];
  const abandon = async (r) => {
    const stream = await client.completions.create({ ...r, max_tokens: 200, stream: true });
    await stream[Symbol.asyncIterator]().next();  // the first chunk, then the client leaves
    stream.controller.abort();
  };
  const [texts] = await Promise.all([
    Promise.all(all.map((r, i) => (i % 2
      ? streamText(client, 'completion', r).then((s) => s.text)
      : client.completions.create(r).then((c) => c.choices[0].text)))),
    Promise.all(requests.map(abandon))]);
  return texts;
}

test('requests sharing a long prefix, concurrent, equal them on a server without prefix cache',
     async ({ url, client }) => {
  const { child, url: plainUrl } = await startServer(['--prefix-cache-gb', '0']);
  let reference;
  try {
    const plain = new OpenAI({ baseURL: `${plainUrl}/v1`, apiKey: 'unused', maxRetries: 0 });
    reference = await sharedPrefixRequests(plain, false);
    const off = await curl(`${plainUrl}/metrics`);
    assert.match(off.text, /^turbokv_prefix_cache_hits_total 0$/m);
  } finally {
    child.kill('SIGTERM');
  }
  const metric = async (name) => Number((await curl(`${url}/metrics`)).text
    .match(new RegExp(`^${name} (\\S+)`, 'm'))[1]);
  const hitsBefore = await metric('turbokv_prefix_cache_hits_total');
  await client.completions.create({ model: 'tinycode-llama', prompt: SHARED_PREFIX + '#',
                                    max_tokens: 1, temperature: 0 });
  const together = await sharedPrefixRequests(client, true);
  together.forEach((text, i) => assert.equal(text, reference[i % reference.length], `request ${i}`));
  const after = await sharedPrefixRequests(client, false);  // from the blocks those left behind
  after.forEach((text, i) => assert.equal(text, reference[i], `later request ${i}`));
  assert.ok(await metric('turbokv_prefix_cache_hits_total') > hitsBefore);
  assert.ok(await metric('turbokv_prefix_cache_hit_tokens_total') > 0);
  assert.ok(await metric('turbokv_prefix_cache_bytes') > 0);
  assert.ok(await metric('turbokv_prefix_cache_bytes_dense') >
            await metric('turbokv_prefix_cache_bytes'));
});

test('slot save/restore is off without --slot-save-path', async ({ url }) => {
  const res = await curl(`${url}/v1/slots/0?action=save`,
                         { method: 'POST', body: { filename: 'x.tkv' } });
  assertOpenAIError(res, 400, 'save without a slot directory');
  assert.equal(res.json.error.code, 'slot_save_disabled');
});

test('deeply nested typed fields get 400s, not a crash', async ({ url, client }) => {
  const nested = (depth) => '['.repeat(depth) + '1' + ']'.repeat(depth);
  for (const key of ['max_tokens', 'temperature', 'stream', 'kv_bits', 'seed', 'top_k']) {
    for (const depth of [200, 30000]) {
      const body = JSON.stringify(completionParams).replace(/}$/, `, "${key}": ${nested(depth)}}`);
      const res = await curl(`${url}/v1/completions`, { method: 'POST', body });
      assertOpenAIError(res, 400, `${key} nested ${depth}`);
      assert.ok(res.text.length < 1000, `${key}: error body of ${res.text.length} bytes`);
    }
  }
  assert.equal((await curl(`${url}/health`)).status, 200);
  const r = await client.completions.create({ ...completionParams, max_tokens: 4 });
  assert.equal(r.object, 'text_completion');
});

test('models.retrieve and an unknown model id', async ({ url, client }) => {
  const model = await client.models.retrieve('tinycode-llama');
  assert.equal(model.id, 'tinycode-llama');
  assert.equal(model.object, 'model');
  const missing = await curl(`${url}/v1/models/gpt-4`);
  assertOpenAIError(missing, 404, 'unknown model');
  assert.equal(missing.json.error.code, 'model_not_found');
});

test('the body limit holds for chunked bodies too (413), and the server keeps serving',
     async ({ url }) => {
  const post = (body, chunked) => curl(`${url}/v1/completions`, { method: 'POST', body, chunked });
  const fits = { ...completionParams, max_tokens: 2 };
  assert.equal((await post(fits, true)).status, 200, 'a small chunked body is served');
  const big = { ...completionParams, prompt: 'x'.repeat(8 * MAX_BODY) };
  assertOpenAIError(await post(big, true), 413, 'chunked body over the limit');
  assertOpenAIError(await post(' '.repeat(20 << 20), true), 413, '20 MB of spaces, chunked');
  assertOpenAIError(await post(big, false), 413, 'Content-Length body over the limit');
  assert.equal((await curl(`${url}/health`)).status, 200);
});

test('unsupported OpenAI parameters are 400s naming them', async ({ url }) => {
  const post = (path, body) => curl(`${url}${path}`, { method: 'POST', body });
  for (const [path, base, extra, param] of [
    ['/v1/chat/completions', chatParams, { response_format: { type: 'json_object' } },
     'response_format'],
    ['/v1/chat/completions', chatParams,
     { tools: [{ type: 'function', function: { name: 'f' } }] }, 'tools'],
    ['/v1/chat/completions', chatParams, { tool_choice: 'auto' }, 'tool_choice'],
    ['/v1/chat/completions', chatParams, { functions: [] }, 'functions'],
    ['/v1/chat/completions', chatParams, { frobnicate: 1 }, 'frobnicate'],
    ['/v1/completions', completionParams, { echo: true }, 'echo'],
    ['/v1/completions', completionParams, { best_of: 2 }, 'best_of'],
    ['/v1/completions', completionParams, { suffix: 'x' }, 'suffix'],
    ['/v1/completions', completionParams, { top_logprobs: 2 }, 'top_logprobs'],
    ['/v1/completions', completionParams, { presence_penalty: 2.5 }, 'presence_penalty'],
    ['/v1/completions', completionParams, { frequency_penalty: -3 }, 'frequency_penalty'],
    ['/v1/completions', completionParams, { logit_bias: { 99999: 1 } }, 'logit_bias'],
    ['/v1/completions', completionParams, { logit_bias: { 5: 101 } }, 'logit_bias'],
    ['/v1/completions', completionParams, { logprobs: 6 }, 'logprobs'],
    ['/v1/chat/completions', chatParams, { logprobs: true, top_logprobs: 21 }, 'top_logprobs'],
    ['/v1/chat/completions', chatParams, { top_logprobs: 2 }, 'top_logprobs'],
    // Integers that would wrap when stored.
    ['/v1/completions', completionParams, { top_k: 2 ** 32 }, 'top_k'],
    ['/v1/completions', completionParams, { kv_bits: 4, kv_group_size: 2 ** 40 }, 'kv_group_size'],
    ['/v1/completions', completionParams, { max_tokens: 2 ** 63 }, 'max_tokens'],
  ]) {
    const res = await post(path, { ...base, max_tokens: 2, ...extra });
    assertOpenAIError(res, 400, JSON.stringify(extra));
    assert.equal(res.json.error.param, param, JSON.stringify(extra));
  }
  // The values that ask for nothing are accepted.
  for (const extra of [{ response_format: { type: 'text' } }, { tools: [] }, { tool_choice: 'none' },
                       { user: 'u' }, { n: 1 }]) {
    const res = await post('/v1/chat/completions', { ...chatParams, max_tokens: 2, ...extra });
    assert.equal(res.status, 200, `${JSON.stringify(extra)}: ${res.text}`);
  }
  for (const extra of [{ echo: false }, { best_of: 1 }, { suffix: '' }]) {
    const res = await post('/v1/completions', { ...completionParams, max_tokens: 2, ...extra });
    assert.equal(res.status, 200, `${JSON.stringify(extra)}: ${res.text}`);
  }
});

test('logprobs: chat (plain and streamed) and completions, greedy tokens on top',
     async ({ client }) => {
  const chat = await client.chat.completions.create(
    { ...chatParams, max_tokens: 12, logprobs: true, top_logprobs: 3 });
  const content = chat.choices[0].logprobs.content;
  assert.equal(content.length, chat.usage.completion_tokens);
  for (const e of content) {
    assert.ok(e.logprob <= 0 && Number.isFinite(e.logprob));
    assert.equal(e.top_logprobs.length, 3);
    assert.deepEqual(e.bytes, [...Buffer.from(e.token, 'utf8')]);
    for (let i = 1; i < 3; ++i) assert.ok(e.top_logprobs[i - 1].logprob >= e.top_logprobs[i].logprob);
    assert.equal(e.top_logprobs[0].logprob, e.logprob, 'greedy picks the most likely token');
  }
  const stream = await client.chat.completions.create(
    { ...chatParams, max_tokens: 12, logprobs: true, top_logprobs: 3, stream: true });
  const streamed = [];
  for await (const chunk of stream) streamed.push(...(chunk.choices[0]?.logprobs?.content ?? []));
  assert.deepEqual(streamed.map((e) => [e.token, e.logprob]), content.map((e) => [e.token, e.logprob]));

  const plain = await client.completions.create({ ...completionParams, max_tokens: 10, logprobs: 2 });
  const lp = plain.choices[0].logprobs;
  assert.equal(lp.tokens.length, plain.usage.completion_tokens);
  assert.equal(lp.token_logprobs.length, lp.tokens.length);
  assert.equal(lp.top_logprobs.length, lp.tokens.length);
  assert.equal(lp.text_offset.length, lp.tokens.length);
  assert.ok(lp.top_logprobs.every((t) => Object.keys(t).length <= 2));
  // Without the parameter: null, as OpenAI sends.
  const none = await client.completions.create({ ...completionParams, max_tokens: 2 });
  assert.equal(none.choices[0].logprobs, null);
});

test('logit_bias and presence/frequency penalties change the greedy tokens', async ({ client }) => {
  const base = { ...completionParams, max_tokens: 8, logprobs: 1 };
  const plain = await client.completions.create(base);
  const first = plain.choices[0].logprobs.tokens[0];
  // Bias: +100 on one token makes every greedy step pick it.
  const forced = await client.completions.create({ ...base, logit_bias: { 42: 100 } });
  const forcedTokens = forced.choices[0].logprobs.tokens;
  assert.ok(forcedTokens.length === 8 && forcedTokens.every((t) => t === forcedTokens[0]),
            JSON.stringify(forcedTokens));
  // -100 on that token: it never comes.
  const banned = await client.completions.create({ ...base, logit_bias: { 42: -100 } });
  assert.ok(!banned.choices[0].logprobs.tokens.includes(forcedTokens[0]));
  assert.notEqual(first, undefined);
  // Code repeats tokens (indentation, brackets): penalizing repeats changes the greedy text.
  const long = { ...completionParams, max_tokens: 48 };
  const unpenalized = (await client.completions.create(long)).choices[0].text;
  for (const penalty of [{ frequency_penalty: 2 }, { presence_penalty: 2 }]) {
    const penalized = (await client.completions.create({ ...long, ...penalty })).choices[0].text;
    assert.notEqual(penalized, unpenalized, JSON.stringify(penalty));
  }
});

test('a client that hangs up cancels its request, plain or streamed; metrics go idle',
     async ({ url }) => {
  const long = { ...completionParams, max_tokens: 512, logit_bias: { [EOS]: -100 } };
  for (const stream of [false, true]) {
    const before = await metrics(url);
    // A raw socket closed by the client (fetch's abort can leave a body promise pending
    // forever, nodejs/undici#4089).
    const socket = await rawConnection(url);
    const body = JSON.stringify({ ...long, stream });
    socket.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
                 `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    await metricsReach(url, (m) => m.turbokv_generated_tokens_total >= before.turbokv_generated_tokens_total + 5,
                       30000, 'generation started');
    socket.destroy();
    await socket.ended;
    const after = await metricsReach(
      url, (m) => m.turbokv_active_sequences === 0 && m.turbokv_kv_bytes === 0, 3000,
      `stream=${stream}: cancelled`);
    const generated = after.turbokv_generated_tokens_total - before.turbokv_generated_tokens_total;
    assert.ok(generated < 400, `stream=${stream}: ${generated} tokens generated after the hang-up`);
  }
});

test('metrics report requests, tokens, sequences and KV bytes', async ({ url }) => {
  const m = await curl(`${url}/metrics`);
  assert.equal(m.status, 200);
  for (const name of ['turbokv_requests_total', 'turbokv_generated_tokens_total',
                      'turbokv_active_sequences', 'turbokv_kv_bytes',
                      'turbokv_prefix_cache_hits_total', 'turbokv_prefix_cache_hit_tokens_total',
                      'turbokv_prefix_cache_bytes', 'turbokv_prefix_cache_bytes_dense',
                      'turbokv_prefix_cache_evictions_total']) {
    assert.match(m.text, new RegExp(`^${name} \\d+`, 'm'), name);
  }
  assert.ok(Number(m.text.match(/^turbokv_requests_total (\d+)/m)[1]) > 0);
});

async function apiKeyTest() {
  const { child, url } = await startServer(['--api-key', 'sekret']);
  try {
    const denied = await curl(`${url}/v1/models`);
    assertOpenAIError(denied, 401, 'no API key');
    assert.equal(denied.json.error.code, 'invalid_api_key');
    const wrong = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(wrong.models.list(), (e) => e.status === 401);
    const right = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'sekret', maxRetries: 0 });
    const r = await right.completions.create({ ...completionParams, max_tokens: 4 });
    assert.equal(r.object, 'text_completion');
    assert.equal((await curl(`${url}/health`)).status, 200);
  } finally {
    child.kill('SIGTERM');
  }
}

async function slotsTest() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'turbokv-slots-'));
  const slotDir = path.join(dir, 'slots');
  const { child, url } = await startServer(['--slot-save-path', slotDir, '--slots', '2']);
  try {
    const post = (p, body) => curl(`${url}${p}`, { method: 'POST', body });
    const body = { ...completionParams, max_tokens: 8, id_slot: 0 };
    const first = await post('/v1/completions', body);
    assert.equal(first.status, 200, first.text);
    assert.equal(first.json.usage.prompt_tokens_details.cached_tokens, 0);
    const prompt = first.json.usage.prompt_tokens;
    const slots = await curl(`${url}/v1/slots`);
    assert.equal(slots.json.length, 2);
    assert.equal(slots.json[0].n_tokens, prompt + 8);
    assert.equal(slots.json[1].n_tokens, 0);
    const again = await post('/v1/completions', body);
    assert.equal(again.json.usage.prompt_tokens_details.cached_tokens, prompt - 1);
    assert.equal(again.json.choices[0].text, first.json.choices[0].text);

    const saved = await post('/v1/slots/0?action=save', { filename: 'slot0.tkv' });
    assert.equal(saved.status, 200, saved.text);
    assert.equal(saved.json.n_saved, prompt + 8);
    assert.ok(saved.json.n_written > 0);
    assert.ok(fs.existsSync(path.join(slotDir, 'slot0.tkv')));
    const restored = await post('/v1/slots/1?action=restore', { filename: 'slot0.tkv' });
    assert.equal(restored.status, 200, restored.text);
    assert.equal(restored.json.n_restored, prompt + 8);
    const onSlot1 = await post('/v1/completions', { ...body, id_slot: 1 });
    assert.equal(onSlot1.json.usage.prompt_tokens_details.cached_tokens, prompt - 1);
    assert.equal(onSlot1.json.choices[0].text, first.json.choices[0].text);

    for (const filename of ['../evil.tkv', '../../evil.tkv', path.join(dir, 'evil.tkv'), '..',
                            'a/b.tkv', '.hidden', '', 'x'.repeat(200)]) {
      for (const action of ['save', 'restore']) {
        const res = await post(`/v1/slots/0?action=${action}`, { filename });
        assertOpenAIError(res, 400, `${action} '${filename}'`);
        assert.equal(res.json.error.param, 'filename');
      }
    }
    assert.ok(!fs.existsSync(path.join(dir, 'evil.tkv')), 'a file escaped the slot directory');
    assert.deepEqual(fs.readdirSync(dir), ['slots']);
    assertOpenAIError(await post('/v1/slots/0?action=restore', { filename: 'none.tkv' }), 404,
                      'missing file');
    fs.writeFileSync(path.join(slotDir, 'junk.tkv'), 'not a cache file');
    const junk = await post('/v1/slots/0?action=restore', { filename: 'junk.tkv' });
    assertOpenAIError(junk, 400, 'junk file');
    assert.equal(junk.json.error.code, 'invalid_cache_file');
    assertOpenAIError(await post('/v1/slots/0?action=fly', { filename: 'a' }), 400, 'action');
    assertOpenAIError(await post('/v1/slots/7?action=save', { filename: 'a' }), 400, 'slot id');
    assertOpenAIError(await post('/v1/completions', { ...body, id_slot: 7 }), 400, 'id_slot');
    const erased = await post('/v1/slots/1?action=erase', {});
    assert.equal(erased.json.n_erased, prompt + 8);
    assert.equal((await curl(`${url}/v1/slots`)).json[1].n_tokens, 0);
  } finally {
    child.kill('SIGTERM');
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

// A checkpoint whose vocab_size is padded past its tokenizer: sampling never picks a padded id,
// so every request succeeds and the server keeps serving.
async function paddedVocabTest() {
  const { child, url } = await startServer([], PADDED_MODEL);
  try {
    const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0 });
    const params = { model: 'x', prompt: 'hello', max_tokens: 200, temperature: 1.5 };
    const results = await Promise.all([0, 1, 2, 3].map((seed) =>
      client.completions.create({ ...params, seed })));
    for (const r of results) assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
    const streamed = await streamText(client, 'completion', { ...params, seed: 9 });
    assert.ok(streamed.finish);
    assert.equal((await curl(`${url}/health`)).status, 200);
  } finally {
    child.kill('SIGTERM');
  }
}

// Slow clients: trickling headers or bodies hold HTTP threads only until the request timeout, and
// a new connection that finds every thread held evicts the slowest of them.
async function slowClientsTest() {
  const { child, url } = await startServer(['--http-threads', '4', '--request-timeout', '3']);
  try {
    const trickle = async (prefix) => {
      const s = await rawConnection(url);
      s.write(prefix);
      s.timer = setInterval(() => s.write('x'), 300);
      return s;
    };
    const slow = [];
    for (let i = 0; i < 6; ++i) {
      slow.push(await trickle(i % 2 ? 'GET /health HTTP/1.1\r\nX-Slow: '
                                      : 'POST /v1/completions HTTP/1.1\r\nHost: x\r\n' +
                                        'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{'));
    }
    await sleep(1500);  // every thread is now held by a slow client
    for (let i = 0; i < 3; ++i) {
      const t0 = Date.now();
      const health = await curl(`${url}/health`);
      assert.equal(health.status, 200);
      assert.ok(Date.now() - t0 < 2500, `/health took ${Date.now() - t0} ms`);
    }
    // Past the request timeout every slow connection has been closed by the server.
    const t0 = Date.now();
    await Promise.all(slow.map((s) => s.ended));
    assert.ok(Date.now() - t0 < 5000, `slow clients closed after ${Date.now() - t0} ms`);
    for (const s of slow) clearInterval(s.timer);
    const r = await curl(`${url}/v1/completions`, { method: 'POST', body: { ...completionParams, max_tokens: 2 } });
    assert.equal(r.status, 200);
  } finally {
    child.kill('SIGTERM');
  }
}

// SIGTERM while requests run: they are cancelled and the server exits promptly.
async function sigtermTest() {
  const { child, url } = await startServer();
  const long = { ...completionParams, max_tokens: 512, logit_bias: { [EOS]: -100 } };
  const requests = [0, 1, 2].map(() => curl(`${url}/v1/completions`, { method: 'POST', body: long }));
  await metricsReach(url, (m) => m.turbokv_active_sequences === 3, 30000, 'three running');
  const exited = new Promise((resolve) => child.on('exit', resolve));
  const t0 = Date.now();
  child.kill('SIGTERM');
  assert.equal(await exited, 0);
  assert.ok(Date.now() - t0 < 3000, `exit took ${Date.now() - t0} ms`);
  await Promise.all(requests);
}

async function main() {
  const { child, url } = await startServer();
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'unused', maxRetries: 0 });
  let failed = 0;
  const run = async (name, fn) => {
    try {
      await fn();
      console.log(`ok   ${name}`);
    } catch (e) {
      failed += 1;
      console.log(`FAIL ${name}\n${e.stack}`);
    }
  };
  for (const t of tests) await run(t.name, () => t.fn({ url, client }));
  await run('API key: 401 without it, served with it', apiKeyTest);
  await run('slots: id_slot reuse, save/restore in the slot directory only', slotsTest);
  await run('padded vocab: only tokenizer ids are sampled', paddedVocabTest);
  await run('slow clients: request timeout and eviction keep /health answered', slowClientsTest);
  await run('SIGTERM cancels running requests and exits promptly', sigtermTest);
  const exited = new Promise((resolve) => child.on('exit', resolve));
  child.kill('SIGTERM');
  const code = await exited;
  if (code !== 0) {
    failed += 1;
    console.log(`FAIL server exit code after SIGTERM: ${code}`);
  }
  console.log(failed ? `${failed} failed` : 'all passed');
  process.exit(failed ? 1 : 0);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});

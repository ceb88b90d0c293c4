// Soak test of `turbokv server` on loopback, bounded in time: many concurrent clients mix good
// requests (plain and streamed, dense and TurboQuant, two in five sharing a long prompt prefix
// that the prefix cache serves), streams aborted mid-way, plain requests abandoned before their
// answer, malformed and oversized requests and raw garbage connections.
// Afterwards every good response must equal the same request made alone, /metrics must be back
// to idle, and the server's RSS and open file descriptors back to their baseline.
//
// usage: node soak_test.mjs <turbokv binary> [seconds of load, default 30]
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';

const [binary, secondsArg] = process.argv.slice(2);
if (!binary) {
  console.error('usage: node soak_test.mjs <turbokv binary> [seconds]');
  process.exit(2);
}
const LOAD_SECONDS = Number(secondsArg ?? 30);
const CLIENTS = 24;
const MAX_BODY = 65536;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// xorshift32: the same mix of actions on every run.
function rng(seed) {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13; s >>>= 0;
    s ^= s >> 17;
    s ^= s << 5; s >>>= 0;
    return s / 4294967296;
  };
}

function startServer() {
  const child = spawn(binary, ['server', '--port', '0', '--http-threads', '16',
                               '--max-sequences', '8', '--max-tokens-limit', '64',
                               '--max-body-bytes', String(MAX_BODY), '--prefix-cache-gb', '0.02',
                               '--request-timeout', '5'],
                      { stdio: ['ignore', 'pipe', 'inherit'] });
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

const rssKiB = (pid) =>
  Number(fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/^VmRSS:\s+(\d+)/m)[1]);
const openFds = (pid) => fs.readdirSync(`/proc/${pid}/fd`).length;

// The server closes a connection just after its client has read the answer, so a count taken
// right after a request may still include that socket: wait until the count has not changed for
// half a second (or 8 s have passed) and return the smallest count seen.
async function settledFds(pid) {
  let least = openFds(pid);
  let last = least;
  let still = 0;
  for (let i = 0; i < 160 && still < 10; ++i) {
    await sleep(50);
    const now = openFds(pid);
    still = now === last ? still + 1 : 0;
    last = now;
    least = Math.min(least, now);
  }
  return least;
}

async function metrics(url) {
  const out = {};
  const text = await (await fetch(`${url}/metrics`, { headers: { Connection: 'close' } })).text();
  for (const line of text.split('\n')) {
    const m = line.match(/^(turbokv_\w+) (\S+)$/);
    if (m) out[m[1]] = Number(m[2]);
  }
  return out;
}

// The distinct good requests: prompts x KV settings x endpoint. A batch computes a sequence's
// logits in another order than a solo run (few decode rows take dot products, many rows sgemm)
// and they differ by ~1e-5: a greedy step whose top two tokens are that close can differ from
// the solo run (e.g. "class Stack:\n" at 4-bit uniform KV, token 9). These prompts have no such
// near-tie in their first 24 tokens under any of the KV settings.
const PROMPTS = ['import os\n', 'def fibonacci(n):\n', 'def main():\n', 'for i in range(10):\n'];
const GOOD = [];
for (const prompt of PROMPTS) {
  for (const kv of [{}, { kv_bits: 3.5 }, { kv_bits: 4 }]) {
    GOOD.push({ path: '/v1/completions',
                body: { model: 'm', prompt, max_tokens: 24, temperature: 0, ...kv } });
  }
  GOOD.push({ path: '/v1/chat/completions',
              body: { model: 'm', messages: [{ role: 'user', content: prompt }], max_tokens: 24,
                      temperature: 0 } });
}

// Requests that share a long prompt prefix (~5 prefix-cache blocks of 64 tokens), so that
// concurrent requests restore the same cached blocks while others on it are aborted; the first
// solo run stores the prefix, later ones are served from it.
const PREFIX = Array.from({ length: 24 }, (_, i) =>
  `def f${i}(x):\n    return x * ${i} + ${i + 1}\n\n`).join('');
const PREFIXED = [];
for (const suffix of ['def main():\n', 'import os\n']) {
  for (const kv of [{}, { kv_bits: 3.5 }]) {
    PREFIXED.push({ path: '/v1/completions',
                    body: { model: 'm', prompt: PREFIX + suffix, max_tokens: 24, temperature: 0,
                            ...kv } });
  }
}
PREFIXED.push({ path: '/v1/chat/completions',
                body: { model: 'm', messages: [{ role: 'user', content: PREFIX + 'def main():\n' }],
                        max_tokens: 24, temperature: 0 } });
const UNPREFIXED = [...GOOD];
GOOD.push(...PREFIXED);

// Connection: close, so that no idle keep-alive connection is left when the soak ends.
function post(url, path, body) {
  return fetch(`${url}${path}`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', Connection: 'close' },
    body: typeof body === 'string' ? body : JSON.stringify(body) });
}

// A request the client drops: it closes the socket once `chunks` pieces of the answer have
// arrived (a stream aborted mid-way) or after `ms` milliseconds (a plain request abandoned),
// as a client that goes away does. A raw socket, because fetch's abort can leave the body's
// promise pending forever (nodejs/undici#4089), which hangs the soak instead of testing it.
function dropped(url, path, body, { chunks = Infinity, ms = Infinity }) {
  const { hostname, port } = new URL(url);
  const payload = JSON.stringify(body);
  return new Promise((resolve) => {
    const s = net.connect(Number(port), hostname, () => {
      s.write(`POST ${path} HTTP/1.1\r\nHost: ${hostname}:${port}\r\n` +
              `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(payload)}` +
              `\r\nConnection: close\r\n\r\n${payload}`);
    });
    let seen = 0;
    const timer = Number.isFinite(ms) ? setTimeout(() => s.destroy(), ms) : null;
    s.on('data', () => { if (++seen >= chunks) s.destroy(); });
    s.on('error', () => {});
    s.on('close', () => {
      if (timer) clearTimeout(timer);
      resolve();
    });
  });
}

// The text of a good request, plain or streamed.
async function goodText(url, req, stream) {
  const res = await post(url, req.path, { ...req.body, stream });
  assert.equal(res.status, 200, `${req.path}: status ${res.status}`);
  const chat = req.path.includes('chat');
  if (!stream) {
    const j = await res.json();
    return chat ? j.choices[0].message.content : j.choices[0].text;
  }
  let text = '';
  const body = await res.text();
  for (const line of body.split('\n')) {
    if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
    const e = JSON.parse(line.slice(6));
    assert.ok(!e.error, `stream error: ${line}`);
    const c = e.choices[0];
    if (c) text += chat ? (c.delta?.content ?? '') : c.text;
  }
  assert.ok(body.endsWith('data: [DONE]\n\n'), 'stream without [DONE]');
  return text;
}

const BAD = [
  ['/v1/completions', '{"prompt": "x", "max_tokens": ', 400],
  ['/v1/completions', { prompt: 'x', max_tokens: 0 }, 400],
  ['/v1/completions', { prompt: 'x', top_k: 2 ** 32 }, 400],
  ['/v1/completions', { prompt: 'x', echo: true }, 400],
  ['/v1/chat/completions', { messages: [{ role: 'user', content: 'x' }], tools: [{}] }, 400],
  ['/v1/chat/completions', { messages: 'hi' }, 400],
  ['/v1/completions', { prompt: 'x', max_tokens: '['.repeat(5000) + ']'.repeat(5000) }, 400],
  ['/v1/completions', { prompt: 'y'.repeat(MAX_BODY * 2) }, 413],
];

// What the test is waiting for, printed by the watchdog if it never comes.
const progress = { phase: 'starting the server', clients: [] };

async function client(url, id, deadline, counts, solo) {
  const random = rng(1000 + id);
  const doing = (what) => { progress.clients[id] = what; };
  while (Date.now() < deadline) {
    const r = random();
    const pool = random() < 0.4 ? PREFIXED : UNPREFIXED;  // two in five share the long prefix
    const req = pool[Math.floor(random() * pool.length)];
    doing(`action ${r.toFixed(3)} on ${req.path} ${JSON.stringify(req.body).slice(0, 60)}`);
    if (r < 0.45) {  // a good request, plain or streamed
      const stream = random() < 0.5;
      const text = await goodText(url, req, stream);
      assert.equal(text, solo.get(req), `${JSON.stringify(req.body)} stream=${stream}`);
      counts.good += 1;
    } else if (r < 0.6) {  // a stream aborted after a few events
      await dropped(url, req.path, { ...req.body, stream: true, max_tokens: 64 },
                    { chunks: 1 + Math.floor(random() * 4) });
      counts.streamAborts += 1;
    } else if (r < 0.72) {  // a plain request abandoned before its answer
      await dropped(url, req.path, { ...req.body, max_tokens: 64 }, { ms: 20 + random() * 200 });
      counts.plainAborts += 1;
    } else if (r < 0.95) {  // a bad request
      const [path, body, status] = BAD[Math.floor(random() * BAD.length)];
      const res = await post(url, path, body);
      assert.equal(res.status, status, `bad request ${path} ${String(JSON.stringify(body)).slice(0, 80)}`);
      const j = await res.json();
      assert.ok(j.error && typeof j.error.message === 'string');
      counts.bad += 1;
    } else {  // raw garbage, then hang up
      const { hostname, port } = new URL(url);
      await new Promise((resolve) => {
        const s = net.connect(Number(port), hostname, () => {
          s.end(random() < 0.5 ? 'GARBAGE \x00\xff\r\n\r\n' : 'POST /v1/completions HTTP/1.1\r\nContent-Length: 99\r\n\r\n{');
        });
        s.on('error', resolve);
        s.on('close', resolve);
        s.on('data', () => {});
      });
      counts.garbage += 1;
    }
  }
  doing('done');
}

async function main() {
  const t0 = Date.now();
  // Watchdog: a hung request or socket fails the test with what it was waiting for, instead
  // of running into the harness's timeout without a word.
  setTimeout(() => {
    const pending = progress.clients.map((what, i) => `client ${i}: ${what}`)
                                   .filter((line) => !line.endsWith(': done'));
    console.error(`soak: stuck while ${progress.phase} (${((Date.now() - t0) / 1000).toFixed(0)} s)` +
                  (pending.length ? `; ${pending.join('; ')}` : ''));
    process.exit(1);
  }, (LOAD_SECONDS + 150) * 1000).unref();
  const { child, url } = await startServer();
  const pid = child.pid;
  const exited = new Promise((resolve) => child.on('exit', resolve));
  try {
    progress.phase = 'making the solo runs';
    // Solo runs: the expected text of every good request (both forms must agree).
    const solo = new Map();
    for (const req of GOOD) {
      const plain = await goodText(url, req, false);
      assert.equal(await goodText(url, req, true), plain);
      solo.set(req, plain);
    }
    const rssBefore = rssKiB(pid);
    progress.phase = 'counting the idle file descriptors';
    const fdsBefore = await settledFds(pid);

    const hitsBefore = (await metrics(url)).turbokv_prefix_cache_hits_total;
    const counts = { good: 0, streamAborts: 0, plainAborts: 0, bad: 0, garbage: 0 };
    progress.phase = 'running the load';
    const loadStart = Date.now();
    const deadline = loadStart + LOAD_SECONDS * 1000;
    await Promise.all(Array.from({ length: CLIENTS }, (_, i) => client(url, i, deadline, counts, solo)));
    const loadSeconds = (Date.now() - loadStart) / 1000;

    progress.phase = 'waiting for /metrics to be idle';
    // Back to idle: no sequence, no queue, no KV bytes.
    let m;
    for (let i = 0; i < 100; ++i) {
      m = await metrics(url);
      if (m.turbokv_active_sequences === 0 && m.turbokv_waiting_requests === 0 &&
          m.turbokv_kv_bytes === 0) break;
      await sleep(50);
    }
    assert.equal(m.turbokv_active_sequences, 0, 'active sequences after the soak');
    assert.equal(m.turbokv_waiting_requests, 0, 'waiting requests after the soak');
    assert.equal(m.turbokv_kv_bytes, 0, 'KV bytes after the soak');
    const prefixHits = m.turbokv_prefix_cache_hits_total - hitsBefore;
    assert.ok(prefixHits >= 10, `${prefixHits} prefix cache hits during the soak`);
    progress.phase = 'waiting for the connections to close';
    // Every connection closes after its response (the garbage ones within the request timeout).
    let fds = openFds(pid);
    for (let i = 0; i < 80 && fds > fdsBefore; ++i) {
      await sleep(100);
      fds = openFds(pid);
    }
    assert.ok(fds <= fdsBefore, `open fds ${fds}, before ${fdsBefore}`);
    const rssAfter = rssKiB(pid);
    // The allocator keeps some freed memory; a leak grows with the number of requests.
    assert.ok(rssAfter < rssBefore + 96 * 1024,
              `RSS ${rssBefore} KiB before, ${rssAfter} KiB after`);
    progress.phase = 'checking a request after the soak';
    // Still serving exactly as before.
    assert.equal(await goodText(url, GOOD[0], false), solo.get(GOOD[0]));

    const total = Object.values(counts).reduce((a, b) => a + b, 0);
    console.log(`soak: ${total} requests from ${CLIENTS} clients in ${loadSeconds.toFixed(1)} s ` +
                `(${counts.good} good, all equal to their solo run; ${counts.streamAborts} streams ` +
                `aborted mid-way; ${counts.plainAborts} plain requests abandoned; ${counts.bad} ` +
                `bad; ${counts.garbage} garbage connections); ${m.turbokv_requests_total} ` +
                `generation requests, ${m.turbokv_requests_failed_total} failed; ${prefixHits} ` +
                `prefix cache hits (${m.turbokv_prefix_cache_hit_tokens_total} prompt tokens ` +
                `restored in all); RSS ` +
                `${(rssBefore / 1024).toFixed(1)} MiB before, ${(rssAfter / 1024).toFixed(1)} MiB ` +
                `after; open fds ${fdsBefore} before, ${fds} after; ` +
                `${((Date.now() - t0) / 1000).toFixed(1)} s in all`);
  } finally {
    progress.phase = 'waiting for the server to exit on SIGTERM';
    child.kill('SIGTERM');
  }
  const code = await exited;
  assert.equal(code, 0, `server exit code ${code}`);
}

main().then(() => process.exit(0), (e) => {
  console.error(e);
  process.exit(1);
});

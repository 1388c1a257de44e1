#!/usr/bin/env node
// harness.cjs: the page's browser engine run by Node on Dawn, Chrome's
// WebGPU (the npm package webgpu's dawn.node), as the page runs it: the
// same drafter.wasm and wasm_exec.js, loaded from a loopback HTTP server
// shaped as webdraft serve's (/models/index.json, /models/DIR/FILE,
// /wasm/…), and — in modes edge and browser — the page's own worker
// (web/static/worker.js) driven by its message protocol, with the model
// files read from disk in place of Cache Storage. See README.md.
"use strict";

const fs = require("fs");
const path = require("path");
const http = require("http");
const vm = require("vm");
const crypto = require("crypto");
const { execFileSync } = require("child_process");
const dawn = require("./navigator.cjs");
const { Calls, replay, census } = require("./calls.cjs");

const root = path.join(__dirname, "..", "..");

const usage = `usage: node lab/dawn/harness.cjs MODE [options]

modes:
  adapter   the adapter navigator.gpu gives (name, features, limits)
  engine    the engine alone through webdraft's JavaScript API: both models
            loaded (loadFiles), drafts of --n tokens after each prompt, and
            step times (one step; a chained draft of --chain tokens)
  edge      the page's worker in edge mode (the drafter alone): ready, the
            first draft, a draft after each prompt ({op: "draft"} messages)
  browser   the page's worker in mode (a) (both models, the live view):
            a race (speculative decoding, then the target alone) per prompt,
            after an untimed one at each k

options:
  --dawn PATH          dawn.node (default: $DAWN_NODE, else .gpu/dawn/dawn.node)
  --dawn-flag FLAG     a flag for Dawn's create() (repeatable; e.g. backend=vulkan)
  --wasm DIR           the engine's build: drafter.wasm and wasm_exec.js (default wasm/dist/files)
  --worker FILE        the page's worker (default web/static/worker.js)
  --drafter DIR        the drafter's folder (default weights/drafter)
  --target DIR         the target's folder (default weights/target)
  --prompts FILE       JSON lines {"ids": [...]} and/or {"text": "..."} (default weights/heldout_prompts.jsonl)
  --max-prompts N      use the first N prompts (default 8)
  --n N                engine, edge: tokens drafted after each prompt (default 16)
  --steps N            engine: timed one-step drafts (default 32)
  --chain N            engine: tokens of each timed chained draft (default 32)
  --rounds N           engine: timed chained drafts (default 8)
  --calls              engine: also time the WebGPU calls of the steps (where
                       the host's time goes: inside Dawn, waiting for the GPU,
                       in the Go program) and replay one step's and one chained
                       draft's calls from JavaScript alone (their floor
                       without the Go program)
  --k LIST             browser: draft lengths, comma-separated (default 4)
  --max-tokens N       browser: tokens a run generates (default 128)
  --cold               edge, browser: start from an empty Cache Storage (the models
                       are downloaded over loopback HTTP, as on a first visit)
  --native PATH        a native webdraft binary: compare the drafts with its
                       \`draft --backend webgpu\` for the same prompts (and, in mode
                       browser, take the prompts' text from its \`detokenize\`)
  --profile FILE       engine, browser: Node's CPU profile of the timed steps alone
                       (cpuprofile.py reads it; --wasm with a drafter.wasm built
                       without -ldflags=-s names the Go functions)
  --out FILE           also write the report (JSON) here
`;

function parseArgs(argv) {
  const o = {
    mode: argv[0], dawn: "", dawnFlags: [], wasm: path.join(root, "wasm/dist/files"),
    worker: path.join(root, "web/static/worker.js"), drafter: path.join(root, "weights/drafter"),
    target: path.join(root, "weights/target"), prompts: path.join(root, "weights/heldout_prompts.jsonl"),
    maxPrompts: 8, n: 16, steps: 32, chain: 32, rounds: 8, k: [4], maxTokens: 128, cold: false, calls: false, profile: "", native: "", out: "",
  };
  if (!["adapter", "engine", "edge", "browser"].includes(o.mode)) throw new UsageError(`unknown mode ${JSON.stringify(o.mode)}`);
  const ints = { "--max-prompts": "maxPrompts", "--n": "n", "--steps": "steps", "--chain": "chain", "--rounds": "rounds", "--max-tokens": "maxTokens" };
  const strs = { "--dawn": "dawn", "--wasm": "wasm", "--worker": "worker", "--drafter": "drafter", "--target": "target", "--prompts": "prompts", "--native": "native", "--out": "out", "--profile": "profile" };
  for (let i = 1; i < argv.length; i++) {
    const a = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) throw new UsageError(`${a} needs a value`);
      return argv[++i];
    };
    if (a === "--cold") o.cold = true;
    else if (a === "--calls") o.calls = true;
    else if (a === "--dawn-flag") o.dawnFlags.push(value());
    else if (a === "--k") o.k = value().split(",").map((s) => positive("--k", s));
    else if (a in ints) o[ints[a]] = positive(a, value());
    else if (a in strs) o[strs[a]] = value();
    else throw new UsageError(`unknown option ${a}`);
  }
  return o;
}

class UsageError extends Error {}

function positive(flag, s) {
  const n = Number(s);
  if (!Number.isInteger(n) || n <= 0) throw new UsageError(`${flag} ${s}: want a positive integer`);
  return n;
}

const now = () => performance.now();
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? (s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2) : NaN;
};
const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
const round = (x, d = 3) => Math.round(x * 10 ** d) / 10 ** d;
const log = (...args) => console.error("harness:", ...args);

// ---- the files the page is served ----

// site is what webdraft serve gives the page's worker: the manifest (the
// pair's files with sizes and SHA-256, the engine's build) and the paths
// on disk behind each URL.
function site(o) {
  const files = [];
  const disk = new Map(); // URL path -> file on disk
  const names = [o.drafter, o.target].map((d) => path.basename(path.resolve(d)));
  if (names[0] === names[1]) throw new Error(`the drafter's and the target's folders have the same name (${names[0]}): the page keeps them side by side`);
  [o.drafter, o.target].forEach((dir, i) => {
    for (const name of ["config.json", "model.safetensors", "tokenizer.json"]) {
      const p = path.join(dir, name);
      if (!fs.existsSync(p)) {
        if (name === "tokenizer.json") continue;
        throw new Error(`${p}: missing (the page takes folders webdraft convert wrote, with one model.safetensors)`);
      }
      const data = fs.readFileSync(p);
      const f = { path: `${names[i]}/${name}`, size: data.length, sha256: crypto.createHash("sha256").update(data).digest("hex") };
      files.push(f);
      disk.set(`/models/${f.path}`, p);
    }
  });
  const program = path.join(o.wasm, "drafter.wasm");
  const loader = path.join(o.wasm, "wasm_exec.js");
  for (const p of [program, loader]) {
    if (!fs.existsSync(p)) throw new Error(`${p}: missing (go tool task wasm builds the engine; lab/dawn/pack.sh run copies it)`);
  }
  disk.set("/wasm/drafter.wasm", program);
  disk.set("/wasm/wasm_exec.js", loader);
  const v = crypto.createHash("sha256").update(fs.readFileSync(program)).digest("hex").slice(0, 12);
  const manifest = { drafter: names[0], target: names[1], files, program: `/wasm/drafter.wasm?v=${v}`, loader: "/wasm/wasm_exec.js" };
  return { manifest, disk };
}

// serve serves the site on 127.0.0.1; it resolves to its origin and a
// count of the bytes sent.
function serve(s) {
  const stats = { bytes: 0, requests: 0 };
  const server = http.createServer((req, res) => {
    const url = new URL(req.url, "http://x");
    stats.requests++;
    if (url.pathname === "/models/index.json") {
      res.writeHead(200, { "Content-Type": "application/json", "Cache-Control": "no-cache" });
      res.end(JSON.stringify(s.manifest));
      return;
    }
    const p = s.disk.get(url.pathname);
    if (!p) {
      res.writeHead(404, { "Content-Type": "text/plain" });
      res.end(`no such file: ${url.pathname}\n`);
      return;
    }
    const type = p.endsWith(".wasm") ? "application/wasm" : p.endsWith(".js") ? "text/javascript" : "application/octet-stream";
    const data = fs.readFileSync(p);
    stats.bytes += data.length;
    res.writeHead(200, { "Content-Type": type, "Content-Length": data.length });
    res.end(data);
  });
  server.unref(); // the harness ends with process.exit; the server does not keep it alive
  return new Promise((resolve, reject) => {
    server.on("error", reject);
    server.listen(0, "127.0.0.1", () => resolve({ origin: `http://127.0.0.1:${server.address().port}`, stats }));
  });
}

// memoryCache is Cache Storage's one cache, in memory: filled from disk
// (what a reload finds) unless cold (a first visit).
function memoryCache(s, cold) {
  const m = new Map();
  if (!cold) {
    for (const f of s.manifest.files) m.set(`/models/${f.path}?sha256=${f.sha256}`, fs.readFileSync(s.disk.get(`/models/${f.path}`)));
  }
  return {
    async match(key) {
      const b = m.get(String(key));
      return b ? new Response(b) : undefined;
    },
    async put(key, resp) { m.set(String(key), new Uint8Array(await resp.arrayBuffer())); },
    async delete(key) { return m.delete(String(key)); },
  };
}

// workerScope makes this Node context the worker's global scope: self,
// importScripts (the loader, from disk: it is synchronous in a worker),
// fetch against the site's origin, Cache Storage, postMessage.
function workerScope(s, origin, cache, onMessage) {
  globalThis.self = globalThis;
  const fetchAbs = globalThis.fetch;
  globalThis.fetch = (url, init) => fetchAbs(new URL(String(url), origin), init);
  globalThis.importScripts = (...urls) => {
    for (const u of urls) {
      const p = s.disk.get(new URL(u, origin).pathname);
      if (!p) throw new Error(`importScripts ${u}: not a file of the site`);
      vm.runInThisContext(fs.readFileSync(p, "utf8"), { filename: p });
    }
  };
  globalThis.caches = { open: async () => cache };
  globalThis.postMessage = (m) => onMessage(structuredClone(m));
}

// bootProgram starts the engine's Go program as the worker's boot does.
async function bootProgram(man) {
  importScripts(man.loader);
  const go = new self.Go();
  const inst = await WebAssembly.instantiateStreaming(fetch(man.program), go.importObject);
  self.wasm = inst; // the WebGPU binding hands Go memory to writeBuffer through it
  go.run(inst.instance).then(() => log("the Go program exited (a crash: its panic is above)"));
  if (!self.webdraft) throw new Error("the engine did not start (no webdraft global)");
}

// worker drives the page's worker script through its message protocol.
class WorkerDriver {
  constructor() {
    this.log = [];
    this.waiters = [];
  }
  receive(m) {
    this.log.push({ t: now(), m });
    for (const w of [...this.waiters]) {
      if (m.op === "failed") w.reject(new Error(`the worker failed: ${m.message}`));
      else if (w.pred(m)) w.resolve(m);
      else continue;
      this.waiters.splice(this.waiters.indexOf(w), 1);
    }
  }
  send(m) {
    const data = structuredClone(m);
    setImmediate(() => self.onmessage({ data }));
  }
  // until resolves to the next message for which pred holds.
  until(pred, what, timeoutS = 600) {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no ${what} from the worker in ${timeoutS} s`)), timeoutS * 1000);
      const done = (f) => (x) => { clearTimeout(timer); f(x); };
      this.waiters.push({ pred, resolve: done(resolve), reject: done(reject) });
    });
  }
}

async function startWorker(o, s, cold) {
  const { origin, stats } = await serve(s);
  const w = new WorkerDriver();
  workerScope(s, origin, memoryCache(s, cold), (m) => w.receive(m));
  vm.runInThisContext(fs.readFileSync(o.worker, "utf8"), { filename: o.worker });
  if (typeof self.onmessage !== "function") throw new Error(`${o.worker} set no onmessage`);
  return { w, stats };
}

// ---- prompts and native drafts ----

function readPrompts(o) {
  const lines = fs.readFileSync(o.prompts, "utf8").split("\n").filter((l) => l.trim());
  const out = [];
  for (const [i, l] of lines.slice(0, o.maxPrompts).entries()) {
    let p;
    try {
      p = JSON.parse(l);
    } catch (err) {
      throw new Error(`${o.prompts}:${i + 1}: ${err.message}`);
    }
    if (!Array.isArray(p.ids) && typeof p.text !== "string") throw new Error(`${o.prompts}:${i + 1}: want "ids" or "text"`);
    out.push({ ids: p.ids, text: p.text });
  }
  if (!out.length) throw new Error(`${o.prompts}: no prompts`);
  return out;
}

// native runs the native webdraft binary and parses its JSON answer.
function native(o, args) {
  try {
    return JSON.parse(execFileSync(o.native, args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], maxBuffer: 1 << 24 }));
  } catch (err) {
    const how = err.signal ? `killed by ${err.signal}` : err.status != null ? `exit status ${err.status}` : err.message;
    throw new Error(`${o.native} ${args.slice(0, 4).join(" ")} …: ${how}\n${err.stderr || ""}`);
  }
}

function nativeDraft(o, dir, input, n) {
  const args = ["draft", "--backend", "webgpu", "--model", dir, "--n", String(n)];
  if (input.ids) args.push("--ids", input.ids.join(","));
  else args.push("--text", input.text);
  return native(o, args).draft;
}

// promptTexts gives every prompt its text (browser mode sends text).
function promptTexts(o, prompts) {
  for (const [i, p] of prompts.entries()) {
    if (typeof p.text === "string") continue;
    if (!o.native) throw new Error(`prompt ${i + 1} has ids only: the page sends text (give --native, whose detokenize turns ids into text, or prompts with "text")`);
    p.text = native(o, ["detokenize", "--ids", p.ids.join(",")]).text;
  }
}

const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

// profiler starts Node's CPU profiler; stop(file) writes the profile.
async function profiler() {
  const inspector = require("inspector");
  const session = new inspector.Session();
  session.connect();
  const post = (method, params) => new Promise((resolve, reject) => session.post(method, params, (err, r) => (err ? reject(err) : resolve(r))));
  await post("Profiler.enable");
  await post("Profiler.setSamplingInterval", { interval: 100 });
  await post("Profiler.start");
  return {
    async stop(file) {
      const { profile } = await post("Profiler.stop");
      session.disconnect();
      fs.writeFileSync(file, JSON.stringify(profile));
      log(`the steps' CPU profile: ${file}`);
    },
  };
}

// ---- the modes ----

async function modeAdapter(o, gpu) {
  const a = await dawn.describe(gpu);
  if (!a) throw new Error("Dawn found no adapter (on Linux it wants a Vulkan driver: lab/dawn/README.md)");
  return { adapter: a };
}

async function modeEngine(o) {
  const s = site(o);
  const prompts = readPrompts(o);
  if (prompts.some((p) => !p.ids)) throw new Error("mode engine drafts after token ids: every prompt needs \"ids\"");
  const { origin } = await serve(s);
  workerScope(s, origin, memoryCache(s, false), () => {});
  const calls = new Calls();
  const t0 = now();
  await bootProgram(s.manifest);
  const bootMs = now() - t0;
  const files = {};
  for (const f of s.manifest.files) files[f.path] = new Uint8Array(fs.readFileSync(s.disk.get(`/models/${f.path}`)));
  const report = { boot_ms: round(bootMs, 1), models: {} };
  let mismatches = 0;
  for (const [role, dir, kvMiB] of [["drafter", s.manifest.drafter, 64], ["target", s.manifest.target, 128]]) {
    let t = now();
    const m = await webdraft.loadFiles(files, dir, { kvMiB, maxSequences: 4 });
    const r = { load_ms: round(now() - t, 1), adapter: m.adapter, f16: m.f16, kv_capacity: m.kvCapacity };
    log(`${role}: loaded in ${r.load_ms} ms on ${m.adapter}`);
    report.adapter = m.adapter;
    report.features = m.features;
    t = now();
    await m.draft(prompts[0].ids, o.n);
    r.first_draft_ms = round(now() - t, 1); // compiles the pipelines
    log(`${role}: the first draft in ${r.first_draft_ms} ms`);
    r.drafts = [];
    for (const p of prompts) {
      t = now();
      const d = await m.draft(p.ids, o.n);
      const row = { prompt: p.ids.length, draft: d, ms: round(now() - t) };
      if (o.native) {
        row.native = nativeDraft(o, role === "drafter" ? o.drafter : o.target, p, o.n);
        row.equal = same(d, row.native);
        if (!row.equal) mismatches++;
      }
      r.drafts.push(row);
    }
    // Steps: a session holds the context; each call feeds one token (the
    // last draft's first) and drafts k after it: k = 1 is one step read
    // back, k = chain a chained draft (one step fed, chain − 1 chained).
    const sess = m.session();
    let d = await sess.draft(prompts[0].ids, true, 1);
    const single = [], singleGo = [], chained = [];
    const prof = o.profile ? await profiler() : null;
    for (let i = 0; i < o.steps; i++) {
      t = now();
      d = await sess.draft([d.tokens[0]], false, 1);
      single.push(now() - t);
      singleGo.push(d.ms);
    }
    for (let i = 0; i < o.rounds; i++) {
      t = now();
      d = await sess.draft([d.tokens[0]], false, o.chain);
      chained.push((now() - t) / o.chain);
    }
    if (prof) await prof.stop(o.profile.replace(/(\.cpuprofile)?$/, `-${role}.cpuprofile`));
    if (o.calls) {
      // Installed for this part alone: the step times above are the
      // engine's own.
      calls.install(globalThis);
      const step = async () => { d = await sess.draft([d.tokens[0]], false, 1); };
      const chain = async () => { d = await sess.draft([d.tokens[0]], false, o.chain); };
      r.calls = {
        step: await calls.measure(async () => { for (let i = 0; i < o.steps; i++) await step(); }, o.steps),
        chained: await calls.measure(async () => { for (let i = 0; i < o.rounds; i++) await chain(); }, o.rounds * o.chain),
      };
      const stepTrace = await calls.capture(step), chainTrace = await calls.capture(chain);
      r.replay = {
        step_ms: round(await replay(stepTrace, o.steps)), chained_ms: round((await replay(chainTrace, o.rounds)) / o.chain),
        step_calls: census(stepTrace), chained_calls: census(chainTrace),
      };
      log(`${role}: a step's calls ${JSON.stringify(r.calls.step)}`);
      log(`${role}: replayed from JavaScript alone: a step ${r.replay.step_ms} ms, chained ${r.replay.chained_ms} ms a token`);
      calls.uninstall();
    }
    await sess.close();
    r.step_ms = round(median(single));
    r.step_go_ms = round(median(singleGo)); // inside the Go program (no Promise settling)
    r.chained_step_ms = round(median(chained));
    r.context = prompts[0].ids.length + 1 + o.steps + o.rounds * o.chain;
    report.models[role] = r;
    await m.close();
    log(`${role}: a step ${r.step_ms} ms (${r.step_go_ms} in Go), chained ${r.chained_step_ms} ms a token`);
  }
  if (o.native) {
    report.drafts_equal_native = mismatches === 0;
    log(mismatches ? `${mismatches} drafts differ from native webdraft's` : `every draft (${2 * prompts.length}) equals native webdraft's`);
  }
  return report;
}

async function modeEdge(o) {
  const s = site(o);
  const prompts = readPrompts(o);
  if (prompts.some((p) => !p.ids)) throw new Error("mode edge drafts after token ids: every prompt needs \"ids\"");
  const { w, stats } = await startWorker(o, s, o.cold);
  const t0 = now();
  w.send({ op: "init", mode: "edge" });
  const ready = await w.until((m) => m.op === "ready", "ready");
  const readyMs = now() - t0;
  const report = {
    cold: o.cold, adapter: ready.adapter, features: ready.features, f16: ready.f16, ready_ms: round(readyMs, 1),
    downloaded: ready.downloaded, cached: ready.cached, served_bytes: stats.bytes, drafts: [],
  };
  if (!o.cold && ready.downloaded) log(`warning: ${ready.downloaded} bytes downloaded from a warm cache (the worker's cache keys changed?)`);
  let id = 0;
  let mismatches = 0;
  for (const p of prompts) {
    const t = now();
    w.send({ op: "draft", request: { id: ++id, tokens: p.ids, reset: true, k: o.n } });
    const m = (await w.until((x) => x.op === "draft" && x.message.id === id, "draft")).message;
    if (m.error) throw new Error(`draft ${id}: ${m.error}`);
    const row = { prompt: p.ids.length, draft: m.tokens, draft_ms: m.draft_ms, ms: round(now() - t) };
    if (id === 1) report.first_draft_after_init_ms = round(now() - t0, 1); // the time to a first drafted token
    if (o.native) {
      row.native = nativeDraft(o, o.drafter, p, o.n);
      row.equal = same(m.tokens, row.native);
      if (!row.equal) mismatches++;
    }
    report.drafts.push(row);
  }
  if (o.native) report.drafts_equal_native = mismatches === 0;
  log(`edge: ready in ${report.ready_ms} ms (${o.cold ? "cold" : "warm"} cache, ${ready.downloaded} bytes downloaded), the first draft ${report.first_draft_after_init_ms} ms after init`);
  return report;
}

async function modeBrowser(o) {
  const s = site(o);
  const prompts = readPrompts(o);
  promptTexts(o, prompts);
  const { w, stats } = await startWorker(o, s, o.cold);
  const t0 = now();
  w.send({ op: "init", mode: "browser" });
  const ready = await w.until((m) => m.op === "ready", "ready");
  log(`browser: ready in ${round(now() - t0, 1)} ms on ${ready.adapter}`);
  const report = {
    cold: o.cold, adapter: ready.adapter, features: ready.features, ready_ms: round(now() - t0, 1),
    downloaded: ready.downloaded, served_bytes: stats.bytes, max_tokens: o.maxTokens, runs: [],
  };
  const problems = [];
  // As bench spec --live: a race untimed first at each k (the first
  // prompt), so that the timed ones find every pipeline compiled and the
  // engine's code optimized by the JavaScript engine's later tiers.
  for (const k of o.k) {
    w.send({ op: "send", message: { type: "start", prompt: prompts[0].text, chat: false, k, max_tokens: o.maxTokens, temperature: 0, seed: 0, race: true } });
    const end = await w.until((m) => m.op === "event" && (m.event.type === "finished" || m.event.type === "error"), "finished");
    if (end.event.type === "error") throw new Error(`k ${k}, the untimed race: ${end.event.message}`);
  }
  const prof = o.profile ? await profiler() : null;
  for (const k of o.k) {
    const rows = [];
    for (const [i, p] of prompts.entries()) {
      const from = w.log.length;
      w.send({ op: "send", message: { type: "start", prompt: p.text, chat: false, k, max_tokens: o.maxTokens, temperature: 0, seed: 0, race: true } });
      await w.until((m) => m.op === "event" && (m.event.type === "finished" || m.event.type === "error"), "finished");
      const events = w.log.slice(from).filter((x) => x.m.op === "event").map((x) => x.m.event);
      const err = events.find((e) => e.type === "error");
      if (err) throw new Error(`k ${k}, prompt ${i + 1}: ${err.message}`);
      const row = { prompt: i + 1, k };
      const ids = { speculative: [], target: [] };
      const times = { draft: [], verify: [] };
      for (const e of events) {
        if (e.type === "step") {
          for (const t of [...e.tokens, ...e.draft]) {
            if (typeof t.p !== "number" || !(t.p >= 0 && t.p <= 1)) problems.push(`k ${k}, prompt ${i + 1}, ${e.run} step ${e.step}: token ${t.id} has p ${t.p}`);
          }
          ids[e.run].push(...e.tokens.map((t) => t.id));
          if (e.run === "speculative") {
            times.draft.push(e.draft_ms);
            times.verify.push(e.verify_ms);
          }
        } else if (e.type === "done") {
          row[e.run] = { tokens: e.tokens, steps: e.steps, seconds: e.seconds, tokens_per_s: e.tokens_per_s, tau: e.tau };
        } else if (e.type === "race") {
          row.speedup = round(e.speedup);
        }
      }
      row.draft_ms = round(mean(times.draft));
      row.verify_ms = round(mean(times.verify));
      row.target_step_ms = round((1000 * row.target.seconds) / row.target.steps);
      if (!same(ids.speculative, ids.target)) problems.push(`k ${k}, prompt ${i + 1}: speculative decoding's tokens differ from the target alone's (greedy)`);
      if (o.native && k === o.k[0]) {
        const n = Math.min(ids.target.length, 64); // webdraft draft's --n is at most 64
        const want = nativeDraft(o, o.target, { text: p.text }, n);
        row.native_target_equal = same(ids.target.slice(0, n), want);
        if (!row.native_target_equal) problems.push(`prompt ${i + 1}: the target's tokens ${ids.target.slice(0, n)} differ from native webdraft's ${want}`);
      }
      log(`k ${k}, prompt ${i + 1}: speculative ${row.speculative.tokens_per_s} tok/s (τ ${row.speculative.tau}), the target alone ${row.target.tokens_per_s} tok/s: ${row.speedup}×`);
      rows.push(row);
    }
    const sum = (f) => rows.reduce((a, r) => a + f(r), 0);
    const specRate = sum((r) => r.speculative.tokens) / sum((r) => r.speculative.seconds);
    const baseRate = sum((r) => r.target.tokens) / sum((r) => r.target.seconds);
    report.runs.push({
      k, prompts: rows.length, rows,
      // over all prompts: tokens over seconds, as bench spec --live reports
      speculative_tokens_per_s: round(specRate), target_tokens_per_s: round(baseRate), speedup: round(specRate / baseRate),
      tau: round(sum((r) => r.speculative.tokens) / sum((r) => r.speculative.steps)),
      draft_ms: round(mean(rows.map((r) => r.draft_ms))), verify_ms: round(mean(rows.map((r) => r.verify_ms))),
      target_step_ms: round((1000 * sum((r) => r.target.seconds)) / sum((r) => r.target.steps)),
    });
  }
  if (prof) await prof.stop(o.profile.replace(/(\.cpuprofile)?$/, "-browser.cpuprofile"));
  report.problems = problems;
  for (const p of problems) log(`PROBLEM: ${p}`);
  return report;
}

function summary(mode, r) {
  const lines = [];
  if (mode === "engine") {
    lines.push(`adapter ${r.adapter}; engine booted in ${r.boot_ms} ms`, "| model | load ms | first draft ms | step ms | chained ms/token |", "| --- | ---: | ---: | ---: | ---: |");
    for (const [role, m] of Object.entries(r.models)) lines.push(`| ${role} | ${m.load_ms} | ${m.first_draft_ms} | ${m.step_ms} | ${m.chained_step_ms} |`);
    for (const [role, m] of Object.entries(r.models)) {
      if (!m.calls) continue;
      for (const [what, c] of Object.entries(m.calls)) {
        lines.push(`${role}, ${what} (ms a token): ${c.ms} = ${c.in_calls_ms} in WebGPU calls + ${c.map_wait_ms} waiting for mappings + ${c.outside_ms} elsewhere (Go, syscall/js, promises)`);
        lines.push(`  calls a token: ${Object.entries(c.calls).map(([k, v]) => `${k} ${v.n}× ${v.us} µs`).join(", ")}`);
      }
      lines.push(`${role}, replayed from JavaScript alone: a step ${m.replay.step_ms} ms, chained ${m.replay.chained_ms} ms a token`);
    }
    if ("drafts_equal_native" in r) lines.push(`drafts equal native webdraft's: ${r.drafts_equal_native}`);
  } else if (mode === "browser") {
    lines.push(`adapter ${r.adapter}; ready in ${r.ready_ms} ms; ${r.max_tokens} tokens a run, greedy`, "| k | prompts | speculative tok/s | target alone tok/s | τ | speedup | draft ms | verify ms | target step ms |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (const x of r.runs) lines.push(`| ${x.k} | ${x.prompts} | ${x.speculative_tokens_per_s} | ${x.target_tokens_per_s} | ${x.tau} | ${x.speedup}× | ${x.draft_ms} | ${x.verify_ms} | ${x.target_step_ms} |`);
    lines.push(r.problems.length ? `${r.problems.length} problems (above)` : "no problems: greedy speculative = target alone, every p in [0, 1]");
  } else if (mode === "edge") {
    lines.push(`adapter ${r.adapter}; ready in ${r.ready_ms} ms (${r.cold ? "cold" : "warm"}), first draft ${r.first_draft_after_init_ms} ms after init`);
    if ("drafts_equal_native" in r) lines.push(`drafts equal native webdraft's: ${r.drafts_equal_native}`);
  } else {
    lines.push(JSON.stringify(r.adapter, null, 1));
  }
  return lines.join("\n");
}

async function main() {
  let o;
  try {
    o = parseArgs(process.argv.slice(2));
  } catch (err) {
    if (!(err instanceof UsageError)) throw err;
    process.stderr.write(`harness: ${err.message}\n\n${usage}`);
    process.exit(2);
  }
  const gpu = dawn.install(o.dawn, o.dawnFlags);
  const run = { adapter: modeAdapter, engine: modeEngine, edge: modeEdge, browser: modeBrowser }[o.mode];
  const report = await run(o, gpu);
  report.mode = o.mode;
  report.node = process.version;
  console.log(summary(o.mode, report));
  if (o.out) fs.writeFileSync(o.out, JSON.stringify(report, null, 1) + "\n");
  const failed = report.drafts_equal_native === false || (report.problems && report.problems.length);
  process.exit(failed ? 1 : 0); // Dawn's device and the Go program would keep Node running
}

main().catch((err) => {
  console.error(`harness: ${err && err.stack ? err.stack : err}`);
  process.exit(1);
});

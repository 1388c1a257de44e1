// worker.js: webdraft's engine in the browser, in a dedicated worker so the
// page's thread never waits on it. It loads the engine's build (the Go
// program of package wasm and the toolchain's wasm_exec.js, from the
// server's /models/index.json), fetches both models with progress, keeps
// them in Cache Storage under their SHA-256 (a reload reads them from there)
// and runs, on the user's GPU, either the live view (mode "browser": both
// models here — the target and the drafter, or the server's EAGLE-3 head
// over the target) or what drafts alone for edge drafting (mode "edge":
// the server's target verifies; the page relays the websocket's draft
// requests — with a head, the target's features it reads — here and the
// drafts back). Messages:
//
//   from the page:  {op: "init", key, mode}     key: the API key, if the server wants one; mode: "browser" or "edge"
//                   {op: "send", message}       a start or stop, as on the websocket
//                   {op: "draft", request}      edge: a draft_request from the websocket
//                   {op: "lose-device"}         a fault drill: the GPU device is lost
//   to the page:    {op: "progress", done, total, file, cached}
//                   {op: "ready", mode, adapter, features, f16, head, seconds, downloaded, cached}
//                                               head: the EAGLE-3 head's folder where it drafts (either mode)
//                   {op: "event", event}        the live view's events (web/README.md)
//                   {op: "draft", message}      edge: the draft to send up the websocket
//                   {op: "fault", message}      the GPU failed: the engine restarts
//                   {op: "recovered", seconds, faults}  it runs again, on a new device
//                   {op: "failed", message}     the engine could not start here (or again)
"use strict";

const CACHE = "webdraft-models-v1";
let live = null; // mode "browser": the live view on both models
let drafter = null, target = null; // the models loaded
let session = null; // mode "edge": the drafting sequences kept between drafts
let modes = {}; // the modes asked for (and started once ready)
let man = null; // the server's /models/index.json
let booted = false; // the engine's program runs
let headers = {}; // the API key's, for /models/
let faults = 0;
let chain = Promise.resolve(); // inits and drafts, one at a time
let recovering = false;

self.onmessage = (ev) => {
  const m = ev.data;
  if (m.op === "init") {
    if (m.key) headers = { Authorization: "Bearer " + m.key };
    const mode = m.mode === "edge" ? "edge" : "browser";
    modes[mode] = true;
    chain = chain.then(() => init(mode)).catch(failed);
  } else if (m.op === "draft") {
    chain = chain.then(() => draft(m.request));
  } else if (m.op === "send" && live) {
    live.send(JSON.stringify(m.message));
  } else if (m.op === "send") {
    event({ type: "error", message: "the engine in this browser is restarting: start again in a moment" });
  } else if (m.op === "lose-device" && self.webdraft) {
    self.webdraft.loseDevice("a fault drill").catch(failed);
  }
};

function failed(err) {
  live = null;
  self.postMessage({ op: "failed", message: String(err && err.message ? err.message : err) });
}

function event(e) {
  self.postMessage({ op: "event", event: e });
}

// init starts the engine the first time, then what mode needs: the
// drafter (edge), or both models and the live view (browser).
async function init(mode) {
  const t0 = performance.now();
  let got = null; // the model files (not kept: a later mode reads them from Cache Storage again)
  if (!booted) {
    got = await boot();
    booted = true;
  } else if (!(mode === "edge" ? session : live)) {
    got = await fetchModels(man.files);
  }
  if (got) await start(got.files, mode);
  const on = drafter || target;
  self.postMessage({
    op: "ready", mode, adapter: on.adapter, features: on.features, f16: on.f16,
    head: man.head || "",
    seconds: (performance.now() - t0) / 1000, downloaded: got ? got.downloaded : 0, cached: got ? got.cached : 0,
  });
}

async function boot() {
  if (!self.navigator.gpu) throw new Error("this browser has no WebGPU (navigator.gpu is missing in a worker)");
  const adapter = await self.navigator.gpu.requestAdapter();
  if (!adapter) throw new Error("this browser's WebGPU found no adapter");
  const manifest = await json("/models/index.json");
  if (manifest.unavailable) throw new Error(manifest.unavailable);
  if (!manifest.program) throw new Error("this server's binary has no browser engine (build it with `go tool task build`)");

  man = manifest;
  importScripts(man.loader);
  const go = new self.Go();
  const inst = await WebAssembly.instantiateStreaming(fetch(man.program), go.importObject);
  self.wasm = inst; // the WebGPU binding hands Go memory to writeBuffer through it
  // The program runs until it exits, which it does only when it crashes
  // (its panic is in the console): the page then hears of it.
  go.run(inst.instance).then(() => {
    live = null;
    self.postMessage({ op: "event", event: { type: "error", message: "the engine in this browser stopped (its Go program exited; the console says why)" } });
  });
  if (!self.webdraft) throw new Error("the engine did not start");

  return fetchModels(man.files);
}

// start loads onto the GPU (opening a device) what mode needs and is not
// loaded: what drafts — the server's EAGLE-3 head where the manifest
// lists one, over the target, else the drafter — and, for the live view,
// the target. In edge drafting a head's target computes nothing: it holds
// the features the server sends with each draft request (and the
// embedding the head reads).
async function start(files, mode) {
  const head = man.head;
  if (!drafter && !head) drafter = await self.webdraft.loadFiles(files, man.drafter, { kvMiB: 64, maxSequences: 4 });
  if ((mode === "browser" || head) && !target) {
    target = await self.webdraft.loadFiles(files, man.target, { kvMiB: 128, maxSequences: 4, head: head || undefined });
  }
  if (mode === "browser" && !live) live = await self.webdraft.live(target.head || drafter, target, onEvent);
  if (mode === "edge" && !session) {
    const s = (head ? target.head : drafter).session();
    if (!s) throw new Error("the drafter here is closed");
    // A first draft compiles the pipelines (slow on a CPU-rendered
    // adapter), before the page says ready.
    await s.warm();
    session = s;
  }
}

// draft answers an edge run's draft request: the tokens after the context
// the server sent (its new tokens on top of the last request's), drafted
// on the session's sequence, or the error that stopped it.
async function draft(req) {
  let msg;
  try {
    if (!session) throw new Error("the drafter in this browser is not ready (restarting after a GPU fault?)");
    const r = await session.draft(req.tokens, req.reset, req.k, req.features, req.coupled);
    msg = { type: "draft", id: req.id, tokens: r.tokens, draft_ms: r.ms };
  } catch (err) {
    msg = { type: "draft", id: req.id, error: String(err && err.message ? err.message : err) };
    if (err && err.fault) recover(msg.error).catch(failed);
  }
  self.postMessage({ op: "draft", message: msg });
}

function onEvent(text) {
  const e = JSON.parse(text);
  if (e.type === "fault") {
    recover(e.message).catch(failed);
    return;
  }
  event(e);
}

// recover starts the engine again after a fault — the GPU device lost, a
// GPU error — on a new device, with the models from Cache Storage (no
// download): the loop that met the fault has ended, and its engines with it.
async function recover(message) {
  if (recovering) return;
  recovering = true;
  const t0 = performance.now();
  faults++;
  const old = live;
  live = session = drafter = target = null;
  self.postMessage({ op: "fault", message });
  if (old) await old.close();
  await self.webdraft.reset();
  const { files } = await fetchModels(man.files);
  for (const mode of Object.keys(modes)) await start(files, mode);
  recovering = false;
  self.postMessage({ op: "recovered", seconds: (performance.now() - t0) / 1000, faults });
}

async function json(url) {
  const r = await fetch(url, { headers });
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r.json();
}

// fetchModels returns every file of the manifest by path, from the cache
// when it holds the file's hash, else downloaded (with progress) and kept.
async function fetchModels(list) {
  const cache = await self.caches.open(CACHE);
  const total = list.reduce((n, f) => n + f.size, 0);
  const files = {};
  let done = 0, downloaded = 0, cached = 0;
  for (const f of list) {
    const key = `/models/${f.path}?sha256=${f.sha256}`;
    let bytes = null;
    const hit = await cache.match(key);
    if (hit) {
      bytes = new Uint8Array(await hit.arrayBuffer());
      if ((await sha256(bytes)) !== f.sha256) {
        await cache.delete(key);
        bytes = null;
      } else {
        cached += bytes.length;
      }
    }
    if (!bytes) {
      bytes = await download(key, f, (n) => progress(done + n, total, f.path, false));
      if ((await sha256(bytes)) !== f.sha256) throw new Error(`${f.path}: the download does not have the hash the server announced`);
      await cache.put(key, new Response(bytes, { headers: { "Content-Type": "application/octet-stream" } }));
      downloaded += bytes.length;
    }
    done += f.size;
    progress(done, total, f.path, !!hit);
    files[f.path] = bytes;
  }
  return { files, downloaded, cached };
}

function progress(done, total, file, cached) {
  self.postMessage({ op: "progress", done, total, file, cached });
}

async function download(url, f, onBytes) {
  const r = await fetch(url, { headers });
  if (!r.ok || !r.body) throw new Error(`${url}: HTTP ${r.status}`);
  const out = new Uint8Array(f.size);
  const reader = r.body.getReader();
  let n = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    if (n + value.length > out.length) throw new Error(`${f.path}: longer than the ${f.size} bytes announced`);
    out.set(value, n);
    n += value.length;
    onBytes(n);
  }
  if (n !== f.size) throw new Error(`${f.path}: ${n} bytes, ${f.size} announced`);
  return out;
}

async function sha256(bytes) {
  const d = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return Array.from(d, (b) => b.toString(16).padStart(2, "0")).join("");
}

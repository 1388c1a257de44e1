// calls.cjs: where a step's host time goes among the WebGPU calls the
// engine makes (harness.cjs engine --calls), and what the same calls cost
// with no Go program behind them (--replay): one step's calls captured —
// their receivers, arguments and the bytes they wrote — and made again
// from JavaScript alone, the floor of any recording the engine could do
// short of the GPU's time (WebGPU has no compute bundles: every replay
// encodes its passes anew, as the engine does).
"use strict";

const now = () => performance.now();

// The methods timed, by class (dawn.node's globals name the classes; an
// instance's prototype is its class's).
const methods = {
  GPUDevice: ["createCommandEncoder", "createBindGroup", "createBuffer", "pushErrorScope", "popErrorScope"],
  GPUQueue: ["submit", "writeBuffer", "onSubmittedWorkDone"],
  GPUCommandEncoder: ["beginComputePass", "copyBufferToBuffer", "clearBuffer", "finish"],
  GPUComputePassEncoder: ["setPipeline", "setBindGroup", "dispatchWorkgroups", "end"],
  GPUBuffer: ["mapAsync", "getMappedRange", "unmap"],
};

// Objects a replay must make anew: each call that made one is made again,
// and later calls on it or naming it take the new one.
const fresh = new Set(["GPUDevice.createCommandEncoder", "GPUCommandEncoder.beginComputePass", "GPUCommandEncoder.finish"]);

class Calls {
  constructor() {
    this.timing = false;
    this.stats = new Map(); // "Class.method" → {n, ms}
    this.trace = null; // while capturing: the calls in order
    this.waitMs = 0; // time from mapAsync to its promise settling
  }

  // install wraps each method on its class's prototype, until uninstall:
  // a wrapped call costs a little even when not timed.
  install(globals) {
    const self = this;
    this.originals = [];
    for (const [cls, names] of Object.entries(methods)) {
      const proto = globals[cls] && globals[cls].prototype;
      if (!proto) throw new Error(`calls: dawn.node has no ${cls}`);
      for (const m of names) {
        const orig = proto[m];
        if (typeof orig !== "function") throw new Error(`calls: ${cls}.${m} is not a method`);
        const key = `${cls}.${m}`;
        this.originals.push([proto, m, orig]);
        proto[m] = function (...args) {
          if (!self.timing && !self.trace) return orig.apply(this, args);
          const t = now();
          const r = orig.apply(this, args);
          const t1 = now();
          if (self.timing) {
            const s = self.stats.get(key) || { n: 0, ms: 0 };
            s.n++;
            s.ms += t1 - t;
            self.stats.set(key, s);
            if (m === "mapAsync") r.then(() => { self.waitMs += now() - t1; }, () => {});
          }
          if (self.trace) self.trace.push({ key, fn: orig, recv: this, args: copyArgs(key, args), result: r });
          return r;
        };
      }
    }
  }

  // uninstall puts the methods back.
  uninstall() {
    for (const [proto, m, orig] of this.originals || []) proto[m] = orig;
    this.originals = [];
  }

  // measure times the calls of what run does (an async function) and
  // returns the totals divided by per.
  async measure(run, per) {
    this.stats.clear();
    this.waitMs = 0;
    this.timing = true;
    const t = now();
    try {
      await run();
    } finally {
      this.timing = false;
    }
    const totalMs = now() - t;
    const calls = {};
    let inCalls = 0;
    for (const [k, s] of [...this.stats].sort((a, b) => b[1].ms - a[1].ms)) {
      calls[k] = { n: round(s.n / per, 1), us: round((1000 * s.ms) / per, 1) };
      inCalls += s.ms;
    }
    return {
      ms: round(totalMs / per), in_calls_ms: round(inCalls / per), map_wait_ms: round(this.waitMs / per),
      // the rest: the Go program (recording, params, bind-group cache),
      // syscall/js, the replay function's own JavaScript, promise settling
      outside_ms: round((totalMs - inCalls - this.waitMs) / per), calls,
    };
  }

  // capture records the WebGPU calls of what run does.
  async capture(run) {
    this.trace = [];
    try {
      await run();
      return this.trace;
    } finally {
      this.trace = null;
    }
  }
}

// copyArgs keeps a call's arguments for a replay: written bytes are
// copied (they are views of the Go program's memory, which moves on).
function copyArgs(key, args) {
  if (key === "GPUQueue.writeBuffer") {
    const [buf, off, data, dataOff = 0, size] = args;
    const end = size === undefined ? undefined : dataOff + size;
    return [buf, off, data.slice(dataOff, end)];
  }
  if (key === "GPUComputePassEncoder.setBindGroup" && args.length > 2) {
    const [i, group, offs, start = 0, n] = args;
    return [i, group, Array.from(offs.slice(start, n === undefined ? undefined : start + n))];
  }
  return args.slice();
}

// replay makes a captured trace's calls again, rounds times, from
// JavaScript alone, and returns the milliseconds a round. A mapping is
// awaited where it was made (the engine reads what it maps at once); other
// promises (error scopes, work done) are awaited at the end of a round.
async function replay(trace, rounds) {
  const run = async () => {
    const made = new Map(); // captured object → this round's
    const pending = [];
    const sub = (x) => (made.has(x) ? made.get(x) : Array.isArray(x) ? x.map(sub) : x);
    for (const c of trace) {
      const r = c.fn.apply(sub(c.recv), c.args.map(sub));
      if (fresh.has(c.key)) made.set(c.result, r);
      else if (c.key === "GPUBuffer.mapAsync") await r;
      else if (r && typeof r.then === "function") pending.push(r);
    }
    await Promise.all(pending);
  };
  await run(); // warm
  const t = now();
  for (let i = 0; i < rounds; i++) await run();
  return (now() - t) / rounds;
}

// summary counts a trace's calls by method.
function census(trace) {
  const n = {};
  for (const c of trace) n[c.key] = (n[c.key] || 0) + 1;
  return n;
}

const round = (x, d = 3) => Math.round(x * 10 ** d) / 10 ** d;

module.exports = { Calls, replay, census };

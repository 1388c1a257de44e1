// webdraft's live page: one websocket to the server (protocol in
// web/README.md), the text drawn step by step with each token's mark, a
// tree run's token trees (a folded list, a step each), and the panels (τ,
// the histograms, the step times, the race) drawn as SVG.
"use strict";

(() => {
  const config = JSON.parse(document.getElementById("config").textContent);
  const $ = (id) => document.getElementById(id);
  const svgNS = "http://www.w3.org/2000/svg";
  if (!config.target) return;

  const out = $("output"), alone = $("alone"), tip = $("tip"), status = $("status");
  const form = $("controls"), startBtn = $("start"), stopBtn = $("stop");

  let ws = null;
  let run = null; // the statistics of the current speculative run
  let tokens = []; // the output's token spans, in order, for the keyboard
  let active = -1;
  let frame = 0; // the animation frame that paints what the messages changed
  let charts = false; // whether that frame redraws the speculative run's panels too

  // ---- the websocket

  function connect() {
    const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws";
    const protocols = ["webdraft"];
    const key = $("api_key");
    if (key && key.value) protocols.push("webdraft.bearer." + key.value);
    ws = new WebSocket(url, protocols);
    ws.onopen = () => setStatus("connected");
    ws.onclose = () => {
      setStatus("disconnected: reload the page to reconnect", true);
      running(false);
      ws = null;
    };
    ws.onmessage = (ev) => handle(JSON.parse(ev.data));
  }

  function wsSend(msg) {
    if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(msg));
  }

  function send(msg) {
    const mode = where();
    if (mode === "browser") {
      if (engine.ready.browser) engine.worker.postMessage({ op: "send", message: msg });
      return;
    }
    if (mode === "edge" && msg.type === "start") {
      if (!engine.ready.edge) {
        setStatus("the drafter in this browser is not ready yet", true);
        running(false);
        return;
      }
      msg.edge = true; // the server verifies, this browser drafts (draft_request ↔ draft)
      if (engine.edgeHead) msg.edge_head = true; // … with the server's EAGLE-3 head: the requests carry the target's features
    }
    if (!ws || ws.readyState !== WebSocket.OPEN) {
      connect();
      ws.addEventListener("open", () => ws.send(JSON.stringify(msg)), { once: true });
      return;
    }
    ws.send(JSON.stringify(msg));
  }

  // ---- the engine in this browser (worker.js): the same messages as the
  // websocket's, over postMessage, from the same live view.

  // ready: the modes the worker runs, browser (both models, the live
  // view) and edge (the drafter alone, for the server's target).
  const engine = { worker: null, ready: {}, info: null, log: [] };
  window.webdraftEngineLog = engine.log;
  // A fault drill for the engine in this browser: its GPU device is lost,
  // and the worker must start it again (the browser test calls it).
  window.webdraftLoseDevice = () => engine.worker && engine.worker.postMessage({ op: "lose-device" });
  const where = () => (document.querySelector('input[name="where"]:checked') || {}).value || "server";

  // showMode names where the models run and, once known, on which adapter.
  function showMode() {
    const a = engine.info ? engine.info.adapter : "WebGPU";
    $("mode-name").textContent = {
      server: "the server",
      browser: "this browser · " + a,
      edge: "edge · drafting on " + a + ", verifying on the server",
    }[where()];
    $("network").hidden = where() !== "edge";
  }

  function startEngine(mode) {
    const box = $("engine"), bar = $("engine-progress"), note = $("engine-note");
    box.hidden = false;
    if (engine.worker) {
      if (!engine.ready[mode]) {
        startBtn.disabled = true;
        note.textContent = mode === "edge" ? "starting the drafter…" : "loading the target too…";
        engine.worker.postMessage({ op: "init", key: apiKey(), mode });
      }
      return;
    }
    startBtn.disabled = true;
    note.textContent = "starting the engine…";
    const w = new Worker(document.getElementById("app").dataset.worker);
    engine.worker = w;
    w.onmessage = (ev) => {
      const m = ev.data;
      switch (m.op) {
        case "progress":
          bar.max = m.total;
          bar.value = m.done;
          note.textContent = (m.cached ? "from this browser's cache: " : "downloading ") + m.file + " · " +
            (m.done / 1048576).toFixed(1) + " of " + (m.total / 1048576).toFixed(1) + " MiB";
          break;
        case "ready":
          engine.ready[m.mode] = true;
          engine.info = m;
          if (m.mode === "edge") engine.edgeHead = !!m.head;
          bar.value = bar.max;
          document.body.dataset.engine = "ready";
          note.textContent = (m.mode === "edge" ? "drafter ready on " : "ready on ") + m.adapter + " in " + m.seconds.toFixed(1) + " s (" +
            (m.downloaded ? (m.downloaded / 1048576).toFixed(1) + " MiB downloaded" : "models from this browser's cache") + ")" +
            (m.head ? "; the EAGLE-3 head " + m.head + " drafts, reading the target's hidden states" +
              (m.mode === "edge" ? " (the server sends them with each draft request)" : "") : "");
          startBtn.disabled = false;
          showMode();
          break;
        case "draft":
          // The drafter's answer to an edge run's draft_request: up the
          // websocket (dropped if it closed meanwhile: the run has ended).
          wsSend(m.message);
          break;
        case "event":
          // What the engine here sent, as the server keeps a session's
          // events (GET /sessions/{id}/events): the last 4,096.
          engine.log.push(m.event);
          if (engine.log.length > 4096) engine.log.shift();
          handle(m.event);
          break;
        case "fault":
          // The GPU failed under the engine (a lost device): the worker
          // starts it again on a new device, from the cached models.
          engine.wasReady = engine.ready;
          engine.ready = {};
          engine.faults = (engine.faults || 0) + 1;
          document.body.dataset.engine = "recovering";
          note.textContent = "The GPU failed (" + m.message + "): restarting the engine in this browser…";
          running(false);
          startBtn.disabled = true;
          break;
        case "recovered":
          engine.ready = engine.wasReady || {};
          document.body.dataset.engine = "ready";
          note.textContent = "The engine restarted after a GPU fault in " + m.seconds.toFixed(1) + " s; ready on " + engine.info.adapter + ".";
          startBtn.disabled = false;
          break;
        case "failed":
          engine.worker = null;
          w.terminate();
          document.body.dataset.engine = "failed";
          note.textContent = "This browser cannot run the engine: " + m.message + ". Running on the server instead.";
          $("where-server").checked = true;
          startBtn.disabled = false;
          showMode();
          break;
      }
    };
    w.onerror = (ev) => {
      ev.preventDefault();
      w.onmessage({ data: { op: "failed", message: ev.message || "the worker failed" } });
    };
    w.postMessage({ op: "init", key: apiKey(), mode });
  }

  function apiKey() {
    const key = $("api_key");
    return key ? key.value : "";
  }

  for (const r of document.querySelectorAll('input[name="where"]')) {
    r.addEventListener("change", () => {
      const mode = where();
      if (mode !== "server") startEngine(mode);
      else $("engine").hidden = !document.body.dataset.engine;
      showMode();
      checkShape();
    });
  }

  function setStatus(text, error) {
    status.textContent = text;
    status.classList.toggle("error", !!error);
  }

  function running(on) {
    startBtn.disabled = on;
    stopBtn.disabled = !on;
  }

  // ---- the controls

  const num = (id) => Number($(id).value);

  // checkShape says, on the topk field, that edge drafting drafts chains
  // (the server refuses a tree there); N applies to trees alone.
  function checkShape() {
    const tree = num("topk") > 1;
    $("draft_tokens").disabled = !tree;
    $("topk").setCustomValidity(tree && where() === "edge" ? "Edge drafting drafts chains: set b = 1." : "");
  }
  $("topk").addEventListener("input", checkShape);

  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    checkShape();
    if (!form.reportValidity()) return;
    reset();
    const msg = {
      type: "start",
      prompt: $("prompt").value,
      chat: $("chat").checked,
      k: num("k"),
      max_tokens: num("max_tokens"),
      temperature: num("temperature"),
      top_p: 1,
      seed: num("seed"),
      race: $("race").checked,
      topk: num("topk"),
    };
    if (msg.topk > 1) msg.draft_tokens = num("draft_tokens");
    send(msg);
    running(true);
    setStatus("running…");
  });

  stopBtn.addEventListener("click", () => send({ type: "stop" }));

  // The note on the CPU engine stands under a run whose target runs on the
  // server's CPU engine (the server's mode and edge drafting); the note on
  // the GPU under one whose target runs on WebGPU: the server's, or this
  // browser's.
  let serverBackend = "";
  function backendNotes() {
    const browser = where() === "browser";
    $("cpu-note").hidden = browser || (serverBackend !== "cpu" && serverBackend !== "reference");
    $("gpu-note").hidden = !browser && serverBackend !== "webgpu";
  }

  function reset() {
    backendNotes();
    out.textContent = "";
    alone.textContent = "";
    hideTip();
    tokens = [];
    active = -1;
    $("tree-list").textContent = "";
    $("trees").hidden = true;
    treeSteps.clear();
    showTreeRun(false);
    run = { k: Number($("k").value), steps: 0, emitted: 0, drafted: 0, accepted: 0, hist: [], reached: [], acc: [], draftMs: [], verifyMs: [], networkMs: [], fused: 0, chained: 0 };
    race.spec = race.alone = race.same = null;
    race.maxTokens = Number($("max_tokens").value);
    out._pinned = alone._pinned = 0;
    paintNow();
  }

  // ---- the messages

  function handle(m) {
    switch (m.type) {
      case "draft_request":
        // Edge drafting: the server asks this browser's drafter for the
        // next draft; the worker answers (its "draft" above).
        if (engine.worker && engine.ready.edge) engine.worker.postMessage({ op: "draft", request: m });
        else wsSend({ type: "draft", id: m.id, error: "this browser's drafter is not running" });
        break;
      case "hello":
        if (m.adapter) {
          setStatus("in this browser · " + m.adapter);
          break;
        }
        document.body.dataset.session = m.session;
        setStatus("connected · session " + m.session);
        serverBackend = m.backend;
        backendNotes();
        break;
      case "warming":
        setStatus("warming up: both runs once, untimed, for the race…");
        break;
      case "start":
        if (m.run === "speculative") showTreeRun(m.topk > 1);
        if (m.run === "target") setStatus("the target alone, for the race…");
        else if (m.edge) setStatus("edge drafting: drafting on " + (engine.info ? engine.info.adapter : "this browser") + ", verifying on the server…");
        break;
      case "step":
        if (m.run === "target") aloneStep(m);
        else step(m);
        break;
      case "done":
        done(m);
        break;
      case "race":
        race.speedup = m.speedup;
        race.same = m.same_tokens;
        paintNow();
        break;
      case "finished":
        paintNow();
        running(false);
        setStatus("done · session " + document.body.dataset.session);
        break;
      case "stopped":
        paintNow();
        running(false);
        setStatus("stopped");
        break;
      case "error":
        paintNow();
        running(false);
        setStatus(m.message, true);
        break;
    }
  }

  // step draws one verification: the accepted draft tokens, then the
  // rejected rest of the draft, then the target's own token. A tree
  // step's draft is its accepted path and the drafter's best verified
  // continuation below it, drawn the same; its tree goes to the list.
  function step(m) {
    const d = m.tree ? treeDraft(m) : m.draft, a = m.accepted;
    m.tokens.forEach((t, i) => {
      if (i === a && a < d.length) {
        d.slice(a).forEach((dt, j) => addToken(out, dt.text, "rej", m.step, { draft: dt, target: j === 0 ? t : null }));
      }
      const kind = t.drafted ? "acc" : d.length === 0 ? "own" : a < d.length ? "fix" : "bonus";
      addToken(out, t.text, kind, m.step, { draft: i < d.length ? d[i] : null, target: t });
    });
    if (m.tree) addTreeStep(m);
    const r = run;
    r.steps++;
    r.emitted += m.tokens.length;
    if (d.length > 0) {
      // A tree's draft tokens are the nodes the target verified.
      r.drafted += m.tree ? m.tree.filter((n) => n.verified).length : d.length;
      r.accepted += a;
      r.hist[a] = (r.hist[a] || 0) + 1;
      for (let i = 0; i < Math.min(a + 1, d.length); i++) r.reached[i] = (r.reached[i] || 0) + 1;
      for (let i = 0; i < a; i++) r.acc[i] = (r.acc[i] || 0) + 1;
    }
    // A fused step's drafter time is inside its target time.
    if (m.fused) r.fused++;
    if (m.chained) r.chained++;
    else r.draftMs.push(m.draft_ms);
    r.verifyMs.push(m.verify_ms);
    if (m.network_ms !== undefined) r.networkMs.push(m.network_ms);
    race.spec = { tokens: r.emitted, seconds: null };
    paint(true);
  }

  function aloneStep(m) {
    for (const t of m.tokens) addToken(alone, t.text, "plain", m.step, { target: t });
    race.alone = { tokens: (race.alone ? race.alone.tokens : 0) + m.tokens.length, seconds: null };
    paint(false);
  }

  function done(m) {
    const r = { tokens: m.tokens, seconds: m.seconds, tps: m.tokens_per_s };
    if (m.run === "target") race.alone = r;
    else {
      race.spec = r;
      run.tau = m.tau; // the server's, over the whole run
    }
    paintNow();
  }

  // ---- tokens and their tips

  function visible(text) {
    return text.replace(/\n/g, "⏎").replace(/\t/g, "⇥").replace(/ /g, "·") || "∅";
  }

  function addToken(into, text, kind, stepNo, info) {
    const span = document.createElement("span");
    span.className = "tok " + kind;
    span.textContent = text;
    span.dataset.kind = kind;
    span.dataset.step = stepNo;
    const labels = { acc: "accepted draft token", rej: "rejected draft token", fix: "the target's correction", bonus: "the target's bonus token", own: "the target's token", plain: "token" };
    span.setAttribute("aria-label", labels[kind] + " " + visible(text));
    span.tabIndex = -1;
    span._info = info;
    if (into === out) {
      span._index = tokens.length;
      tokens.push(span);
      span.addEventListener("mouseenter", () => showTip(span));
      span.addEventListener("mouseleave", hideTip);
      span.addEventListener("click", () => openTree(stepNo));
    }
    into.appendChild(span);
  }

  // table lists a model's top tokens, the chosen one (tok) in bold; a
  // sampled run may choose a token outside them, listed after them as
  // drawn.
  function table(title, top, tok) {
    if (!top || top.length === 0) return "";
    title = title.replace("%n", top.length);
    const row = (c, cls, note) => "<tr" + cls + "><td>" + escapeHTML(visible(c.text)) + note + "</td><td class=\"p\">" + (100 * c.p).toFixed(1) + " %</td></tr>";
    let h = "<h4>" + title + "</h4><table>";
    for (const c of top) h += row(c, c.id === tok.id ? ' class="chosen"' : "", "");
    if (!top.some((c) => c.id === tok.id) && tok.text !== undefined) h += row(tok, ' class="chosen drawn"', ' <span class="note">(drawn)</span>');
    return h + "</table>";
  }

  function escapeHTML(s) {
    return s.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
  }

  function showTip(span) {
    const info = span._info;
    let h = "";
    if (info.draft) h += table(info.draft.branches ? "drafter's top %n (the tree's branches here)" : "drafter's top %n", info.draft.top, info.draft);
    if (info.target) h += table("target's top 5", info.target.top, info.target);
    if (!h) h = "<p>no alternatives recorded for this token" + (where() === "browser" ? " (a run in this browser reads out the chosen tokens only: the top 5 are slow to read out on a GPU a CPU renders)" : "") + "</p>";
    tip.innerHTML = h;
    tip.hidden = false;
    const box = span.getBoundingClientRect(), view = tip.parentElement.getBoundingClientRect();
    const left = Math.max(8, Math.min(box.left - view.left, view.width - tip.offsetWidth - 8));
    tip.style.left = left + "px";
    tip.style.top = box.bottom - view.top + 6 + "px";
  }

  function hideTip() {
    tip.hidden = true;
  }

  function activate(i) {
    if (tokens.length === 0) return;
    if (active >= 0 && tokens[active]) tokens[active].classList.remove("active");
    active = Math.max(0, Math.min(i, tokens.length - 1));
    const span = tokens[active];
    span.classList.add("active");
    span.scrollIntoView({ block: "nearest" });
    showTip(span);
  }

  out.addEventListener("keydown", (ev) => {
    const moves = { ArrowRight: active + 1, ArrowLeft: active - 1, Home: 0, End: tokens.length - 1 };
    if (ev.key in moves) {
      ev.preventDefault();
      activate(moves[ev.key]);
    } else if (ev.key === "Enter" && active >= 0 && treeSteps.has(Number(tokens[active].dataset.step))) {
      ev.preventDefault();
      enterDown = true;
    } else if (ev.key === "Escape") {
      hideTip();
    }
  });
  // Enter on a token of a tree step opens its tree when the key comes up:
  // the focus moves to the tree's line then, after the keystroke, which
  // would otherwise fold it again.
  let enterDown = false;
  out.addEventListener("keyup", (ev) => {
    if (ev.key === "Enter" && enterDown && active >= 0) openTree(Number(tokens[active].dataset.step));
    enterDown = false;
  });
  out.addEventListener("focus", () => { if (active < 0) activate(0); else activate(active); });
  out.addEventListener("blur", hideTip);
  window.addEventListener("resize", hideTip);

  // ---- token trees: a step each, folded (a <details>), drawn when first
  // opened as nested lists — under each node its verified children, then
  // its pruned ones folded apart; marks in text (✓ ✗ ○ ◆), not colour alone.

  const treeSteps = new Map(); // step number → its <details>

  // showTreeRun names the rates panel by depth in a tree run (a node's
  // depth is its draft position) and shows the trees' list.
  function showTreeRun(tree) {
    $("rates-title").textContent = tree ? "Acceptance by depth" : "Acceptance by draft position";
    $("rates").setAttribute("aria-label", tree ? "acceptance rate at each depth of the token tree" : "acceptance rate at each draft position");
    $("trees").hidden = !tree;
  }

  // treeDraft is a tree step's draft, each token with the drafter's
  // alternatives at its place: its siblings in the tree (the tree's nodes
  // carry no top of their own).
  function treeDraft(m) {
    const t = m.tree;
    let at = -1;
    return m.draft.map((dt) => {
      const i = t.findIndex((n) => n.parent === at && n.verified && n.id === dt.id);
      at = i;
      if (i < 0 || (dt.top && dt.top.length)) return dt;
      const top = t.filter((n) => n.parent === t[i].parent).sort((x, y) => y.p - x.p).slice(0, 5).map((n) => ({ id: n.id, text: n.text, p: n.p }));
      return Object.assign({}, dt, { top, branches: true });
    });
  }

  // ownToken is the target's token after a step's accepted path (none
  // where a stop or max_tokens cut the step there), and its kind.
  function ownToken(m) {
    const t = m.tokens[m.accepted];
    if (!t || t.drafted) return null;
    return { token: t, kind: m.draft.length > m.accepted ? "fix" : "bonus" };
  }

  function mark(kind) {
    const marks = {
      acc: ["✓", "accepted"],
      rej: ["✗", "verified, not accepted"],
      pruned: ["○", "pruned, never verified"],
      fix: ["◆", "the target's correction"],
      bonus: ["◆", "the target's bonus token"],
    };
    const s = document.createElement("span");
    s.className = "mark " + (kind === "fix" || kind === "bonus" ? "own " + kind : kind);
    s.textContent = marks[kind][0];
    s.setAttribute("role", "img");
    s.setAttribute("aria-label", marks[kind][1]);
    s.title = marks[kind][1];
    return s;
  }

  function percent(p) {
    return p >= 0.001 ? (100 * p).toFixed(1) + " %" : "<0.1 %";
  }

  function textSpan(cls, text) {
    const s = document.createElement("span");
    s.className = cls;
    s.textContent = text;
    return s;
  }

  function addTreeStep(m) {
    const t = m.tree, own = ownToken(m);
    const verified = t.filter((n) => n.verified).length;
    const det = document.createElement("details");
    det.className = "tree-step";
    det.dataset.step = m.step;
    det._step = m;
    const sum = document.createElement("summary");
    sum.append(textSpan("sstep", "step " + m.step), " · " + m.accepted + " accepted");
    const path = t.filter((n) => n.accepted).map((n) => visible(n.text)).join("");
    if (path) sum.append(" ", mark("acc"), " ", textSpan("spath acc", path));
    if (own) sum.append(" ", mark(own.kind), " ", textSpan("spath", visible(own.token.text)));
    sum.append(" ", textSpan("scount", "· " + verified + " of " + t.length + " nodes verified"));
    det.appendChild(sum);
    det.addEventListener("toggle", () => drawTree(det));
    treeSteps.set(m.step, det);
    const list = $("tree-list");
    const atEnd = list.scrollHeight - list.scrollTop - list.clientHeight < 40;
    list.appendChild(det);
    if (atEnd) list.scrollTop = list.scrollHeight;
  }

  // drawTree fills a step's <details> the first time it opens.
  function drawTree(det) {
    if (!det.open || det._drawn) return;
    det._drawn = true;
    const m = det._step, t = m.tree, own = ownToken(m);
    const kids = new Map(); // parent index (−1: the context) → children, the drafter's order
    t.forEach((n, i) => {
      if (!kids.has(n.parent)) kids.set(n.parent, []);
      kids.get(n.parent).push(i);
    });
    let last = -1; // the accepted path's last node
    t.forEach((n, i) => { if (n.accepted) last = i; });
    const item = (i, pruned) => {
      const n = t[i], kind = n.accepted ? "acc" : n.verified ? "rej" : "pruned";
      const li = document.createElement("li");
      li.className = "node " + kind;
      const row = document.createElement("span");
      row.className = "nrow";
      row.title = "depth " + n.depth + " · drafter " + percent(n.p);
      row.append(mark(kind), " ", textSpan("ntext", visible(n.text)), " ", textSpan("np", percent(n.p)));
      li.appendChild(row);
      if (kids.has(i) || i === last) li.appendChild(level(i, pruned));
      return li;
    };
    // level lists parent's children: the target's own token where the
    // path ends, the verified children, then the pruned ones folded
    // (inside a pruned branch everything is pruned: no fold again).
    const level = (parent, inPruned) => {
      const ul = document.createElement("ul");
      if (parent === last && own) {
        const li = document.createElement("li");
        li.className = "node own " + own.kind;
        const row = document.createElement("span");
        row.className = "nrow";
        row.append(mark(own.kind), " ", textSpan("ntext", visible(own.token.text)), " ", textSpan("np", own.kind === "fix" ? "correction" : "bonus"));
        li.appendChild(row);
        ul.appendChild(li);
      }
      const ch = kids.get(parent) || [];
      const pruned = inPruned ? [] : ch.filter((i) => !t[i].verified);
      for (const i of ch) if (inPruned || t[i].verified) ul.appendChild(item(i, inPruned));
      if (pruned.length) {
        const li = document.createElement("li");
        li.className = "node pruned-group";
        const fold = document.createElement("details");
        fold.className = "pruned";
        const s = document.createElement("summary");
        s.append(mark("pruned"), " " + pruned.length + " pruned " + (pruned.length === 1 ? "branch" : "branches"));
        fold.appendChild(s);
        const inner = document.createElement("ul");
        for (const i of pruned) inner.appendChild(item(i, true));
        fold.appendChild(inner);
        li.appendChild(fold);
        ul.appendChild(li);
      }
      return ul;
    };
    const root = level(-1, false);
    root.className = "tree";
    root.setAttribute("aria-label", "step " + m.step + "'s token tree");
    det.appendChild(root);
  }

  // openTree opens a step's tree and moves the focus there; false when
  // the step has none (a chain step).
  function openTree(stepNo) {
    const det = treeSteps.get(stepNo);
    if (!det) return false;
    det.open = true;
    drawTree(det);
    const sum = det.querySelector("summary");
    sum.focus({ preventScroll: true });
    det.scrollIntoView({ block: "nearest" });
    return true;
  }

  // ---- the panels

  const race = { spec: null, alone: null, speedup: null, same: null, maxTokens: 128 };

  // paint asks for the panels to be drawn at the next animation frame:
  // messages arrive a step or a token at a time, and redrawing the
  // histograms and the time plot, and laying the text out to follow it,
  // for each would take the CPU from the server's race on a small machine
  // (in headless Chromium beside the CPU engine on 2 cores, the page's main
  // thread worked about 40 % less a 128-token race than when it drew every
  // message). A frame paints whatever arrived since the one before: the
  // race and the text's end, and the panels where the speculative run
  // changed them (withCharts).
  function paint(withCharts) {
    charts ||= withCharts;
    if (!frame) frame = requestAnimationFrame(() => {
      frame = 0;
      if (charts) draw();
      else drawRace();
      charts = false;
      follow(out);
      follow(alone);
    });
  }

  // paintNow draws the panels at once (a run's end, a reset), the frame
  // asked for no longer needed.
  function paintNow() {
    if (frame) cancelAnimationFrame(frame);
    frame = 0;
    charts = false;
    draw();
    follow(out);
    follow(alone);
  }

  // follow keeps a text's end in view while it grows, unless the reader
  // scrolled up from where the last paint left it.
  function follow(into) {
    if (into.scrollTop >= (into._pinned || 0) - 1 || into.scrollHeight - into.scrollTop - into.clientHeight < 80) {
      into.scrollTop = into.scrollHeight;
    }
    into._pinned = into.scrollTop;
  }

  function draw() {
    const r = run;
    $("steps").textContent = r.steps;
    $("accepted").textContent = r.accepted;
    $("drafted").textContent = r.drafted;
    $("tau").textContent = r.tau !== undefined ? r.tau.toFixed(2) : r.steps ? (r.emitted / r.steps).toFixed(2) : "–";
    const hist = [];
    for (let a = 0; a <= r.k; a++) hist.push(r.hist[a] || 0);
    bars($("hist"), hist, hist.map((_, a) => String(a)), Math.max(1, ...hist), (v) => String(v), r.k);
    const rates = [];
    for (let i = 0; i < r.k; i++) rates.push(r.reached[i] ? (r.acc[i] || 0) / r.reached[i] : 0);
    bars($("rates"), rates, rates.map((_, i) => String(i + 1)), 1, (v, i) => (r.reached[i] ? Math.round(100 * v) + "%" : ""), -1);
    const mean = (xs) => (xs.length ? xs.reduce((s, x) => s + x, 0) / xs.length : NaN);
    $("draft_ms").textContent = r.draftMs.length ? mean(r.draftMs).toFixed(2) : "–";
    $("fused-note").hidden = r.fused === 0;
    $("chained-note").hidden = r.chained === 0;
    $("verify_ms").textContent = r.steps ? mean(r.verifyMs).toFixed(2) : "–";
    $("network_ms").textContent = r.networkMs.length ? mean(r.networkMs).toFixed(2) : "–";
    const series = [r.draftMs.slice(-80), r.verifyMs.slice(-80)], classes = ["draft", "verify"];
    if (r.networkMs.length) {
      series.push(r.networkMs.slice(-80));
      classes.push("network");
    }
    lines($("times"), series, classes);
    drawRace();
  }

  function clear(svg) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
  }

  function el(svg, name, attrs, text) {
    const e = document.createElementNS(svgNS, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    svg.appendChild(e);
    return e;
  }

  // bars draws values as labelled bars; the bar at index full (the whole
  // draft accepted) is marked apart.
  function bars(svg, values, labels, top, fmt, full) {
    clear(svg);
    const W = 320, H = 140, base = H - 18, n = values.length, w = (W - 10) / Math.max(n, 1);
    el(svg, "line", { class: "axis", x1: 5, x2: W - 5, y1: base, y2: base });
    values.forEach((v, i) => {
      const h = (base - 16) * (v / top), x = 5 + i * w;
      el(svg, "rect", { class: i === full ? "bar all" : "bar", x: x + w * 0.12, y: base - h, width: w * 0.76, height: Math.max(h, 0) });
      el(svg, "text", { x: x + w / 2, y: H - 4, "text-anchor": "middle" }, labels[i]);
      const t = fmt(v, i);
      if (t) el(svg, "text", { x: x + w / 2, y: base - h - 3, "text-anchor": "middle" }, t);
    });
  }

  function lines(svg, series, classes) {
    clear(svg);
    const W = 320, H = 90, top = Math.max(0.001, ...series.flat());
    el(svg, "line", { class: "axis", x1: 0, x2: W, y1: H - 12, y2: H - 12 });
    series.forEach((s, k) => {
      if (s.length < 2) return;
      const pts = s.map((v, i) => (i * W) / (s.length - 1) + "," + ((H - 14) - (H - 32) * (v / top))).join(" ");
      el(svg, "polyline", { class: classes[k], points: pts });
    });
    el(svg, "text", { x: 2, y: 10 }, top.toFixed(2) + " ms");
    el(svg, "text", { x: W - 2, y: H - 1, "text-anchor": "end" }, "steps →  drafter ─  target ╌" + (classes.includes("network") ? "  network ┈" : ""));
  }

  function drawRace() {
    const lane = (r, bar, label) => {
      $(bar).style.width = r ? Math.min(100, (100 * r.tokens) / race.maxTokens) + "%" : "0";
      $(label).textContent = r && r.tps ? r.tps.toFixed(1) + " tok/s" : r ? r.tokens + " tokens" : "–";
    };
    lane(race.spec, "bar-spec", "tps-spec");
    lane(race.alone, "bar-alone", "tps-alone");
    $("speedup").textContent = race.speedup ? race.speedup.toFixed(2) + "× speedup" : "–";
    const same = $("race-same");
    same.hidden = race.same === null || race.same === undefined;
    same.textContent = race.same
      ? "Both runs generated the same tokens: the race times the same work."
      : "The runs' tokens differ, so each run times its own text.";
  }

  reset();
  showMode();
  checkShape();
  connect();
})();

#!/usr/bin/env node
// gotest.cjs: runs a Go test binary built for the browser (GOOS=js
// GOARCH=wasm go test -c) in Node with Dawn's navigator.gpu: the kernels'
// and the engine's tests on the GPU through Chrome's WebGPU. It is the
// toolchain's wasm_exec_node.js (go_js_wasm_exec) plus Dawn, and
// globalThis.wasm set before the program runs, as the page sets it.
//
//	cd kernels && node ../lab/dawn/gotest.cjs kernels.test.wasm -test.v
//	GOOS=js GOARCH=wasm go test -exec "node $PWD/lab/dawn/gotest.cjs" ./kernels
//
// Environment: DAWN_NODE (dawn.node; default .gpu/dawn/dawn.node), WASM_EXEC
// (the wasm_exec.js of the Go that built the binary; default the
// toolchain's if go is on PATH, else wasm/dist/files/wasm_exec.js),
// DAWN_FLAGS (Dawn's create() flags, comma-separated).
"use strict";

const fs = require("fs");
const path = require("path");
const { execFileSync } = require("child_process");
const dawn = require("./navigator.cjs");

if (process.argv.length < 3) {
  console.error("usage: gotest.cjs BINARY.wasm [-test.flags …] (in the package's folder)");
  process.exit(2);
}

function wasmExec() {
  if (process.env.WASM_EXEC) return process.env.WASM_EXEC;
  try {
    const goroot = execFileSync("go", ["env", "GOROOT"], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }).trim();
    return path.join(goroot, "lib", "wasm", "wasm_exec.js");
  } catch {
    return path.join(__dirname, "..", "..", "wasm", "dist", "files", "wasm_exec.js");
  }
}

globalThis.require = require;
globalThis.fs = fs; // the test binary reads its testdata through Node's fs
globalThis.path = path;
dawn.install("", (process.env.DAWN_FLAGS || "").split(",").filter(Boolean));
const exec = wasmExec();
if (!fs.existsSync(exec)) {
  console.error(`gotest.cjs: ${exec} not found (set WASM_EXEC to the wasm_exec.js of the Go that built the binary)`);
  process.exit(2);
}
require(exec);

const go = new Go();
go.argv = process.argv.slice(2);
go.env = Object.assign({ TMPDIR: require("os").tmpdir() }, process.env);
go.exit = process.exit;
WebAssembly.instantiate(fs.readFileSync(process.argv[2]), go.importObject).then((result) => {
  globalThis.wasm = result; // the WebGPU binding reads Go memory through it
  process.on("exit", (code) => { // Node exits when no event is pending
    if (code === 0 && !go.exited) {
      // a deadlock: make Go print its error and stacks
      go._pendingEvent = { id: 0 };
      go._resume();
    }
  });
  return go.run(result.instance);
}).catch((err) => {
  console.error(err);
  process.exit(1);
});

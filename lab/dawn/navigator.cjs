// navigator.cjs: WebGPU for Node through Dawn, Chrome's WebGPU
// implementation, as the npm package webgpu ships it (dist/linux-x64/
// dawn.node): installs the WebGPU globals (GPUBufferUsage, …) and
// navigator.gpu, as a browser's worker has them.
"use strict";

const fs = require("fs");
const path = require("path");

// dawnPath is where dawn.node is looked for when no path is given: the
// DAWN_NODE environment variable, else .gpu/dawn/dawn.node in the checkout
// (lab/dawn/pack.sh puts it there).
function dawnPath(given) {
  const p = given || process.env.DAWN_NODE || path.join(__dirname, "..", "..", ".gpu", "dawn", "dawn.node");
  if (!fs.existsSync(p)) {
    throw new Error(`dawn.node not found at ${p}: give --dawn PATH or DAWN_NODE (the npm package webgpu@0.6.2 has it in dist/linux-x64/; lab/dawn/pack.sh dawn fetches it)`);
  }
  return path.resolve(p);
}

// install loads dawn.node and sets globalThis.navigator.gpu; flags go to
// Dawn's create (e.g. "backend=vulkan", "adapter=NAME"). It returns the GPU
// object.
function install(given, flags = []) {
  const p = dawnPath(given);
  let dawn;
  try {
    dawn = require(p);
  } catch (err) {
    throw new Error(`loading ${p}: ${err.message}`);
  }
  Object.assign(globalThis, dawn.globals);
  const gpu = dawn.create(flags);
  if (flags.includes("backend=null")) zeroReads();
  // Node 21+ has a navigator of its own (without gpu); 20 has none.
  Object.defineProperty(globalThis, "navigator", {
    value: { gpu, userAgent: `Node.js ${process.version} with Dawn (${path.basename(p)})` },
    configurable: true, writable: true,
  });
  return gpu;
}

// zeroReads makes Dawn's null backend (backend=null: no GPU, every command
// accepted and dropped) read back zeros rather than whatever its memory
// held, so that the engine runs on it — tokens 0, never a NaN — and the
// host's share of a step (the Go program, syscall/js, Dawn's front end) can
// be timed on a machine without a GPU.
function zeroReads() {
  const get = GPUBuffer.prototype.getMappedRange;
  GPUBuffer.prototype.getMappedRange = function (...args) {
    const range = get.apply(this, args);
    if (this.usage & GPUBufferUsage.MAP_READ) new Uint8Array(range).fill(0);
    return range;
  };
}

// describe says what adapter navigator.gpu gives: its name, features and
// the limits the engine asks for.
async function describe(gpu) {
  const a = await gpu.requestAdapter({ powerPreference: "high-performance" });
  if (!a) return null;
  const info = a.info || {};
  return {
    vendor: info.vendor, architecture: info.architecture, device: info.device, description: info.description,
    features: Array.from(a.features).sort(),
    limits: {
      maxBufferSize: a.limits.maxBufferSize,
      maxStorageBufferBindingSize: a.limits.maxStorageBufferBindingSize,
      maxComputeWorkgroupStorageSize: a.limits.maxComputeWorkgroupStorageSize,
      maxStorageBuffersPerShaderStage: a.limits.maxStorageBuffersPerShaderStage,
      maxComputeInvocationsPerWorkgroup: a.limits.maxComputeInvocationsPerWorkgroup,
      minSubgroupSize: a.info.subgroupMinSize, maxSubgroupSize: a.info.subgroupMaxSize,
    },
  };
}

module.exports = { install, describe, dawnPath };

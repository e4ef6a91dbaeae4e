// Drives the module through the proxy-wasm ABI 0.2.1 in Node's V8, as Envoy drives it for the
// benchmark's provider-header chat request (no control plane), so that `node --cpu-prof` can
// name the wasm functions that run (`./build.sh profile`; bench/README.md, "Where the module's
// own time goes in V8"). Node's V8 is not Envoy's: the shares matter, not the microseconds.
// Usage: node v8_profile.cjs MODULE.wasm [REQUESTS]
'use strict';
const fs = require('fs');
const crypto = require('crypto');

const [modulePath, requestsArg] = process.argv.slice(2);
const REQUESTS = Number(requestsArg || 50000);
const encoder = new TextEncoder();
const PLUGIN_CONFIG = encoder.encode('{"api_keys":["k"],"allowed_custom_hosts":["loopback"],"credentials":{}}');
const decoder = new TextDecoder();

// proxy-wasm's statuses, buffer types and map types (proxy-wasm-cpp-host's numbering).
const OK = 0, NOT_FOUND = 1, CAS_MISMATCH = 8, EMPTY = 7;
const REQUEST_BODY = 0, RESPONSE_BODY = 1, VM_CONFIGURATION = 6, PLUGIN_CONFIGURATION = 7;
const REQUEST_HEADERS = 0, RESPONSE_HEADERS = 2;

let memory, wasm;
const bytes = () => new Uint8Array(memory.buffer);
const view = () => new DataView(memory.buffer);
const text = (ptr, size) => decoder.decode(bytes().subarray(ptr, ptr + size));

/// Hands `data` to the module as the host does: in memory the module allocated.
function give(data, ptrPtr, sizePtr) {
  const ptr = wasm.proxy_on_memory_allocate(data.length);
  bytes().set(data, ptr);
  view().setUint32(ptrPtr, ptr, true);
  view().setUint32(sizePtr, data.length, true);
  return OK;
}

/// A header map in proxy-wasm's wire format: count, the sizes, then each name and value.
function encodeMap(pairs) {
  const encoded = pairs.map(([name, value]) => [encoder.encode(name), encoder.encode(value)]);
  const size = encoded.reduce((sum, [n, v]) => sum + n.length + v.length + 2, 4 + pairs.length * 8);
  const out = new Uint8Array(size);
  const outView = new DataView(out.buffer);
  outView.setUint32(0, pairs.length, true);
  let at = 4;
  for (const [n, v] of encoded) {
    outView.setUint32(at, n.length, true);
    outView.setUint32(at + 4, v.length, true);
    at += 8;
  }
  for (const [n, v] of encoded) {
    out.set(n, at);
    at += n.length + 1;
    out.set(v, at);
    at += v.length + 1;
  }
  return out;
}

function decodeMap(map) {
  const mapView = new DataView(map.buffer, map.byteOffset, map.byteLength);
  const sizes = [];
  let at = 4;
  for (let i = 0; i < mapView.getUint32(0, true); i++, at += 8) {
    sizes.push([mapView.getUint32(at, true), mapView.getUint32(at + 4, true)]);
  }
  return sizes.map(([n, v]) => {
    const pair = [decoder.decode(map.subarray(at, at + n)), decoder.decode(map.subarray(at + n + 1, at + n + 1 + v))];
    at += n + v + 2;
    return pair;
  });
}

// The streams in flight, by context id; maps are kept in wire format, as the module writes them.
let current = 0;
const streams = new Map();
const stream = () => streams.get(current);
const shared = new Map();
let nextCas = 1;
let hostCalls = 0;
const EMPTY_MAP = encodeMap([]);

function editMap(type, edit) {
  const s = stream();
  const key = type === REQUEST_HEADERS ? 'request' : 'response';
  s[key] = encodeMap(edit(decodeMap(s[key])));
  return OK;
}

const env = {
  proxy_log: () => OK,
  proxy_get_log_level: (ptr) => { view().setUint32(ptr, 3, true); return OK; },
  proxy_define_metric: (type, ptr, size, idPtr) => { view().setUint32(idPtr, 1, true); return OK; },
  proxy_increment_metric: () => OK,
  proxy_record_metric: () => OK,
  proxy_set_effective_context: (id) => { current = id; return OK; },
  proxy_get_header_map_pairs: (type, ptrPtr, sizePtr) => {
    const s = stream();
    const map = type === REQUEST_HEADERS ? s.request : type === RESPONSE_HEADERS ? s.response : EMPTY_MAP;
    return give(map, ptrPtr, sizePtr);
  },
  proxy_set_header_map_pairs: (type, ptr, size) => {
    const map = bytes().slice(ptr, ptr + size);
    if (type === REQUEST_HEADERS) stream().request = map; else stream().response = map;
    return OK;
  },
  proxy_replace_header_map_value: (type, namePtr, nameSize, valuePtr, valueSize) => {
    const name = text(namePtr, nameSize), value = text(valuePtr, valueSize);
    return editMap(type, (pairs) => [...pairs.filter(([n]) => n !== name), [name, value]]);
  },
  proxy_remove_header_map_value: (type, namePtr, nameSize) => {
    const name = text(namePtr, nameSize);
    return editMap(type, (pairs) => pairs.filter(([n]) => n !== name));
  },
  proxy_get_buffer_bytes: (type, start, max, ptrPtr, sizePtr) => {
    const buffer = { [REQUEST_BODY]: stream()?.requestBody, [RESPONSE_BODY]: stream()?.responseBody,
      [VM_CONFIGURATION]: new Uint8Array(), [PLUGIN_CONFIGURATION]: PLUGIN_CONFIG }[type];
    if (buffer === undefined) return NOT_FOUND;
    if (buffer.length === 0) return EMPTY;
    return give(buffer.subarray(start, Math.min(buffer.length, start + max)), ptrPtr, sizePtr);
  },
  proxy_set_buffer_bytes: (type, start, size, ptr, length) => {
    const data = bytes().slice(ptr, ptr + length);
    if (type === REQUEST_BODY) stream().requestBody = data; else stream().responseBody = data;
    return OK;
  },
  proxy_get_property: (ptr, size, ptrPtr, sizePtr) => {
    const path = text(ptr, size);
    if (path === 'response\0code_details') return give(encoder.encode('via_upstream'), ptrPtr, sizePtr);
    if (path === 'plugin_root_id') return give(encoder.encode('model_gateway'), ptrPtr, sizePtr);
    return NOT_FOUND;
  },
  proxy_set_property: () => OK,
  proxy_get_shared_data: (keyPtr, keySize, ptrPtr, sizePtr, casPtr) => {
    const entry = shared.get(text(keyPtr, keySize));
    if (!entry) return NOT_FOUND;
    view().setUint32(casPtr, entry.cas, true);
    return give(entry.value, ptrPtr, sizePtr);
  },
  proxy_set_shared_data: (keyPtr, keySize, ptr, size, cas) => {
    const key = text(keyPtr, keySize);
    if (cas !== 0 && shared.has(key) && shared.get(key).cas !== cas) return CAS_MISMATCH;
    shared.set(key, { value: bytes().slice(ptr, ptr + size), cas: nextCas++ });
    return OK;
  },
  proxy_continue_stream: () => OK,
  proxy_send_local_response: () => { throw new Error('the module answered locally: the request is not the benchmark\'s'); },
  proxy_set_tick_period_milliseconds: () => OK,
  proxy_http_call: () => { throw new Error('the module dispatched a call: the request is not the benchmark\'s'); },
  proxy_get_current_time_nanoseconds: (ptr) => {
    view().setBigUint64(ptr, BigInt(Date.now()) * 1000000n, true);
    return OK;
  },
};
for (const [name, call] of Object.entries(env)) env[name] = (...args) => { hostCalls++; return call(...args); };
const wasi = {
  random_get: (ptr, size) => { crypto.randomFillSync(bytes().subarray(ptr, ptr + size)); return OK; },
  environ_get: () => OK,
  environ_sizes_get: (countPtr, sizePtr) => { view().setUint32(countPtr, 0, true); view().setUint32(sizePtr, 0, true); return OK; },
  fd_write: () => OK,
  proc_exit: (code) => { throw new Error(`the module exited (${code})`); },
};

const instance = new WebAssembly.Instance(new WebAssembly.Module(fs.readFileSync(modulePath)),
  { env, wasi_snapshot_preview1: wasi });
wasm = instance.exports;
memory = wasm.memory;
wasm._initialize();
const ROOT = 1;
wasm.proxy_on_context_create(ROOT, 0);
if (!wasm.proxy_on_vm_start(ROOT, 0) || !wasm.proxy_on_configure(ROOT, PLUGIN_CONFIG.length)) {
  throw new Error('the module refused its configuration');
}

// bench.py's request and the mock's answer, with the headers Envoy and wrk add.
const BODY = encoder.encode(JSON.stringify({ model: 'bench-model', messages: [
  { role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Say hello.' }] }));
const ANSWER = encoder.encode(JSON.stringify({ id: 'chatcmpl-1', object: 'chat.completion', created: 1,
  model: 'bench-model', choices: [{ index: 0, message: { role: 'assistant', content: 'Hello!' }, finish_reason: 'stop' }],
  usage: { prompt_tokens: 9, completion_tokens: 3, total_tokens: 12 } }));
const REQUEST = encodeMap([[':authority', '127.0.0.1:8787'], [':path', '/v1/chat/completions'], [':method', 'POST'],
  [':scheme', 'http'], ['x-gateway-api-key', 'k'], ['x-gateway-provider', 'openai'],
  ['authorization', 'Bearer sk-bench'], ['x-gateway-custom-host', 'http://127.0.0.1:9000/v1'],
  ['content-type', 'application/json'], ['content-length', String(BODY.length)], ['x-forwarded-proto', 'http'],
  ['x-request-id', '6f1c2a9e-1111-4222-8333-944455556666']]);
const RESPONSE = encodeMap([[':status', '200'], ['content-type', 'application/json'],
  ['content-length', String(ANSWER.length)], ['date', 'Sat, 28 Nov 2026 22:00:00 GMT'],
  ['x-envoy-upstream-service-time', '1']]);

/// One request, its callbacks in the order Envoy makes them.
function serve(id) {
  streams.set(id, { request: REQUEST, response: EMPTY_MAP, requestBody: BODY, responseBody: ANSWER });
  current = id;
  wasm.proxy_on_context_create(id, ROOT);
  wasm.proxy_on_request_headers(id, 12, 0);
  wasm.proxy_on_request_body(id, BODY.length, 1);
  stream().response = RESPONSE;
  wasm.proxy_on_response_headers(id, 5, 0);
  wasm.proxy_on_response_body(id, ANSWER.length, 1);
  wasm.proxy_on_log(id);
  wasm.proxy_on_done(id);
  wasm.proxy_on_delete(id);
  const served = stream();
  streams.delete(id);
  return served;
}

// Warm up (V8 tiers hot functions up), then measure.
const first = serve(2);
if (!decoder.decode(first.request).includes('x-gateway-upstream-cluster')) {
  throw new Error('the module did not route the request');
}
for (let id = 3; id < 2000; id++) serve(id);
hostCalls = 0;
const start = process.hrtime.bigint();
for (let id = 2000; id < 2000 + REQUESTS; id++) serve(id);
const nanoseconds = Number(process.hrtime.bigint() - start);
console.log(`${REQUESTS} requests: ${(nanoseconds / REQUESTS / 1000).toFixed(1)} µs each in Node's V8 (the harness's ` +
  `host calls included), ${(hostCalls / REQUESTS).toFixed(1)} host calls each`);

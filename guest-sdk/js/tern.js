// Write Tern plugins in JavaScript (jco componentize, QuickJS backend).
//
// A plugin is a model whose implementation is a WebAssembly component of
// the `tern:plugin` world (wit/plugin.wit). This module is a thin layer over
// the bindings jco generates: tensors as TypedArrays, BYTES as strings or
// Uint8Arrays, Triton's error codes, log, BLS `infer`, custom metrics and
// the batch gather/split helpers.
//
//   import { exportModel, gather, Tensor } from "./tern.js";
//
//   class AddOne {
//     initialize(ctx) { this.name = ctx.modelName; }
//     execute(requests) {
//       const x = gather(requests, "INPUT0");
//       return x.split("OUTPUT0", x.values.map((v) => v + 1)).map((t) => ({ outputs: [t] }));
//     }
//   }
//   export const model = exportModel(AddOne);
//
// `execute` returns one entry per request: `{ outputs: [Tensor...] }` (or a
// `Response`), or a `TernError` for that request alone; throwing fails the
// whole batch. Build with `tern plugin build <dir>`.

import * as host from "tern:plugin/host@0.1.4";
import * as responses from "tern:plugin/responses@0.1.4";
import * as ops from "tern:plugin/ops@0.1.4";

/**
 * Native pre/post-processing kernels (`tern:plugin/ops`): `ops.decodeImage`,
 * `ops.letterbox`, `ops.normalize`, `ops.yoloDecode`, `ops.nms`,
 * `ops.setOutput`, and the host-held `ops.Array` (`ops.Array.fromData`,
 * `ops.Array.input`, `.reshape`, `.transpose`, `.softmax`, ...). Failures
 * throw; see docs/plugins.md.
 */
export { ops };

/** Triton's error codes. */
export const ErrorCode = Object.freeze({
  UNKNOWN: "unknown",
  INTERNAL: "internal",
  NOT_FOUND: "not-found",
  INVALID_ARG: "invalid-arg",
  UNAVAILABLE: "unavailable",
  UNSUPPORTED: "unsupported",
  ALREADY_EXISTS: "already-exists",
  CANCELLED: "cancelled",
});

/** An error with one of Triton's codes. */
export class TernError extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
  static invalidArg(message) {
    return new TernError(ErrorCode.INVALID_ARG, message);
  }
  static internal(message) {
    return new TernError(ErrorCode.INTERNAL, message);
  }
}

// Wire datatype -> [WIT enum, TypedArray, element size].
const DTYPES = {
  BOOL: ["bool", Uint8Array, 1],
  UINT8: ["uint8", Uint8Array, 1],
  UINT16: ["uint16", Uint16Array, 2],
  UINT32: ["uint32", Uint32Array, 4],
  UINT64: ["uint64", BigUint64Array, 8],
  INT8: ["int8", Int8Array, 1],
  INT16: ["int16", Int16Array, 2],
  INT32: ["int32", Int32Array, 4],
  INT64: ["int64", BigInt64Array, 8],
  FP16: ["fp16", Uint16Array, 2],
  FP32: ["fp32", Float32Array, 4],
  FP64: ["fp64", Float64Array, 8],
  BYTES: ["bytes", null, 0],
  BF16: ["bf16", Uint16Array, 2],
};
const NAMES = Object.fromEntries(Object.entries(DTYPES).map(([k, v]) => [v[0], k]));

function count(shape) {
  return shape.reduce((n, d) => n * Math.max(Number(d), 0), 1);
}

/** UTF-8 encoding (QuickJS has no TextEncoder). */
export function utf8Encode(s) {
  const out = [];
  for (let i = 0; i < s.length; i++) {
    let c = s.codePointAt(i);
    if (c > 0xffff) i++;
    if (c < 0x80) out.push(c);
    else if (c < 0x800) out.push(0xc0 | (c >> 6), 0x80 | (c & 63));
    else if (c < 0x10000) out.push(0xe0 | (c >> 12), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
    else out.push(0xf0 | (c >> 18), 0x80 | ((c >> 12) & 63), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
  }
  return Uint8Array.from(out);
}

/** UTF-8 decoding (invalid sequences become U+FFFD). */
export function utf8Decode(b) {
  let s = "";
  for (let i = 0; i < b.length; ) {
    const c = b[i++];
    let cp = 0xfffd;
    if (c < 0x80) cp = c;
    else if (c >= 0xc0 && c < 0xe0 && i < b.length) cp = ((c & 31) << 6) | (b[i++] & 63);
    else if (c >= 0xe0 && c < 0xf0 && i + 1 < b.length) cp = ((c & 15) << 12) | ((b[i++] & 63) << 6) | (b[i++] & 63);
    else if (c >= 0xf0 && i + 2 < b.length)
      cp = ((c & 7) << 18) | ((b[i++] & 63) << 12) | ((b[i++] & 63) << 6) | (b[i++] & 63);
    s += String.fromCodePoint(cp);
  }
  return s;
}

/** A tensor: name, datatype ("FP32" ... "BYTES"), shape, little-endian bytes. */
export class Tensor {
  constructor(name, datatype, shape, data) {
    if (!(datatype in DTYPES)) throw TernError.invalidArg(`tensor '${name}': unknown datatype '${datatype}'`);
    this.name = name;
    this.datatype = datatype;
    this.shape = shape.map(Number);
    this.data = data;
  }

  /** A tensor from a TypedArray or an array of numbers (default shape: 1-D). */
  static from(name, values, datatype, shape) {
    const Ctor = DTYPES[datatype] && DTYPES[datatype][1];
    if (!Ctor) throw TernError.invalidArg(`tensor '${name}': ${datatype} is not a numeric type`);
    shape = shape || [values.length];
    if (count(shape) !== values.length)
      throw TernError.invalidArg(`tensor '${name}': shape [${shape}] holds ${count(shape)} element(s), got ${values.length}`);
    const big = Ctor === BigInt64Array || Ctor === BigUint64Array;
    const typed = values instanceof Ctor ? values : Ctor.from(values, big ? (v) => BigInt(v) : (v) => Number(v));
    return new Tensor(name, datatype, shape, new Uint8Array(typed.buffer, typed.byteOffset, typed.byteLength));
  }

  /** A BYTES tensor from strings (UTF-8) or Uint8Arrays (default shape: 1-D). */
  static fromStrings(name, items, shape) {
    shape = shape || [items.length];
    const parts = items.map((s) => (typeof s === "string" ? utf8Encode(s) : s));
    const data = new Uint8Array(parts.reduce((n, p) => n + 4 + p.length, 0));
    const view = new DataView(data.buffer);
    let at = 0;
    for (const p of parts) {
      view.setUint32(at, p.length, true);
      data.set(p, at + 4);
      at += 4 + p.length;
    }
    return new Tensor(name, "BYTES", shape, data);
  }

  static fromWit(t) {
    return new Tensor(t.name, NAMES[t.datatype], t.shape, t.data);
  }

  toWit() {
    return { name: this.name, datatype: DTYPES[this.datatype][0], shape: this.shape, data: this.data };
  }

  /** The values as a TypedArray of the tensor's type (a copy, so aligned). */
  typed() {
    const Ctor = DTYPES[this.datatype][1];
    if (!Ctor) throw TernError.invalidArg(`tensor '${this.name}' is BYTES; use strings() or texts()`);
    return new Ctor(this.data.slice().buffer);
  }

  /** A BYTES tensor's elements as Uint8Arrays. */
  strings() {
    if (this.datatype !== "BYTES") throw TernError.invalidArg(`tensor '${this.name}' is ${this.datatype}, not BYTES`);
    const out = [];
    const d = this.data;
    const view = new DataView(d.buffer, d.byteOffset, d.byteLength);
    for (let at = 0; at < d.length; ) {
      if (at + 4 > d.length) throw TernError.invalidArg(`tensor '${this.name}': truncated BYTES element`);
      const n = view.getUint32(at, true);
      if (at + 4 + n > d.length) throw TernError.invalidArg(`tensor '${this.name}': truncated BYTES element`);
      out.push(d.subarray(at + 4, at + 4 + n));
      at += 4 + n;
    }
    return out;
  }

  /** A BYTES tensor's elements decoded as UTF-8 strings. */
  texts() {
    return this.strings().map(utf8Decode);
  }

  /** The same tensor under another name. */
  renamed(name) {
    return new Tensor(name, this.datatype, this.shape, this.data);
  }
}

/** The request's input `name` (a Tensor), or an INVALID_ARG error. */
export function input(request, name) {
  const t = request.inputs.find((i) => i.name === name);
  if (!t) throw TernError.invalidArg(`request has no input '${name}'`);
  return Tensor.fromWit(t);
}

/** One input gathered across a request list (models with max_batch_size > 0). */
export class Batch {
  constructor(datatype, values, sizes, inner) {
    this.datatype = datatype;
    /** All values, request after request (a TypedArray; BYTES: Uint8Arrays). */
    this.values = values;
    /** Each request's batch size (its first dimension). */
    this.sizes = sizes;
    /** The dimensions after the batch dimension. */
    this.inner = inner;
  }

  total() {
    return this.sizes.reduce((a, b) => a + b, 0);
  }

  /** Splits batch-wide output values into one Tensor per request. */
  split(name, values, datatype, inner) {
    datatype = datatype || this.datatype;
    inner = inner || this.inner;
    const row = count(inner);
    if (values.length !== row * this.total())
      throw TernError.internal(`output '${name}': ${values.length} values for a batch of ${this.total()} rows of ${row}`);
    const out = [];
    let at = 0;
    for (const n of this.sizes) {
      const part = values.slice(at, at + n * row);
      const shape = [n, ...inner];
      out.push(datatype === "BYTES" ? Tensor.fromStrings(name, part, shape) : Tensor.from(name, part, datatype, shape));
      at += n * row;
    }
    return out;
  }
}

/** Concatenates input `name` of every request along the batch dimension. */
export function gather(requests, name) {
  let inner = null;
  let datatype = null;
  const sizes = [];
  const parts = [];
  for (const r of requests) {
    const t = input(r, name);
    if (t.shape.length === 0) throw TernError.invalidArg(`input '${name}' has no batch dimension`);
    const rest = t.shape.slice(1);
    if (inner === null) {
      inner = rest;
      datatype = t.datatype;
    } else if (rest.join(",") !== inner.join(",")) {
      throw TernError.invalidArg(`input '${name}': requests in one batch have different shapes ([${rest}] vs [${inner}])`);
    }
    sizes.push(t.shape[0]);
    parts.push(t);
  }
  if (datatype === "BYTES") return new Batch(datatype, parts.flatMap((t) => t.strings()), sizes, inner);
  const Ctor = datatype ? DTYPES[datatype][1] : Float32Array;
  const values = new Ctor(parts.reduce((n, t) => n + t.data.length, 0) / (Ctor.BYTES_PER_ELEMENT || 1));
  const bytes = new Uint8Array(values.buffer);
  let at = 0;
  for (const t of parts) {
    bytes.set(t.data, at);
    at += t.data.length;
  }
  return new Batch(datatype, values, sizes, inner || []);
}

function witParams(params) {
  return Object.entries(params || {}).map(([key, v]) => ({
    key,
    value:
      typeof v === "boolean"
        ? { tag: "bool", val: v }
        : typeof v === "bigint" || Number.isInteger(v)
          ? { tag: "int", val: v }
          : typeof v === "number"
            ? { tag: "double", val: v }
            : { tag: "string", val: String(v) },
  }));
}

/** Writes to the server's log ("error", "warn", "info" or "verbose"). */
export function log(level, message) {
  host.log(level, String(message));
}

function asTernError(e) {
  if (e instanceof TernError) return e;
  if (e && typeof e === "object" && "payload" in e && e.payload && e.payload.code) return new TernError(e.payload.code, e.payload.message);
  if (!(e && e.message)) return TernError.internal(String(e));
  let message = `${e.name || "Error"}: ${e.message}`;
  const where = whereThrown(e);
  if (where) message += ` (at ${where})`;
  // The whole stack goes to the server's log, tagged with the model.
  if (typeof e.stack === "string" && e.stack.trim()) {
    try {
      host.log("error", `${e.name || "Error"}: ${e.message}\n${e.stack.trimEnd()}`);
    } catch (_) {
      // logging must not hide the error
    }
  }
  return TernError.internal(message);
}

/** `file:line in function` of the innermost stack frame outside this SDK. */
function whereThrown(e) {
  if (typeof e.stack !== "string") return null;
  for (const line of e.stack.split("\n")) {
    // QuickJS: "    at fn (model.js:12)" or "    at fn (model.js:12:5)"; "    at model.js:3" at top level.
    const m = /^\s*at\s+(?:([^\s(]+)\s+)?\(?([^()\s]+?):(\d+)(?::\d+)?\)?\s*$/.exec(line);
    if (!m || /(^|\/)tern\.js$/.test(m[2])) continue;
    const file = m[2].split("/").pop();
    return m[1] && m[1] !== "<anonymous>" ? `${file}:${m[3]} in ${m[1]}` : `${file}:${m[3]}`;
  }
  return null;
}

/**
 * BLS: runs a request on another model of the server, in-process, and
 * returns `{ outputs: Tensor[], output(name) }`; throws a TernError.
 * `req`: `{ model, version = -1, id = "", inputs: Tensor[], outputs: [names], parameters: {} }`.
 */
export function infer(req) {
  let r;
  try {
    r = host.infer(witInferRequest(req));
  } catch (e) {
    throw asTernError(e);
  }
  return fromWitResponse(r);
}

function witInferRequest(req) {
  return {
    modelName: req.model,
    modelVersion: req.version ?? -1,
    id: req.id || "",
    inputs: (req.inputs || []).map((t) => t.toWit()),
    requestedOutputs: req.outputs || [],
    parameters: witParams(req.parameters),
  };
}

function fromWitResponse(r) {
  const outputs = r.outputs.map(Tensor.fromWit);
  return {
    outputs,
    output(name) {
      const t = outputs.find((o) => o.name === name);
      if (!t) throw TernError.internal(`response has no output '${name}'`);
      return t;
    },
  };
}

/**
 * Streaming BLS (Triton's `exec(decoupled=True)`): an iterator over every
 * response the model sends, as it sends them (many for a decoupled model,
 * one for any other); an error is thrown from `next()` as a TernError.
 * `req` as for `infer`.
 */
export function inferStream(req) {
  let stream;
  try {
    stream = responses.inferStream(witInferRequest(req));
  } catch (e) {
    throw asTernError(e);
  }
  return {
    [Symbol.iterator]() {
      return this;
    },
    next() {
      const r = stream.next();
      if (r === undefined || r === null) return { done: true, value: undefined };
      if (r.tag === "err") throw new TernError(r.val.code, r.val.message);
      return { done: false, value: fromWitResponse(r.tag === "ok" ? r.val : r) };
    },
  };
}

/** A custom metric family ("counter", "gauge" or "histogram"). */
export class MetricFamily {
  constructor(name, description, kind, buckets) {
    try {
      this.id = host.metricFamily(name, description, kind, buckets || []);
    } catch (e) {
      throw asTernError(e);
    }
  }
  /** Counter/gauge: adds; histogram: observes. `labels`: { name: value }. */
  record(labels, value) {
    host.metricRecord(this.id, Object.entries(labels || {}), value);
  }
  /** Gauge: sets. */
  set(labels, value) {
    host.metricSet(this.id, Object.entries(labels || {}), value);
  }
}

/** Response flag: the request's last message (Triton's TRITONSERVER_RESPONSE_COMPLETE_FINAL). */
export const RESPONSE_COMPLETE_FINAL = 1;

/**
 * Decoupled models (`model_transaction_policy { decoupled: true }`): the
 * response sender of request `index` of the batch `execute` is running.
 * `send(response, flags)` (a `{ outputs }` object, or `undefined` with
 * RESPONSE_COMPLETE_FINAL), `sendError(error, flags)` (the last message
 * unless `flags` is 0: then more responses may follow), `isCancelled()`; keep it
 * as long as needed. `execute` then returns nothing.
 */
export function responseSender(index) {
  let s;
  try {
    s = responses.sender(index);
  } catch (e) {
    throw asTernError(e);
  }
  return {
    send(response, flags = 0) {
      if (response instanceof Error) return this.sendError(response);
      try {
        s.send(response === undefined || response === null ? undefined : witResponse(response).val, flags);
      } catch (e) {
        throw asTernError(e);
      }
    },
    sendError(error, flags = RESPONSE_COMPLETE_FINAL) {
      try {
        if (flags & RESPONSE_COMPLETE_FINAL) s.sendError(witError(error));
        else s.sendErrorResponse(witError(error), flags);
      } catch (e) {
        throw asTernError(e);
      }
    },
    isCancelled() {
      return s.isCancelled();
    },
  };
}

/** Whether the client of request `index` of the running batch has gone away. */
export function isCancelled(index) {
  return responses.isCancelled(index);
}

function witError(e) {
  const t = asTernError(e);
  return { code: t.code, message: t.message };
}

function witResponse(r) {
  if (r instanceof Error) return { tag: "err", val: witError(r) };
  const outputs = (r.outputs || []).map((t) => (t instanceof Tensor ? t.toWit() : t));
  return { tag: "ok", val: { outputs, parameters: witParams(r.parameters) } };
}

/**
 * Exports a model class (`initialize(ctx)`, `execute(requests)`,
 * `finalize()`; all optional but `execute`) as the component's `model`
 * interface: `export const model = exportModel(MyModel)`. `ctx` is the WIT
 * model-context (`modelName`, `modelVersion`, `configJson`, `instanceName`,
 * `instanceKind`, `deviceId`, `repositoryPath`); requests are WIT requests
 * (`id`, `inputs`, `requestedOutputs`, `parameters`, `correlationId`,
 * `flags`), read them with `input()` / `gather()`.
 */
export function exportModel(ModelClass) {
  let instance = null;
  return {
    initialize(ctx) {
      try {
        instance = new ModelClass();
        if (instance.initialize) instance.initialize(ctx);
      } catch (e) {
        instance = null;
        // jco turns a thrown { payload } into the `err` case.
        const err = new Error(asTernError(e).message);
        err.payload = witError(e);
        throw err;
      }
    },
    execute(requests) {
      if (!instance) return requests.map(() => ({ tag: "err", val: { code: "internal", message: "execute called before initialize" } }));
      try {
        const out = instance.execute(requests);
        // A decoupled model answers through its response senders.
        if (out === undefined || out === null) return [];
        if (out.length !== requests.length)
          throw TernError.internal(`execute returned ${out ? out.length : "nothing"} response(s) for ${requests.length} request(s)`);
        return out.map(witResponse);
      } catch (e) {
        const err = witError(e);
        return requests.map(() => ({ tag: "err", val: err }));
      }
    },
    finalize() {
      if (instance && instance.finalize) instance.finalize();
      instance = null;
    },
  };
}

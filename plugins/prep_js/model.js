// `prep_js`: the example preprocessing job in JavaScript (see
// plugins/prep_rust for the reference). OUTPUT0 = INPUT0 + INPUT1 and
// OUTPUT1 = INPUT0 - INPUT1 (FP32 [4]); TEXT is normalised to NORMALIZED
// (ASCII lower-case, runs of ASCII whitespace collapsed, trimmed) and its
// words hashed to TOKEN_IDS (FNV-1a 32 mod 30000 + 1, first 8 words, 0-padded).

import { exportModel, gather, input, log, Tensor } from "../../guest-sdk/js/tern.js";

const MAX_TOKENS = 8;
const VOCAB = 30000;
const SPACE = new Set([0x20, 0x09, 0x0a, 0x0d, 0x0b, 0x0c]);

function fnv1a(word) {
  let h = 0x811c9dc5;
  for (const b of word) h = Math.imul(h ^ b, 0x01000193) >>> 0;
  return h;
}

// Works on bytes, so the result is the same as the other languages' for any input.
function normalize(text) {
  const words = [];
  let word = [];
  for (const c of text) {
    if (SPACE.has(c)) {
      if (word.length) words.push(word);
      word = [];
    } else {
      word.push(c >= 0x41 && c <= 0x5a ? c + 32 : c);
    }
  }
  if (word.length) words.push(word);
  const ids = new Array(MAX_TOKENS).fill(0);
  words.slice(0, MAX_TOKENS).forEach((w, i) => (ids[i] = (fnv1a(w) % VOCAB) + 1));
  const joined = [];
  words.forEach((w, i) => {
    if (i) joined.push(0x20);
    joined.push(...w);
  });
  return [Uint8Array.from(joined), ids];
}

class Prep {
  initialize(ctx) {
    log("info", `${ctx.modelName} ready on ${ctx.instanceName}`);
  }

  execute(requests) {
    const a = gather(requests, "INPUT0");
    const b = gather(requests, "INPUT1");
    const sums = a.split("OUTPUT0", a.values.map((x, i) => x + b.values[i]));
    const diffs = a.split("OUTPUT1", a.values.map((x, i) => x - b.values[i]));
    return requests.map((r, i) => {
      const rows = input(r, "TEXT").strings().map(normalize);
      const n = rows.length;
      return {
        outputs: [
          sums[i],
          diffs[i],
          Tensor.fromStrings("NORMALIZED", rows.map((x) => x[0]), [n, 1]),
          Tensor.from("TOKEN_IDS", rows.flatMap((x) => x[1]), "INT32", [n, MAX_TOKENS]),
        ],
      };
    });
  }
}

export const model = exportModel(Prep);

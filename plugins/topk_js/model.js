// `topk_js`: classifier post-processing on the host kernels from
// JavaScript: LOGITS (FP32 [n]) -> PROBS (softmax, FP32 [n]) and TOP
// (indices of the 3 largest, INT64 [3]), both made outputs without a copy
// through the plugin. The C and Python twins give the same answers.

import { exportModel, ops } from "../../guest-sdk/js/tern.js";

class TopK {
  execute(requests) {
    return requests.map((_request, i) => {
      const logits = ops.Array.input(i, "LOGITS");
      const probs = logits.softmax(1);
      const [, top] = probs.topK(3, 1);
      ops.setOutput(i, "PROBS", probs);
      ops.setOutput(i, "TOP", top);
      return { outputs: [] };
    });
  }
}

export const model = exportModel(TopK);

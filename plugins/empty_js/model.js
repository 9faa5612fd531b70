// `empty_js`: answers every request with an empty response. The per-call
// floor of a JavaScript plugin (`make bench-lang`).
import { exportModel } from "../../guest-sdk/js/tern.js";

class Empty {
  execute(requests) {
    return requests.map(() => ({ outputs: [] }));
  }
}

export const model = exportModel(Empty);

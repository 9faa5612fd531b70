// `{{name}}`: OUTPUT0 = INPUT0 * 2.
import { exportModel, input, log, Tensor } from "./sdk/tern.js";

class Plugin {
  initialize(ctx) {
    log("info", `${ctx.modelName} ready on ${ctx.instanceName}`);
  }

  execute(requests) {
    return requests.map((r) => {
      const x = input(r, "INPUT0");
      return { outputs: [Tensor.from("OUTPUT0", x.typed().map((v) => v * 2), "FP32", x.shape)] };
    });
  }
}

export const model = exportModel(Plugin);

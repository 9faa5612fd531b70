// `stream_js`: the decoupled test plugin in JavaScript: for each request,
// COUNT (INT32 [1]) responses OUT = 0, 1, ... through its response sender,
// then the final flag alone; a negative COUNT is answered with an error; COUNT
// -3 with an error response that leaves the stream open, then OUT = 7, then
// the final flag.

import {
  exportModel,
  input,
  responseSender,
  RESPONSE_COMPLETE_FINAL,
  Tensor,
  TernError,
} from "../../guest-sdk/js/tern.js";

class StreamJs {
  execute(requests) {
    requests.forEach((request, i) => {
      const sender = responseSender(i);
      const count = input(request, "COUNT").typed()[0];
      if (count === -3) {
        sender.sendError(TernError.invalidArg("COUNT -3: an error response, the stream stays open"), 0);
        sender.send({ outputs: [Tensor.from("OUT", [7], "INT32", [1])] });
        sender.send(undefined, RESPONSE_COMPLETE_FINAL);
        return;
      }
      if (count < 0) {
        sender.sendError(TernError.invalidArg(`COUNT must be >= 0, got ${count}`));
        return;
      }
      for (let k = 0; k < count && !sender.isCancelled(); k++) {
        sender.send({ outputs: [Tensor.from("OUT", [k], "INT32", [1])] });
      }
      sender.send(undefined, RESPONSE_COMPLETE_FINAL);
    });
    // A decoupled model answers through its senders.
    return undefined;
  }
}

export const model = exportModel(StreamJs);

# The standard library imports at run time, and `async def execute` runs on
# an event loop (tasks, gather, sleep).
import asyncio
import collections
import dataclasses
import decimal
import hashlib
import json
import statistics

import numpy as np
import triton_python_backend_utils as pb_utils


@dataclasses.dataclass
class Summary:
    count: int
    mean: str
    mode: int
    digest: str


class TritonPythonModel:
    async def summarise(self, values):
        await asyncio.sleep(0.001)
        return Summary(
            count=len(values),
            mean=str(decimal.Decimal(statistics.mean(values)).quantize(decimal.Decimal("0.01"))),
            mode=collections.Counter(values).most_common(1)[0][0],
            digest=hashlib.sha256(json.dumps(values).encode()).hexdigest()[:16],
        )

    async def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, "IN").as_numpy().tolist() for r in requests]
        summaries = await asyncio.gather(*(self.summarise(v) for v in inputs))
        return [
            pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", np.array([json.dumps(dataclasses.asdict(s)).encode()], dtype=np.object_))
            ])
            for s in summaries
        ]

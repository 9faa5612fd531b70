"""The sequence batcher against Triton itself: the batches a stateful model
sees. tritonserver 2.51 (see tests/test_vs_triton.py) and Tern serve the same
unchanged Python-backend sequence models (tests/python_sequence_models: a sum
per correlation id that reports, with each response, how many requests its
execution held, its row among them and its READY flag), and each scenario of
Triton's own sequence batcher tests (qa/L0_sequence_batcher: full and half
batches, skipped slots, a backlog, a correlation id reused after its END, a
sequence that never ends, the oldest strategy, two instances) is played
against each server, all of a scenario's requests on one gRPC stream. A
blocker request (START and END in one, sleeping 1.5 s)
holds the instance first, so every request of the scenario is queued before
the first batch forms, on both servers: with one instance and `direct` the
batches are then the same on every run (see SCENARIOS for the others).

Compared per scenario: every response (sum, batch size, row, READY), and the
model's statistics (execution and inference counts, executions per batch
size). Run by `make test-vs-triton` only."""

import os
import queue
import time
from functools import partial

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import ROOT
from test_vs_triton import serve_both

MODELS = os.path.join(ROOT, "tests", "python_sequence_models")
BLOCK_MS = 1500
BLOCKER = 1_000_000 + BLOCK_MS


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    with serve_both(MODELS, tmp_path_factory.mktemp("vs-triton-seq")) as both:
        yield both


def stats(server, model):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    s = c.get_inference_statistics(model).model_stats[0]
    c.close()
    return {
        "executions": s.execution_count,
        "inferences": s.inference_count,
        "batches": {b.batch_size: b.compute_infer.count for b in s.batch_stats},
    }


def delta(before, after):
    batches = {k: v - before["batches"].get(k, 0) for k, v in after["batches"].items()}
    return {
        "executions": after["executions"] - before["executions"],
        "inferences": after["inferences"] - before["inferences"],
        "batches": {k: v for k, v in sorted(batches.items()) if v},
    }


def play(server, model, sequences, blockers=1):
    """On one gRPC stream: blockers first (each START+END, sleeping
    BLOCK_MS), then each sequence (corrid, values[, ends]), its requests back
    to back, 40 ms after the one before; every answer by sequence, and the
    statistics' change."""
    before = stats(server, model)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers = queue.Queue()
    client.start_stream(callback=partial(lambda q, result, error: q.put((result, error)), answers))
    sent = 0

    def send(key, corrid, values, end=True):
        nonlocal sent
        for k, v in enumerate(values):
            x = grpcclient.InferInput("INPUT", [1, 1], "INT32")
            x.set_data_from_numpy(np.array([[v]], dtype=np.int32))
            client.async_stream_infer(model, [x], request_id=f"{key}/{k}", sequence_id=corrid,
                                      sequence_start=k == 0, sequence_end=end and k == len(values) - 1)
            sent += 1

    t0 = time.monotonic()
    for b in range(blockers):
        # One blocker: START and END in one request. Several (one per
        # instance): START, then END right behind it, so that each holds its
        # slot until it has run and the next blocker takes another instance.
        send(f"blocker {b}", 9000 + b, [BLOCKER] if blockers == 1 else [BLOCKER, 0])
    time.sleep(0.3)
    for n, seq in enumerate(sequences):
        send(f"{n}:{seq[0]}", seq[0], seq[1], end=seq[2] if len(seq) > 2 else True)
        time.sleep(0.04)
    took = time.monotonic() - t0
    assert took < 0.8 * BLOCK_MS / 1000, f"sending took {took:.2f} s: the blocker no longer holds the instance meanwhile"
    got = {}
    stalled = False
    try:
        for _ in range(sent):
            try:
                result, error = answers.get(timeout=30)
            except queue.Empty:
                stalled = True
                break
            if error is not None:
                got.setdefault("errors", []).append(str(error))
                continue
            key, k = result.get_response().id.rsplit("/", 1)
            got.setdefault(key, {})[int(k)] = (int(result.as_numpy("OUTPUT")[0][0]),
                                               tuple(int(v) for v in result.as_numpy("BATCH")[0]))
        out = {key: [v[k] for k in sorted(v)] if key != "errors" else v for key, v in got.items()}
        if stalled:
            out["stalled"] = sent - sum(len(v) for v in got.values())
            return out
        deadline = time.time() + 10
        while True:  # statistics are updated after the responses are sent
            after = delta(before, stats(server, model))
            if after["inferences"] >= sent or time.time() > deadline:
                break
            time.sleep(0.1)
        out["statistics"] = after
        # A sequence left without END is ended, so the next scenario finds every slot free.
        open_ends = [seq[0] for seq in sequences if len(seq) > 2 and not seq[2]]
        for corrid in open_ends:
            x = grpcclient.InferInput("INPUT", [1, 1], "INT32")
            x.set_data_from_numpy(np.array([[0]], dtype=np.int32))
            client.async_stream_infer(model, [x], sequence_id=corrid, sequence_end=True)
        for _ in open_ends:
            answers.get(timeout=30)
    finally:
        # Waiting for a stalled server's stream to end would never return.
        client.stop_stream(cancel_requests=stalled)
        client.close()
    return out


def restart(triton):
    triton.stop()
    for _ in range(3):  # a free port can be taken before Triton binds it
        triton.start()
        if triton.wait_live():
            break
        triton.stop()
    deadline = time.time() + 60
    while time.time() < deadline:  # the models are READY a moment after the server is live
        c = grpcclient.InferenceServerClient(triton.grpc_url)
        ready = all(c.is_model_ready(m) for m in ("seq_direct", "seq_oldest", "seq_direct_2x2"))
        c.close()
        if ready:
            return
        time.sleep(0.2)
    raise RuntimeError("tritonserver did not come back:\n" + triton.log())


def three(first):
    return [first, first + 1, first + 2]


# Scenario -> (model, sequences, blockers, exact); as in
# qa/L0_sequence_batcher/sequence_batcher_test.py. `exact`: every batch is
# compared. Otherwise Triton itself forms different batches from run to run
# (measured here: with two instances, which backlog sequence follows which
# blocker's END depends on a few milliseconds; with `oldest`, whether its
# dynamic batcher has closed a batch when the next sequence's request
# arrives), so only what must not vary is compared: every sequence's sums
# (no sequence loses its state or its START), errors, the inference count,
# and that no batch is larger than the model allows.
SCENARIOS = {
    "full_batch": ("seq_direct", [(1001, three(1)), (1002, three(11)), (1003, three(111)), (1004, three(1111))], 1, True),
    "half_batch": ("seq_direct", [(987, [1, 2, 3, 4]), (988, [0, 9, 5, 13])], 1, True),
    "skip_batch": ("seq_direct", [(1001, [1, 3]), (1002, [11, 12, 13, 14]), (1003, [111, 113]), (1004, [1111, 1112, 1113, 1114])], 1, True),
    "backlog": ("seq_direct", [(1001 + k, three(10**k)) for k in range(5)], 1, True),
    "backlog_same_correlation_id": ("seq_direct", [(1001, three(1)), (1002, three(11)), (1003, three(111)), (1004, three(1111)), (1002, [11111, 11113])], 1, True),
    "sequence_without_end": ("seq_direct", [(1001, [1, 3], False), (1002, three(11)), (1003, three(111)), (1004, three(1111)), (1005, [11111, 11113])], 1, True),
    "oldest_full_batch": ("seq_oldest", [(1001, three(1)), (1002, three(11)), (1003, three(111)), (1004, three(1111))], 1, False),
    "oldest_backlog": ("seq_oldest", [(1001 + k, three(10**k)) for k in range(5)], 1, False),
    "two_instances_full": ("seq_direct_2x2", [(1001, three(1)), (1002, three(11)), (1003, three(111)), (1004, three(1111))], 2, False),
    "two_instances_backlog": ("seq_direct_2x2", [(1001 + k, three(10**k)) for k in range(5)], 2, False),
}
MAX_BATCH = {"seq_direct": 4, "seq_oldest": 4, "seq_direct_2x2": 2}


def sums(answers):
    return {k: v if k in ("statistics", "errors") else [a[0] for a in v] for k, v in answers.items()}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_sequence_batches_match_triton(servers, scenario):
    model, sequences, blockers, exact = SCENARIOS[scenario]
    triton = play(servers["triton"], model, sequences, blockers)
    if "stalled" in triton:
        # Seen with tritonserver 2.51 in about one run in three of skip_batch:
        # its direct batcher stops forming batches once the rows of the
        # sequences that ended are empty, and never answers the rest. Its
        # slots stay taken, so it is restarted for the next scenario.
        restart(servers["triton"])
        pytest.xfail(f"tritonserver 2.51 stopped answering ({triton['stalled']} requests unanswered after 30 s): {triton}")
    tern = play(servers["tern"], model, sequences, blockers)
    assert "stalled" not in tern, f"Tern stopped answering: {tern}"
    report = f"\n\nTriton: {triton}\nTern:   {tern}"
    assert set(tern) == set(triton), report
    if exact:
        for key in triton:
            assert tern.get(key) == triton[key], f"{scenario} {key}:\nTriton: {triton[key]}\nTern:   {tern.get(key)}{report}"
        return
    for server, answers in (("Triton", triton), ("Tern", tern)):
        sizes = [a[1][0] for k, v in answers.items() if k not in ("statistics", "errors") for a in v]
        assert max(sizes) <= MAX_BATCH[model], f"{server} ran a batch larger than {MAX_BATCH[model]}{report}"
    t_sums, n_sums = sums(triton), sums(tern)
    for key in triton:
        if key != "statistics":
            assert n_sums.get(key) == t_sums[key], f"{scenario} {key}:\nTriton: {t_sums[key]}\nTern:   {n_sums.get(key)}{report}"
    assert tern["statistics"]["inferences"] == triton["statistics"]["inferences"], report

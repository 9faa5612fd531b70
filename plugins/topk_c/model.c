/* `topk_c`: classifier post-processing on the host kernels from C:
 * LOGITS (FP32 [n]) -> PROBS (softmax, FP32 [n]) and TOP (indices of the 3
 * largest, INT64 [3]), made outputs without a copy through the plugin. The
 * helpers of tern_plugin.h cover input/output; the kernels are the
 * generated tern_plugin_ops_* calls. */

#include "tern_plugin.h"

int tern_model_initialize(const tern_context *ctx, tern_error *err) {
    (void)ctx;
    (void)err;
    return 0;
}

static int run(size_t i, tern_error *err) {
    tern_plugin_ops_error_t e;
    tern_array logits, probs;
    tern_plugin_ops_tuple2_own_array_own_array_t top;
    if (tern_array_input(i, "LOGITS", &logits, err) != 0) return -1;
    int ok = tern_plugin_ops_method_array_softmax(TERN_BORROW(logits), 1, &probs, &e);
    tern_array_drop(logits);
    if (!ok) return tern_ops_error(&e, err);
    if (!tern_plugin_ops_method_array_top_k(TERN_BORROW(probs), 3, 1, &top, &e)) {
        tern_array_drop(probs);
        return tern_ops_error(&e, err);
    }
    int rc = tern_set_output(i, "PROBS", probs, err);
    if (rc == 0) rc = tern_set_output(i, "TOP", top.f1, err);
    tern_array_drop(probs);
    tern_array_drop(top.f0);
    tern_array_drop(top.f1);
    return rc;
}

void tern_model_execute(const tern_request *reqs, size_t n, tern_result *results) {
    (void)reqs;
    for (size_t i = 0; i < n; i++) {
        tern_error err;
        if (run(i, &err) != 0) tern_fail(&results[i], err.code, "%s", err.message);
    }
}

void tern_model_finalize(void) {}

/* `topk_c`: classifier post-processing on the host kernels from C, through
 * the generated `tern_plugin_ops_*` bindings: LOGITS (FP32 [n]) -> PROBS
 * (softmax, FP32 [n]) and TOP (indices of the 3 largest, INT64 [3]), made
 * outputs without a copy through the plugin. */

#include "tern_plugin.h"

int tern_model_initialize(const tern_context *ctx, tern_error *err) {
    (void)ctx;
    (void)err;
    return 0;
}

/* Fails `result` with a kernel's error and frees the error. */
static void fail_ops(tern_result *result, tern_plugin_ops_error_t *e) {
    tern_fail(result, (tern_code)e->code, "%.*s", (int)e->message.len, (const char *)e->message.ptr);
    tern_plugin_types_error_free(e);
}

void tern_model_execute(const tern_request *reqs, size_t n, tern_result *results) {
    (void)reqs;
    for (size_t i = 0; i < n; i++) {
        tern_plugin_ops_error_t e;
        plugin_string_t name;
        tern_plugin_ops_own_array_t logits, probs;
        tern_plugin_ops_tuple2_own_array_own_array_t top;
        plugin_string_set(&name, "LOGITS");
        if (!tern_plugin_ops_static_array_input((uint32_t)i, &name, &logits, &e)) {
            fail_ops(&results[i], &e);
            continue;
        }
        int ok = tern_plugin_ops_method_array_softmax(tern_plugin_ops_borrow_array(logits), 1, &probs, &e);
        tern_plugin_ops_array_drop_own(logits);
        if (!ok) {
            fail_ops(&results[i], &e);
            continue;
        }
        if (!tern_plugin_ops_method_array_top_k(tern_plugin_ops_borrow_array(probs), 3, 1, &top, &e)) {
            tern_plugin_ops_array_drop_own(probs);
            fail_ops(&results[i], &e);
            continue;
        }
        plugin_string_set(&name, "PROBS");
        ok = tern_plugin_ops_set_output((uint32_t)i, &name, tern_plugin_ops_borrow_array(probs), &e);
        if (ok) {
            plugin_string_set(&name, "TOP");
            ok = tern_plugin_ops_set_output((uint32_t)i, &name, tern_plugin_ops_borrow_array(top.f1), &e);
        }
        tern_plugin_ops_array_drop_own(probs);
        tern_plugin_ops_array_drop_own(top.f0);
        tern_plugin_ops_array_drop_own(top.f1);
        if (!ok) fail_ops(&results[i], &e);
    }
}

void tern_model_finalize(void) {}

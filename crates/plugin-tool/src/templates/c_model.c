/* `{{name}}`: OUTPUT0 = INPUT0 * 2. */
#include <stdlib.h>

#include "tern_plugin.h"

int tern_model_initialize(const tern_context *ctx, tern_error *err) {
    (void)err;
    tern_log(TERN_LOG_INFO, "%.*s ready on %.*s", (int)ctx->model_name.len, (const char *)ctx->model_name.ptr,
             (int)ctx->instance_name.len, (const char *)ctx->instance_name.ptr);
    return 0;
}

void tern_model_execute(const tern_request *reqs, size_t n, tern_result *results) {
    for (size_t r = 0; r < n; r++) {
        tern_error err;
        size_t count;
        const tern_tensor *x = tern_input(&reqs[r], "INPUT0");
        const float *in = x ? tern_data(x, TERN_FP32, &count, &err) : NULL;
        if (!in) {
            tern_fail(&results[r], TERN_INVALID_ARG, "%s", x ? err.message : "request has no input 'INPUT0'");
            continue;
        }
        float *out = malloc((count ? count : 1) * sizeof(float));
        for (size_t i = 0; i < count; i++) out[i] = in[i] * 2;
        tern_add_output(&results[r], tern_tensor_new("OUTPUT0", TERN_FP32, x->shape.ptr, x->shape.len, out,
                                                     count * sizeof(float)));
        free(out);
    }
}

void tern_model_finalize(void) {}

/* `empty_c`: answers every request with an empty response (the results
 * start empty). The per-call floor of a C plugin (`make bench-lang`). */
#include "tern_plugin.h"

int tern_model_initialize(const tern_context *ctx, tern_error *err) {
    (void)ctx;
    (void)err;
    return 0;
}

void tern_model_execute(const tern_request *reqs, size_t n, tern_result *results) {
    (void)reqs;
    (void)n;
    (void)results;
}

void tern_model_finalize(void) {}

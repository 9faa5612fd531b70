/*
 * `stream_c`: the decoupled test plugin in C: for each request, COUNT
 * (INT32 [1]) responses OUT = 0, 1, ... through its response sender, then
 * the final flag alone; a negative COUNT is answered with an error; COUNT
 * -3 with an error response, then OUT = 7, then the final flag.
 */
#include "tern_plugin.h"

int tern_model_initialize(const tern_context *ctx, tern_error *err) {
    (void)ctx;
    (void)err;
    return 0;
}

void tern_model_execute(const tern_request *reqs, size_t n, tern_result *results) {
    (void)results; /* a decoupled model answers through its senders */
    for (size_t i = 0; i < n; i++) {
        tern_error err;
        tern_sender s;
        if (tern_response_sender(i, &s, &err) != 0) {
            tern_log(TERN_LOG_ERROR, "request %zu: %s", i, err.message);
            continue;
        }
        size_t count = 0;
        const int32_t *c = tern_data(tern_input(&reqs[i], "COUNT"), TERN_INT32, &count, &err);
        if (c && count == 1 && c[0] == -3) {
            static const int64_t one[1] = {1};
            const int32_t seven = 7;
            tern_result r = {0};
            tern_fail(&r, TERN_INVALID_ARG, "COUNT -3: an error response, the stream stays open");
            tern_send(&s, &r, 0, &err);
            tern_result o = {0};
            tern_add_output(&o, tern_tensor_new("OUT", TERN_INT32, one, 1, &seven, sizeof seven));
            tern_send(&s, &o, 0, &err);
            tern_send(&s, NULL, TERN_RESPONSE_COMPLETE_FINAL, &err);
            tern_sender_drop(&s);
            continue;
        }
        if (!c || count != 1 || c[0] < 0) {
            tern_result r = {0};
            tern_fail(&r, TERN_INVALID_ARG, "COUNT must be >= 0, got %d", c && count == 1 ? c[0] : -1);
            tern_send(&s, &r, TERN_RESPONSE_COMPLETE_FINAL, &err);
            tern_sender_drop(&s);
            continue;
        }
        static const int64_t shape[1] = {1};
        for (int32_t k = 0; k < c[0] && !tern_sender_is_cancelled(&s); k++) {
            tern_result r = {0};
            tern_add_output(&r, tern_tensor_new("OUT", TERN_INT32, shape, 1, &k, sizeof k));
            if (tern_send(&s, &r, 0, &err) != 0) break;
        }
        tern_send(&s, NULL, TERN_RESPONSE_COMPLETE_FINAL, &err);
        tern_sender_drop(&s);
    }
}

void tern_model_finalize(void) {}

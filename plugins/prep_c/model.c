/*
 * `prep_c`: the example preprocessing job in C (see plugins/prep_rust for
 * the reference). OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 = INPUT0 - INPUT1
 * (FP32 [4]); TEXT is normalised to NORMALIZED (ASCII lower-case, runs of
 * ASCII whitespace collapsed, trimmed) and its words hashed to TOKEN_IDS
 * (FNV-1a 32 mod 30000 + 1, first 8 words, 0-padded).
 */
#include <stdlib.h>
#include <string.h>

#include "tern_plugin.h"

#define MAX_TOKENS 8
#define VOCAB 30000u

static int is_space(uint8_t c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* Normalises `in` into `out` (at most in.len bytes) and fills `ids`; returns the output length. */
static size_t normalize(tern_str in, uint8_t *out, int32_t ids[MAX_TOKENS]) {
    size_t o = 0, words = 0;
    memset(ids, 0, MAX_TOKENS * sizeof(int32_t));
    for (size_t i = 0; i < in.len;) {
        while (i < in.len && is_space(in.ptr[i])) i++;
        if (i == in.len) break;
        if (words) out[o++] = ' ';
        uint32_t h = 0x811c9dc5u;
        while (i < in.len && !is_space(in.ptr[i])) {
            uint8_t c = in.ptr[i++];
            if (c >= 'A' && c <= 'Z') c += 32;
            out[o++] = c;
            h = (h ^ c) * 0x01000193u;
        }
        if (words < MAX_TOKENS) ids[words] = (int32_t)(h % VOCAB + 1);
        words++;
    }
    return o;
}

int tern_model_initialize(const tern_context *ctx, tern_error *err) {
    (void)err;
    tern_log(TERN_LOG_INFO, "%.*s ready on %.*s", (int)ctx->model_name.len, (const char *)ctx->model_name.ptr,
             (int)ctx->instance_name.len, (const char *)ctx->instance_name.ptr);
    return 0;
}

void tern_model_execute(const tern_request *reqs, size_t n, tern_result *results) {
    tern_batch a, b;
    tern_error err;
    if (tern_gather(reqs, n, "INPUT0", TERN_FP32, &a, &err) != 0) {
        tern_fail_all(results, n, &err);
        return;
    }
    if (tern_gather(reqs, n, "INPUT1", TERN_FP32, &b, &err) != 0) {
        tern_batch_free(&a);
        tern_fail_all(results, n, &err);
        return;
    }
    float *x = a.data, *y = b.data, *diff = malloc(a.count * sizeof(float));
    for (size_t i = 0; i < a.count; i++) {
        diff[i] = x[i] - y[i];
        x[i] = x[i] + y[i];
    }
    tern_split(&a, "OUTPUT0", TERN_FP32, x, results);
    tern_split(&a, "OUTPUT1", TERN_FP32, diff, results);
    free(diff);
    tern_batch_free(&a);
    tern_batch_free(&b);

    for (size_t r = 0; r < n; r++) {
        const tern_tensor *text = tern_input(&reqs[r], "TEXT");
        if (!text) {
            tern_fail(&results[r], TERN_INVALID_ARG, "request has no input 'TEXT'");
            continue;
        }
        uint8_t *norm = NULL;
        size_t norm_len = 0, rows = 0, offset = 0;
        int32_t *ids = NULL;
        tern_str s;
        int more;
        while ((more = tern_next_string(text, &offset, &s)) == 1) {
            uint8_t *buf = malloc(s.len ? s.len : 1);
            ids = realloc(ids, (rows + 1) * MAX_TOKENS * sizeof(int32_t));
            size_t len = normalize(s, buf, ids + rows * MAX_TOKENS);
            tern_bytes_append(&norm, &norm_len, buf, len);
            free(buf);
            rows++;
        }
        if (more < 0) {
            tern_fail(&results[r], TERN_INVALID_ARG, "input 'TEXT' holds malformed BYTES data");
        } else {
            int64_t shape_text[2] = {(int64_t)rows, 1}, shape_ids[2] = {(int64_t)rows, MAX_TOKENS};
            tern_add_output(&results[r], tern_tensor_new("NORMALIZED", TERN_BYTES, shape_text, 2, norm, norm_len));
            tern_add_output(&results[r], tern_tensor_new("TOKEN_IDS", TERN_INT32, shape_ids, 2, ids,
                                                         rows * MAX_TOKENS * sizeof(int32_t)));
        }
        free(norm);
        free(ids);
    }
}

void tern_model_finalize(void) {}

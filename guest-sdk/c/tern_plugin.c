/*
 * The C guest SDK: implements the component's `model` exports on top of the
 * plugin's tern_model_* functions, and the tensor, batch, BLS, log and
 * metric helpers declared in tern_plugin.h.
 */
#include "tern_plugin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) abort(); /* out of sandbox memory: the host reports the trap */
    return p;
}

static void dup_string(plugin_string_t *s, const char *text) {
    size_t n = strlen(text);
    s->ptr = xmalloc(n);
    memcpy(s->ptr, text, n);
    s->len = n;
}

/* The bindings were generated with --no-object-file: the component type
 * comes from wit/plugin.wit at link time (wasm-component-ld
 * --component-type), so the symbol the object would define lives here. */
void __component_type_object_force_link_plugin(void) {}

/* ---- exports ---- */

/* Set at initialize: a decoupled model answers through its senders. */
static int decoupled;

static int config_is_decoupled(const plugin_string_t *json) {
    static const char key[] = "\"decoupled\":true";
    size_t k = sizeof key - 1;
    for (size_t i = 0; i + k <= json->len; i++)
        if (memcmp(json->ptr + i, key, k) == 0) return 1;
    return 0;
}

bool exports_tern_plugin_model_initialize(exports_tern_plugin_model_model_context_t *ctx,
                                          exports_tern_plugin_model_error_t *err) {
    tern_error e = {TERN_INTERNAL, ""};
    decoupled = config_is_decoupled(&ctx->config_json);
    int rc = tern_model_initialize(ctx, &e);
    exports_tern_plugin_model_model_context_free(ctx);
    if (rc != 0) {
        err->code = (tern_plugin_types_error_code_t)e.code;
        dup_string(&err->message, e.message[0] ? e.message : "initialize failed");
        return false;
    }
    return true;
}

void exports_tern_plugin_model_execute(exports_tern_plugin_model_list_request_t *requests,
                                       exports_tern_plugin_model_list_result_response_error_t *ret) {
    size_t n = requests->len;
    tern_result *results = calloc(n ? n : 1, sizeof *results); /* all: ok, no outputs */
    if (!results) abort();
    tern_model_execute(requests->ptr, n, results);
    exports_tern_plugin_model_list_request_free(requests);
    if (decoupled) {
        /* Answered through the senders: an empty list. */
        for (size_t i = 0; i < n; i++) exports_tern_plugin_model_result_response_error_free(&results[i]);
        free(results);
        ret->ptr = NULL;
        ret->len = 0;
        return;
    }
    ret->ptr = results;
    ret->len = n;
}

void exports_tern_plugin_model_finalize(void) { tern_model_finalize(); }

/* ---- errors and logging ---- */

int tern_set_error(tern_error *err, tern_code code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    err->code = code;
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return -1;
}

static void fail_with(tern_result *r, tern_code code, const char *message) {
    if (r->is_err) {
        tern_plugin_types_error_free(&r->val.err);
    } else {
        tern_plugin_types_response_free(&r->val.ok);
    }
    r->is_err = true;
    r->val.err.code = (tern_plugin_types_error_code_t)code;
    dup_string(&r->val.err.message, message);
}

/* " (at model.c:42 in fn)" for a call site, with the file's base name. */
static void where(char *out, size_t size, const char *file, int line, const char *func) {
    const char *base = strrchr(file, '/');
    snprintf(out, size, " (at %s:%d in %s)", base ? base + 1 : file, line, func);
}

void tern_fail_at(const char *file, int line, const char *func, tern_result *result, tern_code code,
                  const char *fmt, ...) {
    char message[512], at[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    where(at, sizeof at, file, line, func);
    size_t len = strlen(message);
    snprintf(message + len, sizeof message - len, "%s", at);
    fail_with(result, code, message);
}

void tern_fail_all_at(const char *file, int line, const char *func, tern_result *results, size_t n,
                      const tern_error *err) {
    char message[sizeof err->message + 160], at[160];
    where(at, sizeof at, file, line, func);
    snprintf(message, sizeof message, "%s%s", err->message, at);
    for (size_t i = 0; i < n; i++) fail_with(&results[i], err->code, message);
}

void tern_log(tern_log_level level, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    plugin_string_t s;
    plugin_string_set(&s, line);
    tern_plugin_host_log((tern_plugin_host_log_level_t)level, &s);
}

/* ---- reading tensors ---- */

static int name_is(const plugin_string_t *s, const char *name) {
    size_t n = strlen(name);
    return s->len == n && memcmp(s->ptr, name, n) == 0;
}

const tern_tensor *tern_input(const tern_request *req, const char *name) {
    for (size_t i = 0; i < req->inputs.len; i++) {
        if (name_is(&req->inputs.ptr[i].name, name)) return &req->inputs.ptr[i];
    }
    return NULL;
}

size_t tern_element_count(const tern_tensor *t) {
    size_t n = 1;
    for (size_t i = 0; i < t->shape.len; i++) n *= t->shape.ptr[i] > 0 ? (size_t)t->shape.ptr[i] : 0;
    return n;
}

size_t tern_dtype_size(tern_dtype dtype) {
    switch (dtype) {
    case TERN_BOOL: case TERN_UINT8: case TERN_INT8: return 1;
    case TERN_UINT16: case TERN_INT16: case TERN_FP16: case TERN_BF16: return 2;
    case TERN_UINT32: case TERN_INT32: case TERN_FP32: return 4;
    case TERN_UINT64: case TERN_INT64: case TERN_FP64: return 8;
    default: return 0;
    }
}

const void *tern_data(const tern_tensor *t, tern_dtype dtype, size_t *count, tern_error *err) {
    size_t size = tern_dtype_size(dtype);
    if (t->datatype != dtype || size == 0) {
        tern_set_error(err, TERN_INVALID_ARG, "tensor '%.*s': not of the requested fixed-size type",
                       (int)t->name.len, (const char *)t->name.ptr);
        return NULL;
    }
    *count = t->data.len / size;
    return t->data.ptr;
}

int tern_next_string(const tern_tensor *t, size_t *offset, tern_str *out) {
    if (t->datatype != TERN_BYTES) return -1;
    size_t at = *offset;
    if (at >= t->data.len) return 0;
    if (t->data.len - at < 4) return -1;
    uint32_t n;
    memcpy(&n, t->data.ptr + at, 4);
    if (t->data.len - at - 4 < n) return -1;
    out->ptr = t->data.ptr + at + 4;
    out->len = n;
    *offset = at + 4 + n;
    return 1;
}

int tern_config_parameter(const tern_context *ctx, const char *key, char *buf, size_t cap) {
    /* config_json renders parameters as "key":{"string_value":"..."}. */
    char needle[256];
    int w = snprintf(needle, sizeof needle, "\"%s\":{\"string_value\":\"", key);
    if (w < 0 || (size_t)w >= sizeof needle || cap == 0) return -1;
    const char *json = (const char *)ctx->config_json.ptr;
    size_t len = ctx->config_json.len, nl = (size_t)w;
    for (size_t i = 0; i + nl <= len; i++) {
        if (memcmp(json + i, needle, nl) != 0) continue;
        size_t o = 0;
        for (size_t j = i + nl; j < len && json[j] != '"' && o + 1 < cap; j++) {
            if (json[j] == '\\' && j + 1 < len) j++;
            buf[o++] = json[j];
        }
        buf[o] = 0;
        return 0;
    }
    return -1;
}

/* ---- building outputs ---- */

tern_tensor tern_tensor_new(const char *name, tern_dtype dtype, const int64_t *shape, size_t ndim,
                            const void *data, size_t nbytes) {
    tern_tensor t;
    dup_string(&t.name, name);
    t.datatype = (tern_plugin_types_data_type_t)dtype;
    t.shape.ptr = xmalloc(ndim * sizeof(int64_t));
    if (ndim) memcpy(t.shape.ptr, shape, ndim * sizeof(int64_t));
    t.shape.len = ndim;
    t.data.ptr = xmalloc(nbytes);
    if (nbytes) memcpy(t.data.ptr, data, nbytes);
    t.data.len = nbytes;
    return t;
}

int tern_bytes_append(uint8_t **buf, size_t *len, const void *item, size_t item_len) {
    uint8_t *grown = realloc(*buf, *len + 4 + item_len);
    if (!grown) return -1;
    uint32_t n = (uint32_t)item_len;
    memcpy(grown + *len, &n, 4);
    if (item_len) memcpy(grown + *len + 4, item, item_len);
    *buf = grown;
    *len += 4 + item_len;
    return 0;
}

void tern_add_output(tern_result *result, tern_tensor t) {
    if (result->is_err) {
        tern_plugin_types_tensor_free(&t);
        return;
    }
    tern_plugin_types_list_tensor_t *outs = &result->val.ok.outputs;
    tern_tensor *grown = realloc(outs->ptr, (outs->len + 1) * sizeof *grown);
    if (!grown) abort();
    grown[outs->len++] = t;
    outs->ptr = grown;
}

/* ---- batch helpers ---- */

int tern_gather(const tern_request *reqs, size_t n, const char *name, tern_dtype dtype, tern_batch *out,
                tern_error *err) {
    memset(out, 0, sizeof *out);
    out->dtype = dtype;
    size_t size = tern_dtype_size(dtype);
    if (size == 0) return tern_set_error(err, TERN_UNSUPPORTED, "tern_gather: BYTES inputs are read per request");
    out->sizes = xmalloc(n * sizeof(size_t));
    out->n_requests = n;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const tern_tensor *t = tern_input(&reqs[i], name);
        if (!t) return tern_batch_free(out), tern_set_error(err, TERN_INVALID_ARG, "request has no input '%s'", name);
        if (t->datatype != dtype)
            return tern_batch_free(out), tern_set_error(err, TERN_INVALID_ARG, "input '%s' has another datatype", name);
        if (t->shape.len == 0 || t->shape.len - 1 > TERN_MAX_DIMS)
            return tern_batch_free(out), tern_set_error(err, TERN_INVALID_ARG, "input '%s' has no batch dimension", name);
        if (i == 0) {
            out->inner_ndim = t->shape.len - 1;
            memcpy(out->inner, t->shape.ptr + 1, out->inner_ndim * sizeof(int64_t));
        } else if (t->shape.len - 1 != out->inner_ndim ||
                   memcmp(out->inner, t->shape.ptr + 1, out->inner_ndim * sizeof(int64_t)) != 0) {
            return tern_batch_free(out),
                   tern_set_error(err, TERN_INVALID_ARG, "input '%s': requests in one batch have different shapes", name);
        }
        out->sizes[i] = t->shape.ptr[0] > 0 ? (size_t)t->shape.ptr[0] : 0;
        total += t->data.len;
    }
    out->data = xmalloc(total);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const tern_tensor *t = tern_input(&reqs[i], name);
        memcpy((uint8_t *)out->data + at, t->data.ptr, t->data.len);
        at += t->data.len;
    }
    out->count = total / size;
    return 0;
}

void tern_split(const tern_batch *b, const char *name, tern_dtype dtype, const void *data, tern_result *results) {
    size_t row = 1, size = tern_dtype_size(dtype);
    for (size_t d = 0; d < b->inner_ndim; d++) row *= b->inner[d] > 0 ? (size_t)b->inner[d] : 0;
    int64_t shape[TERN_MAX_DIMS + 1];
    memcpy(shape + 1, b->inner, b->inner_ndim * sizeof(int64_t));
    const uint8_t *p = data;
    for (size_t i = 0; i < b->n_requests; i++) {
        size_t nbytes = b->sizes[i] * row * size;
        shape[0] = (int64_t)b->sizes[i];
        tern_add_output(&results[i], tern_tensor_new(name, dtype, shape, b->inner_ndim + 1, p, nbytes));
        p += nbytes;
    }
}

void tern_batch_free(tern_batch *b) {
    free(b->data);
    free(b->sizes);
    b->data = NULL;
    b->sizes = NULL;
}

/* ---- BLS ---- */

/* A BLS request for the latest version of `model` (borrows `inputs`). */
static tern_plugin_host_infer_request_t bls_request(const char *model, const tern_tensor *inputs, size_t n_inputs) {
    tern_plugin_host_infer_request_t req;
    memset(&req, 0, sizeof req);
    plugin_string_set(&req.model_name, model);
    req.model_version = -1;
    req.inputs.ptr = (tern_tensor *)inputs;
    req.inputs.len = n_inputs;
    return req;
}

int tern_infer(const char *model, const tern_tensor *inputs, size_t n_inputs, tern_response *out, tern_error *err) {
    tern_plugin_host_infer_request_t req = bls_request(model, inputs, n_inputs);
    tern_plugin_host_error_t e;
    if (tern_plugin_host_infer(&req, out, &e)) return 0;
    tern_set_error(err, (tern_code)e.code, "%.*s", (int)e.message.len, (const char *)e.message.ptr);
    tern_plugin_host_error_free(&e);
    return -1;
}

const tern_tensor *tern_response_output(const tern_response *r, const char *name) {
    for (size_t i = 0; i < r->outputs.len; i++) {
        if (name_is(&r->outputs.ptr[i].name, name)) return &r->outputs.ptr[i];
    }
    return NULL;
}

void tern_response_free(tern_response *r) { tern_plugin_types_response_free(r); }

/* ---- custom metrics ---- */

int tern_metric_family(const char *name, const char *help, tern_metric_kind kind, const double *buckets,
                       size_t n_buckets, uint32_t *id, tern_error *err) {
    plugin_string_t n, h;
    plugin_string_set(&n, name);
    plugin_string_set(&h, help);
    plugin_list_f64_t b = {(double *)buckets, n_buckets};
    tern_plugin_host_error_t e;
    if (tern_plugin_host_metric_family(&n, &h, (tern_plugin_host_metric_kind_t)kind, &b, id, &e)) return 0;
    tern_set_error(err, (tern_code)e.code, "%.*s", (int)e.message.len, (const char *)e.message.ptr);
    tern_plugin_host_error_free(&e);
    return -1;
}

static int metric_call(int set, uint32_t id, const char *const (*labels)[2], size_t n_labels, double value) {
    plugin_tuple2_string_string_t pairs[16];
    if (n_labels > 16) return -1;
    for (size_t i = 0; i < n_labels; i++) {
        plugin_string_set(&pairs[i].f0, labels[i][0]);
        plugin_string_set(&pairs[i].f1, labels[i][1]);
    }
    plugin_list_tuple2_string_string_t list = {pairs, n_labels};
    tern_plugin_host_error_t e;
    bool ok = set ? tern_plugin_host_metric_set(id, &list, value, &e) : tern_plugin_host_metric_record(id, &list, value, &e);
    if (ok) return 0;
    tern_plugin_host_error_free(&e);
    return -1;
}

int tern_metric_record(uint32_t id, const char *const (*labels)[2], size_t n_labels, double value) {
    return metric_call(0, id, labels, n_labels, value);
}

int tern_metric_set(uint32_t id, const char *const (*labels)[2], size_t n_labels, double value) {
    return metric_call(1, id, labels, n_labels, value);
}

/* ---- decoupled models ---- */

static int from_wit_error(tern_plugin_types_error_t *e, tern_error *err) {
    if (err) {
        err->code = (tern_code)e->code;
        size_t len = e->message.len < sizeof err->message - 1 ? e->message.len : sizeof err->message - 1;
        memcpy(err->message, e->message.ptr, len);
        err->message[len] = 0;
    }
    tern_plugin_types_error_free(e);
    return -1;
}

int tern_response_sender(size_t index, tern_sender *out, tern_error *err) {
    tern_plugin_types_error_t e;
    if (!tern_plugin_responses_sender((uint32_t)index, &out->handle, &e)) return from_wit_error(&e, err);
    return 0;
}

int tern_send(const tern_sender *s, tern_result *response, uint32_t flags, tern_error *err) {
    tern_plugin_responses_borrow_response_sender_t b = tern_plugin_responses_borrow_response_sender(s->handle);
    tern_plugin_types_error_t e;
    bool ok;
    if (response && response->is_err && (flags & TERN_RESPONSE_COMPLETE_FINAL)) {
        ok = tern_plugin_responses_method_response_sender_send_error(b, &response->val.err, &e);
    } else if (response && response->is_err) {
        /* An error response; the stream stays open (contract 0.1.3). */
        ok = tern_plugin_responses_method_response_sender_send_error_response(b, &response->val.err, flags, &e);
    } else {
        ok = tern_plugin_responses_method_response_sender_send(b, response ? &response->val.ok : NULL, flags, &e);
    }
    if (response) {
        exports_tern_plugin_model_result_response_error_free(response);
        memset(response, 0, sizeof *response);
    }
    if (!ok) return from_wit_error(&e, err);
    return 0;
}

int tern_sender_is_cancelled(const tern_sender *s) {
    return tern_plugin_responses_method_response_sender_is_cancelled(
        tern_plugin_responses_borrow_response_sender(s->handle));
}

void tern_sender_drop(tern_sender *s) { tern_plugin_responses_response_sender_drop_own(s->handle); }

int tern_is_cancelled(size_t index) { return tern_plugin_responses_is_cancelled((uint32_t)index); }

int tern_infer_stream(const char *model, const tern_tensor *inputs, size_t n_inputs, tern_stream *out, tern_error *err) {
    tern_plugin_host_infer_request_t req = bls_request(model, inputs, n_inputs);
    tern_plugin_types_error_t e;
    if (!tern_plugin_responses_infer_stream(&req, &out->handle, &e)) return from_wit_error(&e, err);
    return 0;
}

int tern_stream_next(const tern_stream *s, tern_response *out, tern_error *err) {
    tern_plugin_responses_result_response_error_t r;
    if (!tern_plugin_responses_method_response_stream_next(tern_plugin_responses_borrow_response_stream(s->handle), &r))
        return 0;
    if (r.is_err) return from_wit_error(&r.val.err, err);
    *out = r.val.ok;
    return 1;
}

void tern_stream_drop(tern_stream *s) { tern_plugin_responses_response_stream_drop_own(s->handle); }

/* ---- native kernels ---- */

int tern_ops_error(tern_plugin_ops_error_t *e, tern_error *err) { return from_wit_error(e, err); }

int tern_array_input(size_t index, const char *name, tern_array *out, tern_error *err) {
    plugin_string_t n;
    tern_plugin_ops_error_t e;
    plugin_string_set(&n, name);
    return tern_plugin_ops_static_array_input((uint32_t)index, &n, out, &e) ? 0 : from_wit_error(&e, err);
}

int tern_array_from(tern_dtype dtype, const int64_t *shape, size_t ndim, const void *data, size_t len,
                    tern_array *out, tern_error *err) {
    plugin_list_s64_t s = {(int64_t *)shape, ndim};
    plugin_list_u8_t d = {(uint8_t *)data, len};
    tern_plugin_ops_error_t e;
    return tern_plugin_ops_static_array_from_data((tern_plugin_types_data_type_t)dtype, &s, &d, out, &e)
               ? 0
               : from_wit_error(&e, err);
}

int tern_set_output(size_t index, const char *name, tern_array a, tern_error *err) {
    plugin_string_t n;
    tern_plugin_ops_error_t e;
    plugin_string_set(&n, name);
    return tern_plugin_ops_set_output((uint32_t)index, &n, TERN_BORROW(a), &e) ? 0 : from_wit_error(&e, err);
}

void tern_array_data(tern_array a, plugin_list_u8_t *out) { tern_plugin_ops_method_array_data(TERN_BORROW(a), out); }

void tern_array_drop(tern_array a) { tern_plugin_ops_array_drop_own(a); }

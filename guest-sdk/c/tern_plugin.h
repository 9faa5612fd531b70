/*
 * Write Tern plugins in C.
 *
 * A plugin is a model whose implementation is a WebAssembly component of
 * the `tern:plugin` world (wit/plugin.wit). This header is a thin layer
 * over the bindings `wit-bindgen c` generated (bindings/plugin.h): you
 * implement three functions, read inputs as pointer + length views, and
 * build outputs with helpers that own their memory.
 *
 *   #include "tern_plugin.h"
 *
 *   int tern_model_initialize(const tern_context *ctx, tern_error *err) { return 0; }
 *
 *   void tern_model_execute(const tern_request *reqs, size_t n, tern_result *results) {
 *       tern_batch x;
 *       tern_error err;
 *       if (tern_gather(reqs, n, "INPUT0", TERN_FP32, &x, &err) != 0) {
 *           tern_fail_all(results, n, &err);
 *           return;
 *       }
 *       float *y = (float *)x.data;               // gather copied: writable
 *       for (size_t i = 0; i < x.count; i++) y[i] += 1;
 *       tern_split(&x, "OUTPUT0", TERN_FP32, y, results);
 *       tern_batch_free(&x);
 *   }
 *
 *   void tern_model_finalize(void) {}
 *
 * Every entry of `results` starts as an empty successful response; add
 * outputs with tern_add_output()/tern_split(), or turn it into an error
 * with tern_fail(). The SDK frees the requests after tern_model_execute
 * returns and the results after the host has copied them.
 *
 * Build: `tern plugin build <dir>` (clang --target=wasm32-wasi, linked into
 * a component by wasm-component-ld; see docs/plugins.md).
 */
#ifndef TERN_PLUGIN_H
#define TERN_PLUGIN_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "bindings/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef tern_plugin_types_tensor_t tern_tensor;
typedef tern_plugin_types_request_t tern_request;
typedef tern_plugin_types_model_context_t tern_context;
typedef exports_tern_plugin_model_result_response_error_t tern_result;
typedef tern_plugin_types_response_t tern_response;

/* Triton's data types. */
typedef enum {
    TERN_BOOL = TERN_PLUGIN_TYPES_DATA_TYPE_BOOL,
    TERN_UINT8 = TERN_PLUGIN_TYPES_DATA_TYPE_UINT8,
    TERN_UINT16 = TERN_PLUGIN_TYPES_DATA_TYPE_UINT16,
    TERN_UINT32 = TERN_PLUGIN_TYPES_DATA_TYPE_UINT32,
    TERN_UINT64 = TERN_PLUGIN_TYPES_DATA_TYPE_UINT64,
    TERN_INT8 = TERN_PLUGIN_TYPES_DATA_TYPE_INT8,
    TERN_INT16 = TERN_PLUGIN_TYPES_DATA_TYPE_INT16,
    TERN_INT32 = TERN_PLUGIN_TYPES_DATA_TYPE_INT32,
    TERN_INT64 = TERN_PLUGIN_TYPES_DATA_TYPE_INT64,
    TERN_FP16 = TERN_PLUGIN_TYPES_DATA_TYPE_FP16,
    TERN_FP32 = TERN_PLUGIN_TYPES_DATA_TYPE_FP32,
    TERN_FP64 = TERN_PLUGIN_TYPES_DATA_TYPE_FP64,
    TERN_BYTES = TERN_PLUGIN_TYPES_DATA_TYPE_BYTES,
    TERN_BF16 = TERN_PLUGIN_TYPES_DATA_TYPE_BF16,
} tern_dtype;

/* Triton's error codes. */
typedef enum {
    TERN_UNKNOWN = TERN_PLUGIN_TYPES_ERROR_CODE_UNKNOWN,
    TERN_INTERNAL = TERN_PLUGIN_TYPES_ERROR_CODE_INTERNAL,
    TERN_NOT_FOUND = TERN_PLUGIN_TYPES_ERROR_CODE_NOT_FOUND,
    TERN_INVALID_ARG = TERN_PLUGIN_TYPES_ERROR_CODE_INVALID_ARG,
    TERN_UNAVAILABLE = TERN_PLUGIN_TYPES_ERROR_CODE_UNAVAILABLE,
    TERN_UNSUPPORTED = TERN_PLUGIN_TYPES_ERROR_CODE_UNSUPPORTED,
    TERN_ALREADY_EXISTS = TERN_PLUGIN_TYPES_ERROR_CODE_ALREADY_EXISTS,
    TERN_CANCELLED = TERN_PLUGIN_TYPES_ERROR_CODE_CANCELLED,
} tern_code;

/* Log levels. */
typedef enum {
    TERN_LOG_ERROR = TERN_PLUGIN_HOST_LOG_LEVEL_ERROR,
    TERN_LOG_WARN = TERN_PLUGIN_HOST_LOG_LEVEL_WARN,
    TERN_LOG_INFO = TERN_PLUGIN_HOST_LOG_LEVEL_INFO,
    TERN_LOG_VERBOSE = TERN_PLUGIN_HOST_LOG_LEVEL_VERBOSE,
} tern_log_level;

/* An error: a code and a message (fixed buffer, truncated if longer). */
typedef struct {
    tern_code code;
    char message[256];
} tern_error;

/* A byte string view: pointer + length (not NUL-terminated). */
typedef struct {
    const uint8_t *ptr;
    size_t len;
} tern_str;

/* ---- what the plugin implements ---- */

/* Called once per instance; return 0, or fill `err` and return -1 to fail the load. */
int tern_model_initialize(const tern_context *ctx, tern_error *err);
/* Runs a batch of `n` requests; `results[i]` answers `reqs[i]`. */
void tern_model_execute(const tern_request *reqs, size_t n, tern_result *results);
/* Called when the instance is unloaded. */
void tern_model_finalize(void);

/* ---- errors and logging ---- */

/* Fills `err` (printf-style) and returns -1. */
int tern_set_error(tern_error *err, tern_code code, const char *fmt, ...);
/* Turns `result` into an error (printf-style message); drops outputs added so
 * far. The message ends with where it was called: "... (at model.c:42 in fn)". */
#define tern_fail(result, code, ...) tern_fail_at(__FILE__, __LINE__, __func__, result, code, __VA_ARGS__)
/* tern_fail() for every one of `n` results with the same error. */
#define tern_fail_all(results, n, err) tern_fail_all_at(__FILE__, __LINE__, __func__, results, n, err)
void tern_fail_at(const char *file, int line, const char *func, tern_result *result, tern_code code,
                  const char *fmt, ...);
void tern_fail_all_at(const char *file, int line, const char *func, tern_result *results, size_t n,
                      const tern_error *err);
/* Writes a line to the server's log (printf-style). */
void tern_log(tern_log_level level, const char *fmt, ...);

/* ---- reading tensors ---- */

/* The request's input `name`, or NULL. */
const tern_tensor *tern_input(const tern_request *req, const char *name);
/* Number of elements (product of the shape). */
size_t tern_element_count(const tern_tensor *t);
/* Size of one element of `dtype` in bytes (0 for BYTES). */
size_t tern_dtype_size(tern_dtype dtype);
/* The data as `dtype` elements, or NULL (and `err` filled) if the tensor has another type. */
const void *tern_data(const tern_tensor *t, tern_dtype dtype, size_t *count, tern_error *err);
/* Iterates a BYTES tensor: `*offset` starts at 0; returns 1 and fills `out`
 * while elements remain, 0 at the end, -1 on malformed data. */
int tern_next_string(const tern_tensor *t, size_t *offset, tern_str *out);
/* A config.pbtxt `parameters` string value from ctx->config_json into `buf`; 0 or -1 if absent. */
int tern_config_parameter(const tern_context *ctx, const char *key, char *buf, size_t cap);

/* ---- building outputs ---- */

/* A tensor copying `nbytes` of `data`; BYTES data must already be length-prefixed. */
tern_tensor tern_tensor_new(const char *name, tern_dtype dtype, const int64_t *shape, size_t ndim,
                            const void *data, size_t nbytes);
/* Appends one length-prefixed element to a growing BYTES buffer (`*buf`/`*len` start NULL/0). */
int tern_bytes_append(uint8_t **buf, size_t *len, const void *item, size_t item_len);
/* Adds an output to a successful result (takes ownership of `t`). */
void tern_add_output(tern_result *result, tern_tensor t);

/* ---- batch helpers (models with max_batch_size > 0) ---- */

#define TERN_MAX_DIMS 8

/* One input gathered across a request list. */
typedef struct {
    tern_dtype dtype;
    void *data;          /* all values, request after request (a malloc'd copy) */
    size_t count;        /* number of elements in `data` */
    size_t n_requests;
    size_t *sizes;       /* each request's batch size (first dimension) */
    int64_t inner[TERN_MAX_DIMS]; /* dimensions after the batch dimension */
    size_t inner_ndim;
} tern_batch;

/* Concatenates input `name` (of type `dtype`) of all requests; 0, or -1 with `err`. */
int tern_gather(const tern_request *reqs, size_t n, const char *name, tern_dtype dtype, tern_batch *out,
                tern_error *err);
/* Splits batch-wide `data` (batch rows of the gathered inner shape) into one
 * output per request, added to `results`. */
void tern_split(const tern_batch *b, const char *name, tern_dtype dtype, const void *data, tern_result *results);
/* Frees what tern_gather allocated. */
void tern_batch_free(tern_batch *b);

/* ---- BLS ---- */

/* Runs `model` (latest version) with `inputs` in-process; 0 and `out` filled
 * (free with tern_response_free), or -1 with `err`. */
int tern_infer(const char *model, const tern_tensor *inputs, size_t n_inputs, tern_response *out, tern_error *err);
/* The output `name` of a BLS response, or NULL. */
const tern_tensor *tern_response_output(const tern_response *r, const char *name);
/* Frees a BLS response. */
void tern_response_free(tern_response *r);

/* ---- custom metrics ---- */

typedef enum {
    TERN_COUNTER = TERN_PLUGIN_HOST_METRIC_KIND_COUNTER,
    TERN_GAUGE = TERN_PLUGIN_HOST_METRIC_KIND_GAUGE,
    TERN_HISTOGRAM = TERN_PLUGIN_HOST_METRIC_KIND_HISTOGRAM,
} tern_metric_kind;

/* Declares a metric family; 0 and `*id`, or -1 with `err`. */
int tern_metric_family(const char *name, const char *help, tern_metric_kind kind, const double *buckets,
                       size_t n_buckets, uint32_t *id, tern_error *err);
/* Counter/gauge: add; histogram: observe. `labels` holds `n_labels` name/value pairs. */
int tern_metric_record(uint32_t id, const char *const (*labels)[2], size_t n_labels, double value);
/* Gauge: set. */
int tern_metric_set(uint32_t id, const char *const (*labels)[2], size_t n_labels, double value);

/* ---- decoupled models (model_transaction_policy { decoupled: true }) ----
 *
 * Each request is answered through its response sender: any number of
 * responses, then TERN_RESPONSE_COMPLETE_FINAL, during tern_model_execute or
 * a later call (keep the sender). `results` are ignored for decoupled
 * models.
 *
 *   tern_sender s;
 *   if (tern_response_sender(i, &s, &err) == 0) {
 *       tern_result r = {0};                       // an empty response
 *       tern_add_output(&r, tensor);
 *       tern_send(&s, &r, 0, &err);                 // frees r's contents
 *       tern_send(&s, NULL, TERN_RESPONSE_COMPLETE_FINAL, &err);
 *       tern_sender_drop(&s);
 *   }
 */
#define TERN_RESPONSE_COMPLETE_FINAL 1u

typedef struct {
    tern_plugin_responses_own_response_sender_t handle;
} tern_sender;

/* The response sender of request `index` of the running batch. */
int tern_response_sender(size_t index, tern_sender *out, tern_error *err);
/* Sends `response` (NULL: only the flags; a result turned into an error with
 * tern_fail() is an error response: the request's last message with
 * TERN_RESPONSE_COMPLETE_FINAL, else more responses may follow) and frees
 * its contents. */
int tern_send(const tern_sender *s, tern_result *response, uint32_t flags, tern_error *err);
/* Whether the client has gone away. */
int tern_sender_is_cancelled(const tern_sender *s);
/* Releases a sender (sending the final flag if it was not sent). */
void tern_sender_drop(tern_sender *s);
/* Whether the client of request `index` of the running batch has gone away. */
int tern_is_cancelled(size_t index);

/* Streaming BLS (Triton's exec(decoupled=True)): every response `model`
 * sends, as it sends them (many for a decoupled model, one for another).
 *
 *   tern_stream st;
 *   tern_response r;
 *   if (tern_infer_stream("model", inputs, n, &st, &err) == 0) {
 *       int got;
 *       while ((got = tern_stream_next(&st, &r, &err)) == 1) { ...; tern_response_free(&r); }
 *       tern_stream_drop(&st);   // got == 0: ended; -1: `err` holds the model's error
 *   }
 */
typedef struct {
    tern_plugin_responses_own_response_stream_t handle;
} tern_stream;

int tern_infer_stream(const char *model, const tern_tensor *inputs, size_t n_inputs, tern_stream *out, tern_error *err);
/* 1: a response in `out` (free with tern_response_free); 0: the stream ended; -1: an error in `err`. */
int tern_stream_next(const tern_stream *s, tern_response *out, tern_error *err);
/* Releases the stream (cancelling the request if it has not ended). */
void tern_stream_drop(tern_stream *s);

/* ---- native kernels (tern:plugin/ops) ----
 *
 * Arrays the host holds, and the kernels of docs/plugins.md, called as the
 * generated `tern_plugin_ops_*` functions of bindings/plugin.h with
 * TERN_BORROW(a) for array arguments; a failed call's error converts with
 * tern_ops_error. These helpers cover the calls every plugin makes:
 *
 *   tern_array img, blob;
 *   tern_plugin_ops_error_t e;
 *   plugin_list_f64_t none = {0};   // no mean / std
 *   if (tern_array_input(i, "IMAGE_RGB", &img, &err) != 0) ...;
 *   if (!tern_plugin_ops_normalize(TERN_BORROW(img), TERN_PLUGIN_OPS_LAYOUT_NCHW,
 *           TERN_FP32, 1.0 / 255, &none, &none, &blob, &e))
 *       return tern_ops_error(&e, &err);
 *   tern_set_output(i, "images", blob, &err);   // no copy through the plugin
 *   tern_array_drop(img); tern_array_drop(blob);
 */
typedef tern_plugin_ops_own_array_t tern_array;
#define TERN_BORROW(a) tern_plugin_ops_borrow_array(a)

/* Fills `err` from a kernel's error, frees it, returns -1. */
int tern_ops_error(tern_plugin_ops_error_t *e, tern_error *err);
/* Input `name` of request `index` of the running batch as a host array (no copy). */
int tern_array_input(size_t index, const char *name, tern_array *out, tern_error *err);
/* A host array of `len` bytes of elements. */
int tern_array_from(tern_dtype dtype, const int64_t *shape, size_t ndim, const void *data, size_t len,
                    tern_array *out, tern_error *err);
/* Makes `a` output `name` of request `index`'s response (no copy; `a` stays the plugin's). */
int tern_set_output(size_t index, const char *name, tern_array a, tern_error *err);
/* The elements, copied into the plugin: free the list with plugin_list_u8_free. */
void tern_array_data(tern_array a, plugin_list_u8_t *out);
/* Releases an array. */
void tern_array_drop(tern_array a);

#ifdef __cplusplus
}
#endif
#endif

/* SPDX-License-Identifier: Apache-2.0 */
/* The C ABI of the core module ferry._ferry, for native extensions that must share no C++ types with it
 * (the libtorch op library ferry._torch_ops, an engine's own consumer):
 *
 *   - ferry._ferry._capi: a PyCapsule named FERRY_CAPI_NAME holding a `const ferry_capi*` (versioned table
 *     of function pointers). A channel is named by its integer handle, `ferry.Channel.handle`.
 *   - a native sink: a PyCapsule named FERRY_SINK_NAME holding a `ferry_sink*`, passed to
 *     `ferry.Channel(..., sink=capsule)`; its `fn` is called on the drain thread, without the GIL, once per
 *     delivered entry, in entry order. The entry's bytes are valid only during the call.
 *
 * Plain C, so any compiler (g++, clang++, nvcc) can include it. */
#ifndef FERRY_PYTHON_CAPI_H
#define FERRY_PYTHON_CAPI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FERRY_CAPI_NAME "ferry._ferry._capi"
/* Version 2 appended capture_deferred and flush, version 3 capture_rows; a table of version N starts with the
 * members of every version before N. */
#define FERRY_CAPI_VERSION 3u
#define FERRY_SINK_NAME "ferry.sink"
#define FERRY_SINK_VERSION 1u
/** ferry_capi::capture's `stream` meaning "the stream given to the channel's open begin_forward". */
#define FERRY_STREAM_OF_FORWARD (~(uintptr_t)0)

/** Status of a C ABI call; not FERRY_OK means `err` holds the C++ message. */
typedef enum ferry_status {
  FERRY_OK = 0,
  FERRY_ERR_LOGIC = 1,       /**< ferry.LogicError: bad input or misuse (closed channel, no open forward) */
  FERRY_ERR_OOM = 2,         /**< ferry.OutOfMemory */
  FERRY_ERR_TIMEOUT = 3,     /**< ferry.TimeoutError */
  FERRY_ERR_INVALIDATED = 4, /**< ferry.InvalidatedError: the channel failed earlier */
  FERRY_ERR_BACKEND = 5,     /**< ferry.BackendError */
  FERRY_ERR_OTHER = 6,       /**< ferry.Error or an unknown exception */
  FERRY_ERR_SHUTDOWN = 7,    /**< ferry.ShutdownError: close() could not drain every reserved entry */
  FERRY_ERR_SIZE_OVERFLOW = 8, /**< ferry.SizeOverflowError: a dynamic entry's size exceeded its reservation */
  FERRY_ERR_IO = 9,           /**< ferry.IOError (an OSError): a sink's file operation failed (appended: callers
                                   built against an older header see it as ferry.Error) */
  /* the shared-memory stream (ferry.sinks.shm_stream, ferry.ShmReader); appended like FERRY_ERR_IO */
  FERRY_ERR_STREAM_BUSY = 10,     /**< ferry.StreamBusyError: a second reader, or a name a live producer holds */
  FERRY_ERR_LAYOUT_VERSION = 11,  /**< ferry.LayoutVersionError: a reader of another stream layout version */
  FERRY_ERR_READER_DETACHED = 12, /**< ferry.ReaderDetachedError: the producer ended the reader's session */
  FERRY_ERR_PRODUCER_GONE = 13,   /**< ferry.ProducerGoneError: the stream's producer died */
  FERRY_ERR_ATTRIBUTION_OVERFLOW = 14 /**< ferry.AttributionOverflowError: a stream entry's forward attribution did
                                           not fit the stream's record region */
} ferry_status;

/** The name of the ferry exception class of `status` ("LogicError", ...; "Error" for any other), the one
 * table every layer (the core module, the C ABI, the torch ops) names its errors by. */
static inline const char* ferry_status_name(int status)
{
  switch (status) {
    case FERRY_ERR_LOGIC: return "LogicError";
    case FERRY_ERR_OOM: return "OutOfMemory";
    case FERRY_ERR_TIMEOUT: return "TimeoutError";
    case FERRY_ERR_INVALIDATED: return "InvalidatedError";
    case FERRY_ERR_BACKEND: return "BackendError";
    case FERRY_ERR_SHUTDOWN: return "ShutdownError";
    case FERRY_ERR_SIZE_OVERFLOW: return "SizeOverflowError";
    case FERRY_ERR_IO: return "IOError";
    case FERRY_ERR_STREAM_BUSY: return "StreamBusyError";
    case FERRY_ERR_LAYOUT_VERSION: return "LayoutVersionError";
    case FERRY_ERR_READER_DETACHED: return "ReaderDetachedError";
    case FERRY_ERR_PRODUCER_GONE: return "ProducerGoneError";
    case FERRY_ERR_ATTRIBUTION_OVERFLOW: return "AttributionOverflowError";
    default: return "Error";
  }
}

/** ferry_capi::channel_info flags: a forward is open, and it is being captured into a graph (graph mode). */
#define FERRY_INFO_FORWARD_OPEN 1u
#define FERRY_INFO_FORWARD_CAPTURING 2u

/** The backend a channel runs on (ferry_capi::channel_info). */
typedef enum ferry_backend_kind { FERRY_BACKEND_HOST = 0, FERRY_BACKEND_CUDA = 1 } ferry_backend_kind;

/** One delivered D2H entry, as a native sink sees it. */
typedef struct ferry_entry {
  uint32_t hook;
  uint32_t ok;       /**< 0 for a rejected dynamic entry (size over its reservation; data is then NULL) */
  uint64_t seq;
  uint64_t size;     /**< bytes at data */
  const void* data;  /**< pinned staging, valid until fn returns */
} ferry_entry;

/** ferry_capi::capture_rows' selection, field by field d2h::row_selection (ferry/d2h/row_selection.hpp):
 * form 0 rows (`indices`: int32 or int64 row indices, index_bytes 4 or 8), 1 the last token and 2 the window
 * [window_begin, window_end) of each request in `indices` (int32 request ids) from `query_start_loc`
 * (int32 [n_requests + 1]); `count` items, or with `device_count` (int32 device memory) at most `max_count`. */
typedef struct ferry_row_selection {
  uint32_t form;
  uint32_t index_bytes;
  const void* indices;
  const int32_t* query_start_loc;
  uint32_t n_requests;
  uint32_t unused;
  int64_t window_begin;
  int64_t window_end;
  uint64_t count;
  const int32_t* device_count;
  uint64_t max_count;
} ferry_row_selection;

/** A native consumer (capsule FERRY_SINK_NAME). The capsule must stay alive while the channel uses it (the
 * channel holds a reference until close()). fn must not throw (C++) nor call into Python without the GIL. */
typedef struct ferry_sink {
  uint32_t version; /**< FERRY_SINK_VERSION */
  void (*fn)(void* ctx, const ferry_entry* entry);
  void* ctx;
} ferry_sink;

/** The function table in the FERRY_CAPI_NAME capsule. Every call is thread-safe against close() and the
 * channel's destruction (an unknown or destroyed handle is FERRY_ERR_LOGIC), and releases the GIL if the
 * calling thread holds it while it may block. `err` (may be NULL) receives a NUL-terminated message. */
typedef struct ferry_capi {
  uint32_t version;     /**< FERRY_CAPI_VERSION */
  uint32_t struct_size; /**< sizeof(ferry_capi) of the module */
  /** Channel.capture(hook, bytes at ptr) on `stream` (a cudaStream_t on the cuda backend, 0 the legacy
   * default stream; FERRY_STREAM_OF_FORWARD the stream of the channel's open forward, the only choice on
   * the host backend). `ptr` is device memory of the channel's device (host memory on the host
   * backend). `keep_alive`, if not NULL, is called with `owner` once the bytes were read (host backend:
   * after the emulated copy; cuda: at once, the caller's allocator orders reuse on `stream`); it is also
   * called when the call fails. */
  int (*capture)(uint64_t channel, uint32_t hook, const void* ptr, uint64_t bytes, uintptr_t stream,
                 void (*keep_alive)(void* owner), void* owner, char* err, size_t err_len);
  /** The channel's backend (ferry_backend_kind), device, and FERRY_INFO_* flags (any pointer may be NULL);
   * FERRY_ERR_LOGIC for an unknown handle. */
  int (*channel_info)(uint64_t channel, int* backend, int* device, uint32_t* flags, char* err, size_t err_len);
  /** Sets the Python exception of `status` (ferry.LogicError, ferry.InvalidatedError, ...) with `msg`, as the
   * core module raises it; the caller holds the GIL (then raises it, e.g. pybind11::error_already_set). */
  void (*set_python_error)(int status, const char* msg);
  /* ---- version 2 ---- */
  /** Channel.capture_deferred: records (hook, ptr, bytes); the bytes are copied by the batch's gather at
   * its flush point (the batch limit, end_forward, flush, an immediate capture). The channel holds `owner`
   * until that flush has been enqueued (host backend: until the emulated copy ran), then calls
   * `keep_alive(owner)` (also when the call fails). Before any call that may flush, the channel calls
   * `unchanged(owner)` (if not NULL; any thread, GIL maybe not held) for every pending entry: 0 means the
   * source was written since the capture, and that call fails with FERRY_ERR_LOGIC naming the hook, before
   * anything of the batch is launched. */
  int (*capture_deferred)(uint64_t channel, uint32_t hook, const void* ptr, uint64_t bytes, uintptr_t stream,
                          void (*keep_alive)(void* owner), int (*unchanged)(void* owner), void* owner, char* err,
                          size_t err_len);
  /** Channel.flush(stream): enqueues the gather of the pending deferred entries (checked as above). */
  int (*flush)(uint64_t channel, uintptr_t stream, char* err, size_t err_len);
  /* ---- version 3 ---- */
  /** Channel.capture_rows: the rows `sel` names of the [n_rows, row_bytes] tensor at `ptr` as one entry of
   * `hook` (stream as capture). `owner` (keep_alive) holds the tensor and every selection array until the
   * kernel read them; keep_alive is also called when the call fails. */
  int (*capture_rows)(uint64_t channel, uint32_t hook, const void* ptr, uint64_t n_rows, uint64_t row_bytes,
                      const ferry_row_selection* sel, uintptr_t stream, void (*keep_alive)(void* owner), void* owner,
                      char* err, size_t err_len);
} ferry_capi;

#ifdef __cplusplus
}
#endif

#endif /* FERRY_PYTHON_CAPI_H */

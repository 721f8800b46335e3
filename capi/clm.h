/*
 * clm.h: the stable C ABI of clmcache, an embeddable KV-cache library for LLM
 * inference backends (prefix reuse over a paged KV pool).
 *
 * A host creates one engine, admits each request's prompt, writes the K/V of
 * the tokens that were not cached into the slots it is given, extends the
 * sequence as it decodes, and finishes it, which publishes the tokens for
 * later requests to reuse.
 *
 *   clm_engine_options opts;
 *   clm_engine_options_init(&opts, sizeof opts);
 *   opts.num_pages = 65536; opts.page_size = 16;
 *   opts.num_layers = 32; opts.kv_heads = 8; opts.head_dim = 128;
 *   clm_engine *engine = NULL;
 *   if (clm_engine_create(&engine, &opts) != CLM_OK) puts(clm_last_error());
 *
 *   clm_seq *seq = NULL;
 *   clm_engine_admit(&seq, engine, prompt, prompt_len, NULL);
 *   int32_t cached = clm_seq_cached_tokens(seq);     // reuse these
 *   ... compute K/V of prompt[cached:] into clm_seq_slots(seq, &n) ...
 *   clm_seq_finish(seq);
 *   clm_seq_free(seq);
 *   clm_engine_free(engine);
 *
 * Conventions (as sqlite3.h and libgit2):
 * - Handles are opaque. Every function that can fail returns a clm_status:
 *   CLM_OK (0) or a negative code; clm_last_error() then describes the most
 *   recent failure on the calling thread.
 * - Out-parameters come first. Options structs carry their own size and are
 *   filled by an init function, so new fields can be appended without
 *   breaking compiled callers; admit takes NULL for defaults (engine options
 *   are required: num_pages has no default).
 * - Ownership: the caller owns what a create/admit function returns and gives
 *   it back with the matching free function; free functions accept NULL.
 *   Arrays returned by clm_seq_* accessors belong to the sequence and stay
 *   valid until the next call that changes it (extend, finish, abort, free).
 * - Thread safety: an engine may be used from many threads at once. A
 *   sequence handle must not be used by two threads at the same time.
 * - Nothing throws across this boundary, and no C++ type crosses it.
 */
#ifndef CLM_H
#define CLM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(CLM_BUILDING_LIBRARY)
#define CLM_API __declspec(dllexport)
#elif defined(_WIN32)
#define CLM_API __declspec(dllimport)
#elif defined(__GNUC__)
#define CLM_API __attribute__((visibility("default")))
#else
#define CLM_API
#endif

#define CLM_VERSION_MAJOR 0
#define CLM_VERSION_MINOR 1
#define CLM_VERSION_PATCH 0
#define CLM_VERSION_NUMBER (CLM_VERSION_MAJOR * 10000 + CLM_VERSION_MINOR * 100 + CLM_VERSION_PATCH)

/* The library's version as a number (major*10000 + minor*100 + patch) and as
 * a string; compare with CLM_VERSION_NUMBER to detect a header/library skew. */
CLM_API int clm_version(void);
CLM_API const char *clm_version_string(void);

/* ---- status codes --------------------------------------------------------- */
typedef int32_t clm_status;
#define CLM_OK 0
#define CLM_ERR_INVALID_ARGUMENT (-1)    /* malformed input: NULL, bad lengths, bad ids */
#define CLM_ERR_OUT_OF_MEMORY (-2)       /* no free KV pages, even after eviction */
#define CLM_ERR_NOT_FOUND (-3)           /* no such handle or sequence */
#define CLM_ERR_FAILED_PRECONDITION (-4) /* valid call, wrong state (e.g. finish after abort) */
#define CLM_ERR_UNSUPPORTED (-5)         /* not in this build or on this machine (e.g. no GPU) */
#define CLM_ERR_INTERNAL (-6)            /* a bug in clmcache */
#define CLM_ERR_IO (-7)                  /* a file, socket or database call failed */

/* A static name for a status code ("ok", "invalid_argument", ...). */
CLM_API const char *clm_status_name(clm_status status);
/* The message of the last failed call on this thread ("" if none). The string
 * stays valid until the next clm_* call on this thread. */
CLM_API const char *clm_last_error(void);

/* ---- engine --------------------------------------------------------------- */
typedef struct clm_engine clm_engine;
typedef struct clm_seq clm_seq;

#define CLM_KV_F32 0
#define CLM_KV_F16 1
#define CLM_KV_BF16 2

#define CLM_MEMORY_NONE 0   /* page ids only: the host keeps the KV tensors */
#define CLM_MEMORY_HOST 1   /* the pool holds the KV bytes in host memory */
#define CLM_MEMORY_DEVICE 2 /* ... in CUDA device memory */

#define CLM_EVICT_LRU 0
#define CLM_EVICT_LFU 1
#define CLM_EVICT_SLRU 2
#define CLM_EVICT_PRIORITY 3

typedef struct clm_engine_options {
  uint32_t struct_size; /* sizeof(clm_engine_options) as the caller compiled it */
  int32_t num_pages;    /* pool budget, in pages (required) */
  int32_t page_size;    /* tokens per page (default 16) */
  int32_t num_layers;   /* default 1 */
  int32_t kv_heads;     /* default 1 */
  int32_t head_dim;     /* default 128 */
  int32_t kv_dtype;     /* CLM_KV_* (default CLM_KV_F16) */
  int32_t memory;       /* CLM_MEMORY_* (default CLM_MEMORY_HOST) */
  int32_t device;       /* CUDA device for CLM_MEMORY_DEVICE (default 0) */
  int32_t eviction_policy;        /* CLM_EVICT_* (default CLM_EVICT_LRU) */
  double slru_protected_fraction; /* [0, 1], default 0.2 */
} clm_engine_options;

/* Fills *options with defaults. struct_size: sizeof(*options) as compiled by
 * the caller; a size this library does not know is CLM_ERR_INVALID_ARGUMENT. */
CLM_API clm_status clm_engine_options_init(clm_engine_options *options, size_t struct_size);

CLM_API clm_status clm_engine_create(clm_engine **out, const clm_engine_options *options);
/* Ends every running sequence (as abort) and frees the engine. Sequence
 * handles must still be freed (the pool's memory goes with the last one);
 * every other call on them fails with CLM_ERR_FAILED_PRECONDITION. */
CLM_API void clm_engine_free(clm_engine *engine);

/* The pool's KV memory (NULL with CLM_MEMORY_NONE) and its layout: page p,
 * layer l: K at base + p*page_bytes + l*layer_bytes, V layer_bytes/2 further,
 * each [page_size][kv_heads][head_dim] (NHD rows). Set out->struct_size to
 * sizeof(clm_kv_layout) first; only that many bytes are written. */
typedef struct clm_kv_layout {
  uint32_t struct_size;
  void *base;
  size_t page_bytes;
  size_t layer_bytes;
  int32_t num_pages, page_size, num_layers, kv_heads, head_dim, kv_dtype, memory;
} clm_kv_layout;
CLM_API clm_status clm_engine_kv_layout(clm_kv_layout *out, const clm_engine *engine);

/* ---- requests ------------------------------------------------------------- */
typedef struct clm_admit_options {
  uint32_t struct_size;   /* sizeof(clm_admit_options) as the caller compiled it */
  const char *cache_salt; /* tenant isolation: bytes [0, cache_salt_len); NULL = none */
  size_t cache_salt_len;
  int32_t adapter_id; /* LoRA adapter the KV is computed with (default 0) */
  int32_t priority;   /* 0-100 for CLM_EVICT_PRIORITY (default 0) */
} clm_admit_options;
CLM_API clm_status clm_admit_options_init(clm_admit_options *options, size_t struct_size);

/* Matches the longest cached prefix of tokens[0, n_tokens) (page-aligned, at
 * most n_tokens-1), locks it, and allocates pages for the rest of the prompt.
 * Token ids must lie in [0, 2^31). options may be NULL. */
CLM_API clm_status clm_engine_admit(clm_seq **out, clm_engine *engine, const int32_t *tokens, size_t n_tokens,
                                    const clm_admit_options *options);
/* Appends decoded tokens whose K/V the host will write; afterwards
 * clm_seq_slots gives their slots. */
CLM_API clm_status clm_seq_extend(clm_seq *seq, const int32_t *tokens, size_t n_tokens);
/* Publishes prompt + output into the cache; the sequence then ends. */
CLM_API clm_status clm_seq_finish(clm_seq *seq);
/* Ends the sequence without caching anything it computed. */
CLM_API clm_status clm_seq_abort(clm_seq *seq);
/* Frees the handle; a sequence still running is aborted first. */
CLM_API void clm_seq_free(clm_seq *seq);

/* Tokens of the prompt that were cached at admission (0 on a NULL handle). */
CLM_API int32_t clm_seq_cached_tokens(const clm_seq *seq);
/* The sequence's page table: ceil(length / page_size) page ids. NULL with
 * *n_pages = 0 for a NULL or ended (finished, aborted, engine freed) sequence,
 * whose pages belong to the cache or to other sequences by then. */
CLM_API const int32_t *clm_seq_page_table(const clm_seq *seq, size_t *n_pages);
/* Slots (page * page_size + row) of the tokens added by the last admit or
 * extend: where the host writes their K/V. NULL and 0 as above. */
CLM_API const int64_t *clm_seq_slots(const clm_seq *seq, size_t *n_slots);

/* FlashInfer's paged-KV CSR arrays for a batch of sequences, written to
 * caller buffers: indptr[n_seqs + 1], last_page_len[n_seqs], and at most
 * indices_capacity page ids in indices. *n_indices receives the number needed;
 * when it exceeds indices_capacity nothing is written to indices and
 * CLM_ERR_INVALID_ARGUMENT is returned. */
CLM_API clm_status clm_engine_batch_page_table(int32_t *indptr, int32_t *indices, size_t indices_capacity,
                                               size_t *n_indices, int32_t *last_page_len, clm_engine *engine,
                                               clm_seq *const *seqs, size_t n_seqs);

/* ---- metrics -------------------------------------------------------------- */
typedef struct clm_metrics {
  uint32_t struct_size; /* set by the caller: sizeof(clm_metrics) as compiled */
  uint64_t tokens_queried;
  uint64_t tokens_hit;
  double hit_rate;
  int64_t cached_tokens;
  int64_t evictable_tokens;
  int64_t protected_tokens;
  int32_t pages_used;
  int32_t pages_free;
  uint64_t evicted_tokens;
  uint64_t evictions;
  uint64_t inserted_tokens;
  uint64_t admitted;
  uint64_t finished;
  uint64_t aborted;
  uint64_t rejected;
  int64_t active_sequences;
  uint64_t metadata_bytes;
} clm_metrics;
/* Copies the counters out; only the first out->struct_size bytes are written
 * (set struct_size before the call). */
CLM_API clm_status clm_engine_metrics(clm_metrics *out, const clm_engine *engine);

#ifdef __cplusplus
}
#endif

#endif /* CLM_H */

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
 *   filled by an init function (or initialised with its static initialiser,
 *   CLM_ENGINE_OPTIONS_INIT and the others, the same defaults), so new fields
 *   can be appended without breaking compiled callers; admit takes NULL for
 *   defaults (engine options are required: num_pages has no default).
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

/* Windows: the shared library's build defines CLM_BUILDING_LIBRARY (exports);
 * its users import. Users of the static library define CLM_STATIC (CMake's
 * clmcache::clmcache_static target does it for them), as for sqlite3/libgit2. */
#if defined(_WIN32) && defined(CLM_STATIC)
#define CLM_API
#elif defined(_WIN32) && defined(CLM_BUILDING_LIBRARY)
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
#define CLM_ERR_NOT_FOUND (-3)           /* no such handle or sequence; a store entry that is not there */
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
/* SLRU with a ghost of recently evicted prefixes (docs/eviction.md), with its
 * defaults: protected segment 0.9 of the pool, ghost 4 pool capacities. */
#define CLM_EVICT_GHOST_SLRU 4

/* KV events for cache-aware routers (docs/fleet.md): every page that enters
 * or leaves the engine's pool (medium GPU) or its host tier (CPU) is one
 * event, as vLLM publishes them. By default they go out on a ZeroMQ PUB
 * socket; a host that publishes on a bus of its own (NATS, Kafka) sets
 * clm_engine_options.kv_events_callback and gets each batch as these plain
 * structs instead. Everything a batch points to is the library's and lives
 * only for the call: copy what you keep. */
#define CLM_KV_EVENT_BLOCK_STORED 0       /* pages cached on a tier */
#define CLM_KV_EVENT_BLOCK_REMOVED 1      /* pages that left it */
#define CLM_KV_EVENT_ALL_BLOCKS_CLEARED 2 /* nothing is cached (a new engine, or a resync follows) */
#define CLM_KV_MEDIUM_GPU 0 /* the engine's pool, wherever its memory lives (vLLM's name for its own cache) */
#define CLM_KV_MEDIUM_CPU 1 /* the host tier */
typedef struct clm_kv_event {
  int32_t kind;                     /* CLM_KV_EVENT_* */
  int32_t medium;                   /* CLM_KV_MEDIUM_* (stored, removed); GPU (0) for a clear, which clears both */
  const uint64_t *block_hashes;     /* one per page, in path order (stored, removed) */
  size_t n_block_hashes;
  int32_t has_parent;               /* stored: 1 when parent_block_hash is set (0 at a prefix's first page) */
  int32_t block_size;               /* stored: tokens per page */
  uint64_t parent_block_hash;       /* stored: the hash of the page before the first */
  const int32_t *token_ids;         /* stored: n_block_hashes * block_size ids (none with kv_events_token_ids 0) */
  size_t n_token_ids;
  int32_t lora_id;                  /* stored: the adapter, 0 for none */
  int32_t reserved;                 /* 0 */
  const char *extra_key;            /* stored, NUL-terminated: the tenant's salt digest ("salt:" and 32 hex
                                       digits), "" for the default tenant; never the salt itself */
} clm_kv_event;
typedef struct clm_kv_event_batch {
  uint32_t struct_size;        /* sizeof(clm_kv_event_batch) as this library was compiled */
  int32_t data_parallel_rank;  /* clm_engine_options.kv_events_data_parallel_rank */
  uint64_t sequence;           /* 0, 1, 2, ... per engine: a gap never happens here (drops resync instead) */
  double ts;                   /* seconds since the epoch */
  const clm_kv_event *events;  /* in the order the cache changed */
  size_t n_events;
} clm_kv_event_batch;
/* Called on one thread of the library's (never inside an engine call), one
 * batch at a time, in order. It must not call the engine that publishes.
 * Never called once clm_engine_free returns (what was recorded by then is
 * delivered first), so user_data need only outlive the engine. */
typedef void (*clm_kv_event_callback)(const clm_kv_event_batch *batch, void *user_data);
#define CLM_KV_EVENTS_BIND_AUTO 0    /* bind a wildcard, loopback, ipc:// or inproc:// endpoint; else connect */
#define CLM_KV_EVENTS_BIND 1
#define CLM_KV_EVENTS_CONNECT 2      /* to a router that binds */
#define CLM_KV_EVENTS_LAYOUT_ARRAY 0  /* vLLM's tagged arrays (llm-d, AIBrix, Dynamo) */
#define CLM_KV_EVENTS_LAYOUT_LEGACY 1 /* the shorter arrays llm-d-kv-cache-manager up to 2025 needs */
#define CLM_KV_EVENTS_LAYOUT_MAP 2    /* {"type": tag, field: value} as vLLM sends since mid-2026 */

/* CLM anomalies as JSON lines (docs/observability.md), one a call, e.g.
 *   {"time_ms":1796544000123,"event":"low_src","tenant":"acme","adapter_id":1,"key":"REFUND-ORDER",
 *    "sightings":20,"median_src":0.0625}
 * line is line_len bytes (no newline), NUL-terminated, the library's for the
 * call only. Called on the thread of the engine call that caused it (a
 * snapshot lookup, record, outcome report, blacklist or unblacklist), in
 * order, under the engine's locks: return quickly, never call the engine from
 * it, and never throw, longjmp or unwind out of it (a Go or Rust host
 * recovers its panics inside). Never called once clm_engine_free returns. */
typedef void (*clm_watch_line_callback)(const char *line, size_t line_len, void *user_data);

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
  double slru_protected_fraction; /* [0, 1], default 0.2 (CLM_EVICT_SLRU only) */
  /* -- version 2: CLM suffix reuse (docs/clm.md) -- */
  double src_daily_requests;          /* expected requests/day; sets the SRC threshold (default 10000) */
  float src_threshold;                /* in [0, 1] fixes the threshold; < 0 = from src_daily_requests (default -1) */
  float src_breaker_score;            /* default 0.95 */
  int32_t src_breaker_steps;          /* default 3 */
  const int32_t *special_token_ids;   /* left out of the SRC head's mean (copied at create; default none) */
  size_t n_special_token_ids;
  /* -- version 3: the semantic snapshot store ("snapshot store" below) -- */
  const char *snapshot_store_path;    /* NUL-terminated directory, ":memory:" for tests; NULL or "" = no store
                                         (copied at create; default NULL) */
  int32_t snapshot_store_shards;      /* SQLite shards, 1..256, fixed when the store is created (default 16) */
  int32_t snapshot_dim;               /* floats per snapshot, 1..4096, fixed when created (default 256) */
  int64_t snapshot_min_usage;         /* sightings of a suffix before it is stored, >= 1 (default 50) */
  float snapshot_version_cosine;      /* (0, 1]: a record below this cosine is a new version (default 0.95) */
  float snapshot_similarity_floor;    /* [-1, 1]: level 2 serves nothing below this cosine (default 0.80) */
  int32_t snapshot_ann_ef_search;     /* level 2's search breadth (default 128) */
  int32_t snapshot_lookup_timeout_us; /* a lookup waits this long for a busy shard, then misses (default 2000) */
  /* -- version 4: the tiered KV cache (docs/tiers.md) -- */
  int32_t host_pages;                 /* L2: host-memory pages of the pool's layout; 0 = no tiers (default 0) */
  int32_t write_policy;               /* CLM_WRITE_* (default CLM_WRITE_THROUGH) */
  const char *storage_url;            /* L3, NUL-terminated: "file:///dir?capacity_mb=N" or
                                         "redis://host:port/db?prefix=clm:&ttl=3600"; NULL or "" = none; needs
                                         host_pages > 0 (copied at create; default NULL) */
  int32_t prefetch_policy;            /* CLM_PREFETCH_* (default CLM_PREFETCH_TIMEOUT) */
  double prefetch_timeout_ms;         /* CLM_PREFETCH_TIMEOUT: base wait (default 20) */
  double prefetch_timeout_per_1k_tokens_ms; /* ... plus this per 1000 tokens fetched (default 10) */
  int32_t storage_workers;            /* threads that talk to storage, 1..64 (default 2) */
  int32_t storage_batch_pages;        /* pages per storage call, 1..4096 (default 32) */
  /* -- version 5: the snapshot store beside its writer, and its maintenance -- */
  int32_t snapshot_read_only;         /* 1: open the store read-only beside the process that writes it: lookups
                                         only; records, outcomes, fallbacks, evictions and administration are
                                         CLM_ERR_FAILED_PRECONDITION (default 0) */
  int64_t snapshot_maintenance_interval_ms; /* > 0: evict and flush the store on a background thread this often
                                               (default 0: the host calls clm_engine_evict_snapshots) */
  /* -- version 6: pages safe to share (docs/tiers.md) -- */
  const char *model_id;         /* the host's fingerprint of its model (weights + config), NUL-terminated, up to
                                   4096 bytes: hashed into every stored page's key and header, so no other model
                                   is served them. Required with a storage tier (copied at create; default NULL) */
  const char *page_secret_file; /* a file (not readable by everyone) holding the deployment secret (16..4096
                                   bytes) that signs every stored page (AES-256-GMAC); NULL or "": none */
  const char *page_secret_env;  /* ... or the name of the environment variable holding it; at most one of the
                                   two. Without either, pages are not signed and signed ones are refused */
  int32_t max_queued_fetches;   /* fetches waiting for a storage worker, 1..2^20; past it the oldest prefetch
                                   (or the new fetch) is dropped (default 64) */
  int32_t breaker_failures;     /* failed storage calls in a row that stop storage being asked (default 3) */
  double admission_deadline_ms; /* an admission waits for storage at most this, any policy (default 2000) */
  double breaker_open_ms;       /* how long storage is not asked before one call probes it (default 5000) */
  /* -- version 7: KV events for cache-aware routers (docs/fleet.md; copied at create) -- */
  int32_t kv_events;                     /* 1: publish them (needs model_id: the hashes name the model) (default 0) */
  int32_t kv_events_bind;                /* CLM_KV_EVENTS_BIND_AUTO, _BIND or _CONNECT (default AUTO) */
  const char *kv_events_endpoint;        /* the PUB socket; NULL or "": "tcp://127.0.0.1:5557" */
  const char *kv_events_replay_endpoint; /* a ROUTER socket (always bound) that sends missed batches again on
                                            request; NULL or "": none */
  const char *kv_events_topic;           /* every message's first frame, up to 256 bytes, e.g. llm-d's
                                            "kv@<pod>@<model>"; NULL: "" */
  clm_kv_event_callback kv_events_callback; /* set: no socket is opened (no replay endpoint either) and each
                                               batch goes to this instead (default NULL) */
  void *kv_events_callback_data;         /* passed to the callback as it is (default NULL) */
  int32_t kv_events_layout;              /* CLM_KV_EVENTS_LAYOUT_* (default ARRAY) */
  int32_t kv_events_batch_interval_ms;   /* a batch goes out this often (default 10) ... */
  int32_t kv_events_max_batch_events;    /* ... or as soon as it holds this many events (default 1024) */
  int32_t kv_events_queue_events;        /* events not yet published, at most: past it they are dropped, counted,
                                            and a resync (all cleared, then every cached page) follows
                                            (default 131072) */
  int32_t kv_events_buffer_batches;      /* batches the replay socket can send again (default 10000) */
  int32_t kv_events_send_hwm;            /* the PUB socket's high-water mark, in messages (default 100000) */
  int32_t kv_events_data_parallel_rank;  /* each batch's third field (default 0) */
  int32_t kv_events_token_ids;           /* 0: leave token ids out, for routers that key on these hashes
                                            (default 1) */
  /* -- version 8: divergence hot spots (docs/observability.md) -- */
  int32_t divergence;                /* 1: count where prompts split off the cached paths (default 1) */
  int32_t divergence_branch_points;  /* branch points kept, 16..65536 (default 256) */
  int32_t divergence_window_ms;      /* a report counts this far back, >= 2 (default 3600000: an hour) */
  int32_t divergence_context_tokens; /* tokens kept either side of a split, 0..64 (default 8) */
  /* -- version 9: CLM anomalies (docs/observability.md): watched with a snapshot store only; the settings
        are checked whatever clm_watch says -- */
  int32_t clm_watch;                  /* 1: watch snapshot lookups' SRC scores and the store's key events
                                         (clm_engine_clm_anomalies) (default 1) */
  int32_t clm_watch_max_keys;         /* keys watched at once, 1..2^20 (default 4096) */
  int64_t clm_watch_window_ms;        /* a key's sightings count this far back, >= 2 (default 3600000) */
  int64_t clm_watch_min_sightings;    /* a key is low-SRC once seen this often in the window, >= 1 ... (default 20) */
  float clm_watch_low_src;            /* ... with a median SRC below this, (0, 1] (default 0.2) */
  int32_t clm_watch_max_events;       /* events a report keeps, the newest, 0..2^20 (default 1024) */
  clm_watch_line_callback clm_watch_callback; /* each event, and each key turning low-SRC, as one JSON line
                                                 (see clm_watch_line_callback) (default NULL) */
  void *clm_watch_callback_data;      /* passed to the callback as it is (default NULL) */
} clm_engine_options;

/* When a cached page gets its host-tier copy (then, with a storage tier, its
 * stored copy). */
#define CLM_WRITE_THROUGH 0           /* on its first hit (default) */
#define CLM_WRITE_THROUGH_SELECTIVE 1 /* once it has been hit twice */
#define CLM_WRITE_BACK 2              /* only when the device tier evicts it */
/* How long clm_engine_admit waits for pages found in storage. */
#define CLM_PREFETCH_BEST_EFFORT 0   /* not at all: what has arrived is used */
#define CLM_PREFETCH_WAIT_COMPLETE 1 /* until every page found is in */
#define CLM_PREFETCH_TIMEOUT 2       /* up to prefetch_timeout_ms + per_1k_tokens_ms * tokens / 1000 */

/* Fills *options with defaults. struct_size: sizeof(*options) as compiled by
 * the caller; a size this library does not know is CLM_ERR_INVALID_ARGUMENT. */
CLM_API clm_status clm_engine_options_init(clm_engine_options *options, size_t struct_size);
/* The same defaults as a static initialiser (as libgit2's GIT_*_OPTIONS_INIT),
 * struct_size included: clm_engine_options opts = CLM_ENGINE_OPTIONS_INIT;
 * num_pages is 0 there too, so it must still be set. */
/* clang-format off */
#define CLM_ENGINE_OPTIONS_INIT                                                                               \
  {sizeof(clm_engine_options), 0, 16, 1, 1, 128, CLM_KV_F16, CLM_MEMORY_HOST, 0, CLM_EVICT_LRU, 0.2,          \
   10000.0, -1.0f, 0.95f, 3, NULL, 0,                                  /* version 2: SRC */                   \
   NULL, 16, 256, 50, 0.95f, 0.80f, 128, 2000,                         /* version 3: snapshot store */        \
   0, CLM_WRITE_THROUGH, NULL, CLM_PREFETCH_TIMEOUT, 20.0, 10.0, 2, 32, /* version 4: tiers */                \
   0, 0,                                                               /* version 5: store reader */          \
   NULL, NULL, NULL, 64, 3, 2000.0, 5000.0,                            /* version 6: model, secret, bounds */ \
   0, CLM_KV_EVENTS_BIND_AUTO, NULL, NULL, NULL, NULL, NULL,           /* version 7: KV events */             \
   CLM_KV_EVENTS_LAYOUT_ARRAY, 10, 1024, 131072, 10000, 100000, 0, 1,                                         \
   1, 256, 3600000, 8,                                                 /* version 8: divergence */            \
   1, 4096, 3600000, 20, 0.2f, 1024, NULL, NULL}                       /* version 9: CLM anomalies */
/* clang-format on */

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
  int32_t priority;   /* 0-100 (default 0), lowest evicted first under
                         CLM_EVICT_PRIORITY and CLM_EVICT_GHOST_SLRU */
  /* -- version 2 -- */
  int32_t priority_update; /* how priority meets the priority already cached
                              along the prompt: CLM_PRIORITY_RAISE (default)
                              or CLM_PRIORITY_SET */
  /* -- version 3 -- */
  const char *tenant; /* the tenant's name in reports (clm_engine_divergence_report), bytes
                         [0, tenant_len), up to 65536, e.g. an API key's tenant; the first name a
                         branch point is split at under is the one it reports. NULL = none: a report names the
                         salt's digest, never the salt. Not part of the namespace: only the salt
                         separates (default NULL) */
  size_t tenant_len;
} clm_admit_options;
/* Each cached node keeps the highest priority any admission gave it: a shared
 * system prompt admitted once at a high priority stays there. */
#define CLM_PRIORITY_RAISE 0
/* Every node along the prompt takes this admission's priority, the host's
 * latest word: a conversation admitted at 1 while its next turn was expected
 * drops to 0 along its whole prefix when admitted at 0 (docs/c-api.md, Hints). */
#define CLM_PRIORITY_SET 1
CLM_API clm_status clm_admit_options_init(clm_admit_options *options, size_t struct_size);
/* clm_admit_options_init's defaults as a static initialiser (no salt, adapter
 * 0, priority 0, CLM_PRIORITY_RAISE, no tenant name). */
#define CLM_ADMIT_OPTIONS_INIT \
  { sizeof(clm_admit_options), NULL, 0, 0, 0, CLM_PRIORITY_RAISE, NULL, 0 }

/* Matches the longest cached prefix of tokens[0, n_tokens) (page-aligned, at
 * most n_tokens-1), locks it, and allocates pages for the rest of the prompt.
 * Token ids must lie in [0, 2^31). options may be NULL. */
CLM_API clm_status clm_engine_admit(clm_seq **out, clm_engine *engine, const int32_t *tokens, size_t n_tokens,
                                    const clm_admit_options *options);
/* What clm_engine_admit(engine, tokens, n_tokens, options) would take from the
 * pool now, found without admitting: nothing is counted, touched, locked,
 * allocated or evicted. A scheduler that admits only what can run to the end
 * asks this first, so that a request waiting for room leaves the cache alone.
 * Admitting takes new_pages + unlocked_pages off pages_free plus the pages of
 * evictable_tokens. Set out->struct_size to sizeof(clm_admission_plan) first;
 * only that many bytes are written. The errors are clm_engine_admit's. */
typedef struct clm_admission_plan {
  uint32_t struct_size;
  int32_t cached_tokens;  /* on the device now: admit reuses them (it may load more from the host tier) */
  int32_t new_pages;      /* pages admit allocates: the prompt's, less the cached ones */
  int32_t unlocked_pages; /* cached pages no sequence holds: admit locks them, so they stop being evictable */
  int32_t pages_free;     /* the pool at the same instant */
  int64_t evictable_tokens;
} clm_admission_plan;
CLM_API clm_status clm_engine_plan_admission(clm_admission_plan* out, const clm_engine* engine, const int32_t* tokens,
                                             size_t n_tokens, const clm_admit_options* options);

/* -- Pinned prefixes -------------------------------------------------------
 * Keeps the cached part of a prompt's prefix (whole pages on the engine's
 * pool, under options' salt and adapter; NULL options: none, adapter 0) from
 * eviction for ttl_ms milliseconds, as a running sequence keeps it. Each
 * admission whose match covers the whole pinned prefix restarts its time; it
 * ends by itself once its time is over (at the next admission or pin call),
 * or with clm_engine_unpin. All pins share a budget, a quarter of the pool's
 * pages: a pin past it is CLM_ERR_OUT_OF_MEMORY and pins nothing (no other
 * pin is dropped to make room). CLM_ERR_NOT_FOUND when nothing of the prefix
 * is cached (pin once a request has computed it); CLM_ERR_INVALID_ARGUMENT
 * for a bad prompt or a ttl_ms outside [1, 86400000]. On success *pin_id
 * (never 0) names the pin and *pinned_tokens (may be NULL) says how many
 * tokens it holds. The clm_pins_* families of clm_engine_metrics_text count
 * pins, pinned pages, the budget, and pins created, refused, expired and
 * refreshed. */
CLM_API clm_status clm_engine_pin_prefix(clm_engine *engine, const int32_t *tokens, size_t n_tokens,
                                         const clm_admit_options *options, int64_t ttl_ms, uint64_t *pin_id,
                                         int32_t *pinned_tokens);
/* Ends pin pin_id: its prefix is evictable again (unless other pins or
 * sequences hold it). CLM_ERR_NOT_FOUND when it never was, has ended or has
 * expired. */
CLM_API clm_status clm_engine_unpin(clm_engine *engine, uint64_t pin_id);
/* A priority that expires: sets priority (1 to 100) along the cached prefix
 * of tokens (under options' salt and adapter; NULL: none) now, as an
 * admission with CLM_PRIORITY_SET would, and back to 0 once ttl_ms has passed
 * (at the next admission or hint after it), unless a later hint under the
 * same key (key_len bytes: a conversation's name) has replaced it. For a host
 * that knows a conversation will continue: under CLM_EVICT_PRIORITY and
 * CLM_EVICT_GHOST_SLRU its prefix outranks unhinted ones meanwhile. At most
 * 4096 hints are held; past that the one due first expires early.
 * *reached_tokens (may be NULL): the tokens of the prefix found cached.
 * CLM_ERR_INVALID_ARGUMENT for an empty key or one over 4096 bytes, a bad
 * prompt, a priority outside [1, 100] or ttl_ms outside [1, 86400000]. */
CLM_API clm_status clm_engine_hint_prefix(clm_engine *engine, const char *key, size_t key_len, const int32_t *tokens,
                                          size_t n_tokens, const clm_admit_options *options, int32_t priority,
                                          int64_t ttl_ms, int32_t *reached_tokens);
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
/* Of those, how many were copied in from the host tier, and of these how many
 * the host tier had just fetched from storage for this admission (the rest
 * were on the device). All are in their pages when clm_engine_admit returns. */
CLM_API int32_t clm_seq_host_tokens(const clm_seq *seq);
CLM_API int32_t clm_seq_storage_tokens(const clm_seq *seq);

/* Starts fetching the pages of tokens[0, n_tokens) that only storage has into
 * the host tier, and returns: call it when a request is queued; its admit
 * finds them there. CLM_ERR_FAILED_PRECONDITION without a storage tier;
 * CLM_ERR_INVALID_ARGUMENT for a prompt or options clm_engine_admit would
 * refuse (the same checks). options may be NULL. */
CLM_API clm_status clm_engine_prefetch(clm_engine *engine, const int32_t *tokens, size_t n_tokens,
                                       const clm_admit_options *options);
/* Waits until the tiers' copies, storage reads and writes queued so far are done. */
CLM_API clm_status clm_engine_wait_for_tiers(clm_engine *engine);
/* The sequence's page table: ceil(length / page_size) page ids. NULL with
 * *n_pages = 0 for a NULL or ended (finished, aborted, engine freed) sequence,
 * whose pages belong to the cache or to other sequences by then. */
CLM_API const int32_t *clm_seq_page_table(const clm_seq *seq, size_t *n_pages);
/* Slots (page * page_size + row) of the tokens added by the last admit or
 * extend: where the host writes their K/V. NULL and 0 as above. */
CLM_API const int64_t *clm_seq_slots(const clm_seq *seq, size_t *n_slots);

/* FlashInfer's paged-KV CSR arrays for a batch of sequences (each listed
 * once: one listed twice is CLM_ERR_INVALID_ARGUMENT), written to
 * caller buffers: indptr[n_seqs + 1], last_page_len[n_seqs], and at most
 * indices_capacity page ids in indices. *n_indices receives the number needed;
 * when it exceeds indices_capacity nothing is written to indices and
 * CLM_ERR_INVALID_ARGUMENT is returned. */
CLM_API clm_status clm_engine_batch_page_table(int32_t *indptr, int32_t *indices, size_t indices_capacity,
                                               size_t *n_indices, int32_t *last_page_len, clm_engine *engine,
                                               clm_seq *const *seqs, size_t n_seqs);

/* ---- metrics -------------------------------------------------------------- */
#define CLM_MATCH_DEPTH_BUCKETS 19 /* clm_metrics.match_depth_counts: 0, 16, 32, ..., 2^20 tokens, above */
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
  /* -- version 2: the SRC head, its threshold and breaker -- */
  double src_threshold;            /* the threshold in force */
  uint64_t src_steps;              /* sequence-steps scored */
  uint64_t src_unscored_steps;     /* sequence-steps with no non-special row yet */
  uint64_t src_reuse_decisions;    /* steps whose score passed the threshold */
  uint64_t src_retrievals_found;   /* reported snapshot lookups that found one */
  uint64_t src_retrievals_failed;  /* ... that found none */
  uint64_t src_breaker_trips;      /* sequences switched to baseline mode, ever */
  int64_t src_baseline_sequences;  /* running sequences in baseline mode now */
  uint64_t src_injections;         /* sequence-layers that received a snapshot */
  /* -- version 3: the snapshot store (all 0 without one) -- */
  uint64_t store_lookups;           /* suffixes looked up */
  uint64_t store_hits_exact;        /* ... answered at level 1 */
  uint64_t store_hits_ann;          /* ... at level 2 */
  uint64_t store_hits_fallback;     /* ... at level 3 */
  uint64_t store_misses;            /* ... not answered (busy and blacklisted keys included) */
  uint64_t store_busy_misses;       /* misses because a shard stayed busy past snapshot_lookup_timeout_us */
  uint64_t store_blacklisted_skips; /* lookups or level-2 candidates refused for a blacklisted key */
  uint64_t store_ann_unavailable;   /* level-2 lookups while the index was being rebuilt */
  uint64_t store_records;           /* snapshots recorded */
  uint64_t store_counted;           /* ... only counted: below snapshot_min_usage */
  uint64_t store_admissions;        /* suffixes stored for the first time */
  uint64_t store_confirmations;     /* records that agreed with the newest version */
  uint64_t store_versions;          /* new versions of stored suffixes (cosine or drift) */
  uint64_t store_drift_versions;    /* ... of them started by drift */
  uint64_t store_evictions;         /* rows deleted by clm_engine_evict_snapshots */
  uint64_t store_corrupt_skipped;   /* rows skipped because their checksum or header failed */
  uint64_t store_index_rebuilds;    /* similarity indexes rebuilt from the database */
  uint64_t store_outcome_reports;   /* outcomes reported (clm_engine_report_snapshot_outcome) */
  int64_t store_snapshots;          /* rows stored now */
  int64_t store_blacklisted_keys;   /* keys blacklisted now */
  int32_t has_snapshot_store;       /* 1 when the engine was created with a store */
  /* -- version 4: the tiered KV cache (all 0 without tiers) -- */
  int32_t has_tiers;                /* 1 with a host tier */
  int32_t has_storage;              /* 1 with a storage tier */
  uint64_t device_hit_tokens;       /* cached tokens admissions found on the device */
  uint64_t host_hit_tokens;         /* ... copied in from the host tier */
  uint64_t storage_hit_tokens;      /* ... fetched from storage for the admission */
  uint64_t load_backs;              /* admissions that copied host pages to the device */
  uint64_t loaded_pages;            /* pages copied host -> device */
  uint64_t backed_up_pages;         /* pages copied device -> host (the write policy) */
  uint64_t stored_pages;            /* pages written to storage */
  uint64_t fetched_pages;           /* pages read from storage into the host tier */
  uint64_t prefetch_timeouts;       /* admissions that stopped waiting for storage */
  uint64_t storage_errors;          /* storage calls that failed (the admission recomputed) */
  uint64_t dropped_backups;         /* host copies given up (no room, failed copy) */
  int64_t host_cached_tokens;       /* tokens with a host copy now */
  int64_t host_pages_used;
  int64_t host_pages_total;
  uint64_t storage_corrupt_pages;   /* stored values refused (checksum, layout, size) */
  uint64_t storage_dropped_writes;  /* pages storage could not write (full disk, ...) */
  uint64_t storage_evicted_pages;   /* pages the file backend removed for its size cap */
  /* -- version 5: pages safe to share -- */
  uint64_t storage_foreign_model_pages; /* stored values refused: written for another model */
  uint64_t storage_unsigned_pages;      /* ... not signed, where this engine has a page secret */
  uint64_t storage_forged_pages;        /* ... with a signature this engine's secret does not make */
  uint64_t storage_repaired_pages;      /* refused values deleted, so that the next store writes them again */
  uint64_t tier_worker_failures;        /* tier jobs given up for want of host memory */
  int32_t signed_pages;                 /* 1 when stored pages are signed */
  int32_t storage_breaker_state;        /* 0 closed, 1 open (storage not asked), 2 half-open (one probe) */
  uint64_t storage_breaker_trips;       /* times the breaker opened */
  uint64_t storage_breaker_skips;       /* storage jobs skipped, fetches not queued, while it was open */
  uint64_t dropped_fetches;             /* fetches dropped for max_queued_fetches (prefetches first) */
  uint64_t merged_fetches;              /* fetches that joined one queued or running for the same prefix */
  int64_t queued_fetches;               /* fetches waiting for a storage worker now */
  /* -- version 6: KV events (all 0 when they are off) -- */
  int32_t has_kv_events;                /* 1 when the engine publishes KV events */
  int32_t kv_events_resync_pending;     /* 1 while events are dropped and a resync is to come */
  uint64_t kv_events_recorded;          /* events the cache's changes made */
  uint64_t kv_events_published;         /* events sent in a batch (to the socket or the callback) */
  uint64_t kv_events_published_batches;
  uint64_t kv_events_dropped;           /* recorded while the queue was full: lost, then resynced */
  uint64_t kv_events_resyncs;           /* all cleared + every cached page, after drops */
  uint64_t kv_events_replay_requests;   /* served on the replay socket */
  uint64_t kv_events_replay_refused;    /* malformed replay requests */
  uint64_t kv_events_send_failures;     /* messages the socket would not take, batches the callback threw on */
  int64_t kv_events_queued;             /* recorded, not yet published, now */
  uint64_t kv_events_next_sequence;     /* the sequence number the next batch gets */
  /* -- version 7: where lookups stop matching (all 0 with divergence counting off) -- */
  uint64_t diverged_lookups;            /* lookups that split off a longer cached path, a page or more left */
  uint64_t match_depth_counts[CLM_MATCH_DEPTH_BUCKETS]; /* lookups by the tokens they matched: bucket i < 18
                                           holds those up to 0 (i = 0) or 2^(i+3) tokens, above bucket i-1's
                                           bound; bucket 18 those above 2^20 */
  uint64_t match_depth_sum_tokens;      /* tokens matched, summed over those lookups */
  /* -- version 8: CLM anomalies (all 0 without a snapshot store, or with clm_watch 0) -- */
  uint64_t clm_watch_sightings;         /* snapshot lookups recorded with their sequence's SRC score */
  uint64_t clm_watch_low_src_turns;     /* times a key turned low-SRC */
  uint64_t clm_watch_key_events[4];     /* the store's key events, by CLM_WATCH_EVENT_BLACKLISTED ..
                                           CLM_WATCH_EVENT_DRIFT */
  int64_t clm_watch_watched_keys;       /* keys watched now */
  int64_t clm_watch_low_src_keys;       /* ... of them low-SRC as of their last sighting */
} clm_metrics;
/* Copies the counters out; only the first out->struct_size bytes are written
 * (set struct_size before the call). */
CLM_API clm_status clm_engine_metrics(clm_metrics *out, const clm_engine *engine);
/* The same counters, and a histogram of eviction times, as Prometheus text
 * (exposition format 0.0.4; the names are in docs/metrics.md), for a host's
 * GET /metrics (Content-Type: text/plain; version=0.0.4; charset=utf-8).
 * *text_len always receives the text's length in bytes (without the NUL);
 * when text_len + 1 exceeds text_capacity nothing is written to text and
 * CLM_ERR_INVALID_ARGUMENT is returned (clm_last_error() gives the size
 * needed), so text = NULL, text_capacity = 0 is a sizing call. The counters
 * move between two calls, so size with some headroom and retry while the
 * second call reports a longer text:
 *   size_t len = 0, cap = 0; char *text = NULL; clm_status s;
 *   while ((s = clm_engine_metrics_text(text, cap, &len, engine)) == CLM_ERR_INVALID_ARGUMENT && len >= cap) {
 *     cap = len + 1 + 256;       (the NUL, and headroom for counters that grow)
 *     text = realloc(text, cap); (check for NULL)
 *   }
 *   (s == CLM_OK: text holds len bytes and a NUL)
 * text is the caller's: the library keeps no pointer to it. A NULL engine or
 * text_len is CLM_ERR_INVALID_ARGUMENT. */
CLM_API clm_status clm_engine_metrics_text(char *text, size_t text_capacity, size_t *text_len,
                                           const clm_engine *engine);

/* ---- divergence hot spots (docs/observability.md) -------------------------
 * Where prompts split off the cached paths: a timestamp or a random id early
 * in a system prompt makes every request leave the cache at the same depth.
 * A report lists, per tenant, the branch points where the most admissions
 * split off with the fewest later hits past them, over the window ending now.
 *
 *   clm_divergence_report *report = NULL;
 *   if (clm_engine_divergence_report(&report, engine, 3, 2, NULL, 0) == CLM_OK) {
 *     for (size_t i = 0; i < clm_divergence_report_count(report); ++i) {
 *       clm_branch_point p = CLM_BRANCH_POINT_INIT;
 *       clm_divergence_report_point(&p, report, i);
 *       printf("%.*s: %llu splits at token %d\n", (int)p.tenant_len, p.tenant,
 *              (unsigned long long)p.branches, p.depth);
 *     }
 *   }
 *   clm_divergence_report_free(report);
 */
typedef struct clm_divergence_report clm_divergence_report;
typedef struct clm_branch_point {
  uint32_t struct_size; /* sizeof(clm_branch_point) as the caller compiled it */
  const char *tenant;   /* the tenant's name (clm_admit_options.tenant), else "salt:" and 32 hex digits of
                           its salt's SHA-256, "" for no salt; not NUL-terminated */
  size_t tenant_len;
  int32_t adapter_id;
  int32_t depth;          /* tokens from the prompt's start to the split (whole pages) */
  uint64_t branches;      /* admissions that split off here, in the window */
  uint64_t hits;          /* admissions that went on past it into a cached branch, in the window */
  uint64_t overcount;     /* branches may count up to this many splits of points it displaced */
  const int32_t *before;  /* the prompt's tokens just before the split */
  size_t n_before;
  const int32_t *after;   /* ... and just after it (the request that split off) */
  size_t n_after;
  const int32_t *cached_after; /* the cached path's tokens after it */
  size_t n_cached_after;
} clm_branch_point;
#define CLM_BRANCH_POINT_INIT \
  { sizeof(clm_branch_point), NULL, 0, 0, 0, 0, 0, 0, NULL, 0, NULL, 0, NULL, 0 }
/* Takes the report: at most top_per_tenant (>= 1) points per tenant, those
 * with at least min_branches splits; tenant (bytes [0, tenant_len), up to
 * 65536; NULL or empty = every tenant, so the default namespace's points,
 * named "", come only with the others) keeps one tenant's. The caller owns *out (free it with
 * clm_divergence_report_free). CLM_ERR_FAILED_PRECONDITION when the engine
 * was created with divergence = 0. */
CLM_API clm_status clm_engine_divergence_report(clm_divergence_report **out, clm_engine *engine,
                                                int32_t top_per_tenant, uint64_t min_branches, const char *tenant,
                                                size_t tenant_len);
CLM_API size_t clm_divergence_report_count(const clm_divergence_report *report);
CLM_API int64_t clm_divergence_report_window_ms(const clm_divergence_report *report);
/* Point `index` (< count): set out->struct_size first; only that many bytes
 * are written. Its pointers belong to the report (valid until it is freed).
 * CLM_ERR_INVALID_ARGUMENT for an index past the last point. */
CLM_API clm_status clm_divergence_report_point(clm_branch_point *out, const clm_divergence_report *report,
                                               size_t index);
CLM_API void clm_divergence_report_free(clm_divergence_report *report);

/* ---- CLM anomalies (docs/observability.md) --------------------------------
 * What an operator watches of CLM suffix reuse: suffix keys looked up often
 * while the SRC head keeps scoring their sequences low (a sign of a bad keyer
 * rule or a bad head), and what the snapshot store did to keys (blacklisted
 * or let go and why, versions created, drift). Each snapshot lookup
 * (clm_engine_lookup_snapshots) records its sequence's last SRC score with
 * the key, once per sequence and key (of its last 64 keys). A key is *low-SRC* when, in the window,
 * it was seen at least clm_watch_min_sightings times with a median score
 * below clm_watch_low_src (scores go into bins of 0.025: the median is known
 * to 0.0125).
 *
 *   clm_anomaly_report *report = NULL;
 *   if (clm_engine_clm_anomalies(&report, engine) == CLM_OK) {
 *     for (size_t i = 0; i < clm_anomaly_report_low_src_count(report); ++i) {
 *       clm_low_src_key k = CLM_LOW_SRC_KEY_INIT;
 *       clm_anomaly_report_low_src_key(&k, report, i);
 *       printf("%.*s: seen %llu times, median SRC %.3f\n", (int)k.key_len, k.key,
 *              (unsigned long long)k.sightings, k.median_src);
 *     }
 *   }
 *   clm_anomaly_report_free(report);
 */
typedef struct clm_anomaly_report clm_anomaly_report;
typedef struct clm_low_src_key { /* no padding: a later version's fields go at the end */
  uint32_t struct_size; /* sizeof(clm_low_src_key) as the caller compiled it */
  int32_t adapter_id;
  const char *tenant;   /* as clm_branch_point.tenant; not NUL-terminated */
  size_t tenant_len;
  const char *key;      /* the suffix key; not NUL-terminated */
  size_t key_len;
  uint64_t sightings;   /* in the window */
  float median_src;     /* the middle of the 0.025 bin holding the median */
  int32_t reserved;     /* 0 */
} clm_low_src_key;
#define CLM_LOW_SRC_KEY_INIT \
  { sizeof(clm_low_src_key), 0, NULL, 0, NULL, 0, 0, 0.0f, 0 }
#define CLM_WATCH_EVENT_BLACKLISTED 0     /* by the outcome breaker or an administrator: reason, until_ms */
#define CLM_WATCH_EVENT_UNBLACKLISTED 1   /* let go by an administrator */
#define CLM_WATCH_EVENT_VERSION_CREATED 2 /* a record stored a key's first or a new version: version */
#define CLM_WATCH_EVENT_DRIFT 3           /* a version started because the key's records drifted: version */
#define CLM_WATCH_EVENT_LOW_SRC 4         /* a key turned low-SRC: sightings, median_src */
typedef struct clm_watch_event { /* no padding: a later version's fields go at the end */
  uint32_t struct_size; /* sizeof(clm_watch_event) as the caller compiled it */
  int32_t kind;         /* CLM_WATCH_EVENT_* */
  int64_t time_ms;      /* since the Unix epoch */
  const char *tenant;   /* as clm_low_src_key.tenant */
  size_t tenant_len;
  const char *key;
  size_t key_len;
  const char *reason;   /* blacklisted: why (the breaker's figures or the administrator's words) */
  size_t reason_len;
  int64_t until_ms;     /* blacklisted: until when */
  int32_t adapter_id;
  int32_t version;      /* version created, drift */
  int32_t by_breaker;   /* blacklisted: 1 by the outcome breaker, 0 by an administrator */
  float median_src;     /* low-SRC */
  uint64_t sightings;   /* low-SRC */
} clm_watch_event;
#define CLM_WATCH_EVENT_INIT \
  { sizeof(clm_watch_event), 0, 0, NULL, 0, NULL, 0, NULL, 0, 0, 0, 0, 0, 0.0f, 0 }
/* Takes the report as of now: the low-SRC keys (the most seen first) and the
 * newest clm_watch_max_events events (oldest first). The caller owns *out
 * (free it with clm_anomaly_report_free). CLM_ERR_FAILED_PRECONDITION for an
 * engine without a snapshot store or created with clm_watch = 0. */
CLM_API clm_status clm_engine_clm_anomalies(clm_anomaly_report **out, const clm_engine *engine);
CLM_API size_t clm_anomaly_report_low_src_count(const clm_anomaly_report *report);
CLM_API size_t clm_anomaly_report_event_count(const clm_anomaly_report *report);
/* The settings the report was made with (0 for a NULL report). */
CLM_API int64_t clm_anomaly_report_window_ms(const clm_anomaly_report *report);
CLM_API int64_t clm_anomaly_report_min_sightings(const clm_anomaly_report *report);
CLM_API float clm_anomaly_report_low_src(const clm_anomaly_report *report);
/* Entry `index` (< its count): set out->struct_size first; only that many
 * bytes are written. Its pointers belong to the report (valid until it is
 * freed). CLM_ERR_INVALID_ARGUMENT for an index past the last. */
CLM_API clm_status clm_anomaly_report_low_src_key(clm_low_src_key *out, const clm_anomaly_report *report,
                                                  size_t index);
CLM_API clm_status clm_anomaly_report_event(clm_watch_event *out, const clm_anomaly_report *report, size_t index);
/* Event `index` as the JSON line the callback got: *line_len always receives
 * its length; when line_len + 1 exceeds line_capacity nothing is written and
 * CLM_ERR_INVALID_ARGUMENT is returned (line = NULL, line_capacity = 0 is a
 * sizing call). */
CLM_API clm_status clm_anomaly_report_event_json(char *line, size_t line_capacity, size_t *line_len,
                                                 const clm_anomaly_report *report, size_t index);
CLM_API void clm_anomaly_report_free(clm_anomaly_report *report);

/* ---- KV events for cache-aware routers (docs/fleet.md) --------------------
 * An engine created with kv_events = 1 publishes its cache's changes (see
 * clm_kv_event above). Each of these is CLM_ERR_FAILED_PRECONDITION on an
 * engine without them. */
/* Returns once every event recorded so far is published, or
 * CLM_ERR_FAILED_PRECONDITION after timeout_ms (>= 0). */
CLM_API clm_status clm_engine_flush_kv_events(clm_engine *engine, int32_t timeout_ms);
/* The hashes of every page now on `medium` (CLM_KV_MEDIUM_*), parents before
 * children: what a subscriber that missed nothing holds for this engine.
 * *count receives the number; hashes (capacity entries, NULL when 0) gets
 * them, or CLM_ERR_INVALID_ARGUMENT when capacity is short (call again: the
 * cache may have grown meanwhile). */
CLM_API clm_status clm_engine_kv_event_blocks(uint64_t *hashes, size_t capacity, size_t *count,
                                              const clm_engine *engine, int32_t medium);
/* The PUB (replay = 0) or replay (replay = 1) endpoint as bound, NUL-terminated
 * ("tcp://127.0.0.1:40123" for a "*" port; "" with a callback, or without a
 * replay socket). *len receives its length; short text_capacity is
 * CLM_ERR_INVALID_ARGUMENT as for clm_engine_metrics_text. */
CLM_API clm_status clm_engine_kv_events_endpoint(char *text, size_t text_capacity, size_t *len,
                                                 const clm_engine *engine, int32_t replay);

/* ---- CLM suffix reuse: the SRC head (docs/clm.md) ------------------------
 * A tiny head on one layer's attention output scores, per running sequence
 * and step, how likely the current suffix repeats an earlier one (SRC). The
 * engine keeps each sequence's running mean, so a step passes only the new
 * rows. Weights come from a safetensors file or from host memory (copied). */
#define CLM_GELU_TANH 0 /* 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))) */
#define CLM_GELU_ERF 1  /* 0.5x(1 + erf(x / sqrt(2))) */
/* clm_engine_load_src_head only: the GELU the file names in its "gelu"
 * metadata (as clm_fit and write_src_head record it). */
#define CLM_GELU_FROM_FILE (-1)

/* Activation element types (hidden states, attention outputs). */
#define CLM_DTYPE_F32 0
#define CLM_DTYPE_F16 1
#define CLM_DTYPE_BF16 2

/* Loads src_head.w1 [hidden/4, hidden], src_head.b1 [hidden/4], src_head.w2
 * [hidden/4], src_head.b2 [1] (f32, f16 or bf16) and installs the head,
 * replacing any earlier one. gelu: CLM_GELU_TANH, CLM_GELU_ERF or
 * CLM_GELU_FROM_FILE. A file whose "gelu" metadata names another form than
 * the one asked for, or that names none when CLM_GELU_FROM_FILE is asked
 * for, is CLM_ERR_INVALID_ARGUMENT (the earlier head stays). */
CLM_API clm_status clm_engine_load_src_head(clm_engine *engine, const char *path, int32_t gelu);
/* The same from host memory, row-major f32: w1 [hidden/4 * hidden], b1 and w2
 * [hidden/4]. The arrays are copied; the caller keeps ownership. */
CLM_API clm_status clm_engine_set_src_head(clm_engine *engine, int32_t hidden, const float *w1, const float *b1,
                                           const float *w2, float b2, int32_t gelu);

typedef struct clm_src_decision {
  float score;      /* SRC in [0, 1]; 0 when not scored */
  float threshold;  /* the threshold it was compared with */
  uint8_t scored;   /* 0: the sequence has no non-special row yet */
  uint8_t reuse;    /* 1: look up a snapshot and inject it */
  uint8_t baseline; /* 1: the breaker switched this sequence off for good */
  uint8_t reserved;
} clm_src_decision;

/* One SRC step: attn_out [n_rows][hidden] (dtype CLM_DTYPE_*) holds the new
 * rows of one layer's attention output, seqs[i] owning rows indptr[i] ..
 * indptr[i+1]-1 (indptr has n_seqs + 1 entries; 0 rows is allowed);
 * token_ids[n_rows] their ids. Writes decisions[n_seqs]. Nothing changes on
 * error: CLM_ERR_FAILED_PRECONDITION without a head, CLM_ERR_INVALID_ARGUMENT
 * for bad shapes, NaN/Inf rows or a sequence listed twice. */
CLM_API clm_status clm_engine_src_step(clm_src_decision *decisions, clm_engine *engine, clm_seq *const *seqs,
                                       size_t n_seqs, const void *attn_out, int32_t dtype, size_t n_rows,
                                       int32_t hidden, const int32_t *token_ids, const int32_t *indptr);
/* The same step for a GPU host, the engine's pool in device memory: attn_out
 * and token_ids are DEVICE memory of the pool's device, indptr and decisions
 * host memory; the work is queued on `stream` (a cudaStream_t; NULL = the
 * default stream) and the call waits for it. The running sums stay on the
 * device (only the scores come back), and a sequence is stepped either here
 * or with clm_engine_src_step, never both (CLM_ERR_FAILED_PRECONDITION).
 * CLM_ERR_UNSUPPORTED in a library built without CUDA;
 * CLM_ERR_FAILED_PRECONDITION for an engine whose pool is in host memory. */
CLM_API clm_status clm_engine_src_step_device(clm_src_decision *decisions, clm_engine *engine,
                                              clm_seq *const *seqs, size_t n_seqs, const void *attn_out,
                                              int32_t dtype, size_t n_rows, int32_t hidden,
                                              const int32_t *token_ids, const int32_t *indptr, void *stream);
/* Whether each snapshot lookup the last step asked for found one (found[i]
 * != 0). After src_breaker_steps consecutive failed lookups at scores above
 * src_breaker_score a sequence falls back to baseline (reuse is 0 from then). */
CLM_API clm_status clm_engine_report_retrieval(clm_engine *engine, clm_seq *const *seqs, size_t n_seqs,
                                               const uint8_t *found);

/* ---- CLM suffix reuse: snapshots (docs/clm.md) -----------------------------
 * A snapshot is a last-layer hidden state projected by PCA to snapshot_dim
 * and L2-normalised; the host stores it, and on a later reuse decision the
 * adapter adds residual_scale * (W s + b) to the hidden states of the layers
 * it injects at. Weights come from safetensors files or host memory (copied). */

/* Loads snapshot.mean [hidden] and snapshot.components [snapshot_dim, hidden]
 * (f32/f16/bf16) and installs the projection, replacing any earlier one. */
CLM_API clm_status clm_engine_load_snapshot_projection(clm_engine *engine, const char *path);
/* The same from host memory (row-major f32, copied): mean [hidden],
 * components [snapshot_dim * hidden] with orthonormal rows. */
CLM_API clm_status clm_engine_set_snapshot_projection(clm_engine *engine, int32_t hidden, int32_t snapshot_dim,
                                                      const float *mean, const float *components);
/* Snapshots of rows [n_rows][hidden] (dtype CLM_DTYPE_*) into
 * snapshots[n_rows * snapshot_dim] (f32); snapshots_len is its length in floats. */
CLM_API clm_status clm_engine_make_snapshots(float *snapshots, size_t snapshots_len, clm_engine *engine,
                                             const void *rows, int32_t dtype, size_t n_rows, int32_t hidden);

typedef struct clm_adapter_options {
  uint32_t struct_size;   /* sizeof(clm_adapter_options) as the caller compiled it */
  int32_t num_layers;     /* the model's layer count (required, >= 1) */
  const int32_t *layers;  /* layers that inject (copied); NULL / 0 = the last 3 */
  size_t n_layers;
  float residual_scale;   /* default 0.3 */
} clm_adapter_options;
CLM_API clm_status clm_adapter_options_init(clm_adapter_options *options, size_t struct_size);
/* clm_adapter_options_init's defaults as a static initialiser (num_layers 0:
 * it must still be set). */
#define CLM_ADAPTER_OPTIONS_INIT \
  { sizeof(clm_adapter_options), 0, NULL, 0, 0.3f }

/* Loads adapter.weight [hidden, snapshot_dim] and adapter.bias [hidden]
 * (f32/f16/bf16) and installs the adapter, replacing any earlier one. */
CLM_API clm_status clm_engine_load_snapshot_adapter(clm_engine *engine, const char *path,
                                                    const clm_adapter_options *options);
/* The same from host memory (row-major f32, copied). */
CLM_API clm_status clm_engine_set_snapshot_adapter(clm_engine *engine, int32_t snapshot_dim, int32_t hidden,
                                                   const float *weight, const float *bias,
                                                   const clm_adapter_options *options);
/* Adds residual_scale * (W snapshots[i] + b) to rows indptr[i] .. indptr[i+1]-1
 * of hidden_states [n_rows][hidden] (dtype CLM_DTYPE_*, updated in place) for
 * each i with apply[i] != 0 whose sequence is not in baseline mode, when the
 * adapter injects at `layer` (else nothing changes and CLM_OK). snapshots:
 * [n_seqs][snapshot_dim] f32. On error hidden_states is untouched. */
CLM_API clm_status clm_engine_inject_snapshots(clm_engine *engine, void *hidden_states, int32_t dtype, size_t n_rows,
                                               int32_t hidden, clm_seq *const *seqs, size_t n_seqs,
                                               const int32_t *indptr, const float *snapshots, int32_t snapshot_dim,
                                               const uint8_t *apply, int32_t layer);

/* ---- CLM suffix reuse: the snapshot store (docs/c-api.md, "Snapshot store") --
 * An engine created with options->snapshot_store_path keeps the snapshots a
 * host records of repeated suffixes (SQLite shards, an HNSW index per tenant)
 * and finds them again for a reuse decision. A suffix is named either by the
 * user's text, which the engine's keyer turns into a key ("Please check the
 * status of order 789" and "What's the status of order #789?" share
 * "QUERY-ORDER-789-STATUS"; "Don't check order 789" is "NOT-QUERY-ORDER-789"),
 * or by a key of the host's own (1..256 printable ASCII bytes) with the group
 * level 2 must agree on. Precision first: text the keyer cannot pin down (a
 * greeting or thanks, an action with no object or entity, a word its lexicons
 * lack) gets a low-information key ("GREETING", "CANCEL", ...) that is never
 * stored and never served at levels 1 and 2, only at level 3. A sequence's
 * tenant is its cache salt and adapter id: no tenant ever sees another's
 * snapshots, fallbacks or blacklist at any level. Every call below is
 * CLM_ERR_FAILED_PRECONDITION on an engine without a store. */
#define CLM_SUFFIX_TEXT 0 /* suffixes[i] is the user's text (UTF-8); groups must be NULL */
#define CLM_SUFFIX_KEY 1  /* suffixes[i] is the host's key; groups[i] its group (NULL or "" = the key itself) */

/* Where a lookup found its snapshot. */
#define CLM_SNAPSHOT_MISS 0     /* nothing: the snapshot is zeros and apply 0 */
#define CLM_SNAPSHOT_EXACT 1    /* level 1: the key's newest stable version (else its newest, stable = 0) */
#define CLM_SNAPSHOT_ANN 2      /* level 2: the nearest stored snapshot of the same group (needs a query) */
#define CLM_SNAPSHOT_FALLBACK 3 /* level 3: the tenant's generic snapshot for a low-information text */

/* What recording a snapshot did (clm_engine_record_snapshot). */
#define CLM_RECORD_COUNTED 0     /* seen fewer than snapshot_min_usage times: counted, not stored */
#define CLM_RECORD_ADMITTED 1    /* stored as version 1 */
#define CLM_RECORD_CONFIRMED 2   /* agrees with the newest version (cosine >= snapshot_version_cosine) */
#define CLM_RECORD_NEW_VERSION 3 /* cosine below snapshot_version_cosine: stored as a new version */
#define CLM_RECORD_DRIFTED 4     /* the key's recent records drifted apart: stored as a new version */
#define CLM_RECORD_ABSTAINED 6   /* the text's key abstained (low information): neither stored nor counted */

#define CLM_SNAPSHOT_KEY_BYTES 264 /* room for a key of up to 263 bytes and its NUL */

/* One sequence's lookup result. An element of an output array, so it has a
 * fixed size and no struct_size: its layout never changes within a SONAME.
 * Later fields can only take the place of `reserved`, which this release
 * writes as zeros. */
typedef struct clm_snapshot_hit {
  int32_t level;         /* CLM_SNAPSHOT_* */
  float similarity;      /* cosine of the query and the snapshot (level 1 without a query: 1; level 3: 0) */
  int32_t version;       /* the served version (levels 1 and 2; else 0) */
  uint32_t key_len;      /* bytes of the served key, which may exceed what `key` holds (see key_truncated) */
  uint64_t fingerprint;  /* FNV-1a 64 of the served key (0 on a miss) */
  uint8_t stable;        /* level 1: the version is stable (confirmed by later records) */
  uint8_t key_truncated; /* 1 when key_len > CLM_SNAPSHOT_KEY_BYTES - 1: `key` holds its first bytes */
  uint8_t reserved[30];
  char key[CLM_SNAPSHOT_KEY_BYTES]; /* the served key, NUL-terminated: the suffix's own at level 1, a
                                       neighbour's at level 2, the fallback's name at level 3, "" on a miss */
} clm_snapshot_hit;

/* The key the engine's keyer makes of text[0, text_len) (UTF-8, at most 16
 * KiB). *key_len always receives the key's length in bytes (without the
 * NUL); when key_len + 1 exceeds key_capacity nothing is written to key and
 * CLM_ERR_INVALID_ARGUMENT is returned, so key = NULL, key_capacity = 0 is a
 * sizing call. *fingerprint (NULL: not wanted) receives the key's FNV-1a 64.
 * Low-information text (a greeting, an action with no object or entity, an
 * unknown word) still has a key; this call does not say that it abstained.
 * Text with no content, invalid UTF-8 or too long is CLM_ERR_INVALID_ARGUMENT. */
CLM_API clm_status clm_suffix_key(char *key, size_t key_capacity, size_t *key_len, uint64_t *fingerprint,
                                  const clm_engine *engine, const char *text, size_t text_len);

/* Looks up a snapshot for each running sequence seqs[i] under its tenant:
 * suffixes[i] (suffix_lens[i] bytes) names its suffix as suffix_kind says;
 * with CLM_SUFFIX_KEY, groups[i] / group_lens[i] (groups NULL: none) name
 * its group. queries [n_seqs * snapshot_dim] (NULL with queries_len 0: level
 * 2 is skipped) are the sequences' query snapshots. Writes hits[n_seqs],
 * snapshots [snapshots_len = n_seqs * snapshot_dim] (unit length on a hit,
 * zeros on a miss) and apply[n_seqs] (1 on a hit): what
 * clm_engine_inject_snapshots takes. Each lookup is also reported to the SRC
 * breaker as clm_engine_report_retrieval would (found = hit): do not report
 * it again. Everything is checked first (lengths, suffix_kind, keys, NaN/Inf
 * or zero queries, a sequence listed twice); on error nothing is written and
 * nothing changes. */
CLM_API clm_status clm_engine_lookup_snapshots(clm_snapshot_hit *hits, float *snapshots, size_t snapshots_len,
                                               uint8_t *apply, clm_engine *engine, clm_seq *const *seqs,
                                               size_t n_seqs, const char *const *suffixes, const size_t *suffix_lens,
                                               const char *const *groups, const size_t *group_lens,
                                               int32_t suffix_kind, const float *queries, size_t queries_len);

/* Records snapshot [snapshot_len = snapshot_dim] (normalised; stored as f16)
 * of a running sequence's suffix under its tenant: counts the suffix and,
 * once it has been seen snapshot_min_usage times, stores it, as a new
 * version when it disagrees with the newest one. *result receives a
 * CLM_RECORD_* value, *version the key's newest version afterwards (0 while
 * counted). A low-information text (the keyer abstained) is neither counted
 * nor stored: CLM_RECORD_ABSTAINED, *version 0. group / group_len as in
 * clm_engine_lookup_snapshots (NULL with CLM_SUFFIX_TEXT). A NaN/Inf or zero
 * snapshot is CLM_ERR_INVALID_ARGUMENT;
 * a database that cannot be written is CLM_ERR_IO. Nothing is stored on error. */
CLM_API clm_status clm_engine_record_snapshot(int32_t *result, int32_t *version, clm_engine *engine, clm_seq *seq,
                                              const char *suffix, size_t suffix_len, const char *group,
                                              size_t group_len, int32_t suffix_kind, const float *snapshot,
                                              size_t snapshot_len);

/* Whether the snapshot the last lookup served each sequence was right
 * (correct[i] != 0). Counted per (key looked up, key served): where the
 * accuracy falls below 95% (over at least 20 reports in 5 minutes), a key
 * served for itself is blacklisted for its tenant for a day and served at no
 * level; a key served for another (levels 2 and 3) is refused to that one
 * only, for as long (and blacklisted once refused to 8). A sequence whose
 * last lookup served nothing is
 * CLM_ERR_FAILED_PRECONDITION; one listed twice CLM_ERR_INVALID_ARGUMENT. */
CLM_API clm_status clm_engine_report_snapshot_outcome(clm_engine *engine, clm_seq *const *seqs, size_t n_seqs,
                                                      const uint8_t *correct);

/* Sets level 3's generic snapshot [snapshot_len = snapshot_dim] for the
 * tenant of the sequences admitted with cache salt tenant_salt[0, salt_len)
 * (NULL, 0: no salt) and adapter_id: name is a low-information key
 * ("GREETING", "THANKS", as clm_suffix_key gives them) or "*" for all of them,
 * 1..256 bytes. Replaces an earlier one; persisted. */
CLM_API clm_status clm_engine_set_fallback_snapshot(clm_engine *engine, const char *tenant_salt, size_t salt_len,
                                                    int32_t adapter_id, const char *name, size_t name_len,
                                                    const float *snapshot, size_t snapshot_len);

/* Writes the lookups' pending usage counts and saves every index file. */
CLM_API clm_status clm_engine_flush_snapshot_store(clm_engine *engine);
/* Deletes the snapshots unused for 30 days and used fewer than 5 times, with
 * their index entries, then vacuums; *deleted receives how many. */
CLM_API clm_status clm_engine_evict_snapshots(int64_t *deleted, clm_engine *engine);

/* ---- the snapshot store by hand: versions, pins, rollback, deletion, the
 * blacklist (docs/c-api.md, "Snapshot store administration") ----------------
 * What an administrator corrects in a running engine's store. A tenant is
 * named as in clm_engine_set_fallback_snapshot (cache salt and adapter id), a
 * key as in clm_engine_record_snapshot (suffix, group, suffix_kind; a text
 * whose key abstained names nothing stored: CLM_ERR_NOT_FOUND). Each call
 * checks everything first and changes nothing on error: CLM_ERR_NOT_FOUND
 * for a key, version, pin, blacklist entry or tenant that is not there,
 * CLM_ERR_INVALID_ARGUMENT for a bad argument, CLM_ERR_FAILED_PRECONDITION
 * on an engine without a store. */

/* One version of a key (clm_engine_snapshot_versions). An element of an
 * output array: fixed size, no struct_size; later fields take the place of
 * `reserved`, written as zeros. */
typedef struct clm_snapshot_version {
  int32_t version;
  uint8_t readable;      /* its BLOB passes its checks (an unreadable one is never served) */
  uint8_t stable;        /* confirmed by enough later records */
  uint8_t pinned;        /* pinned by clm_engine_pin_snapshot_version */
  uint8_t served;        /* the version level 1 serves now */
  int64_t created_at;    /* Unix seconds */
  int64_t last_used;     /* Unix seconds of its latest use, once written */
  int64_t usage_count;   /* lookups that served it */
  int64_t confirmations; /* records that agreed with it */
  uint8_t reserved[24];
} clm_snapshot_version;

/* A key's versions, newest first. *count always receives how many there are;
 * when they exceed capacity nothing is written and CLM_ERR_INVALID_ARGUMENT is
 * returned (versions = NULL, capacity = 0 is a sizing call). A key with no
 * stored version is CLM_ERR_NOT_FOUND. */
CLM_API clm_status clm_engine_snapshot_versions(clm_snapshot_version* versions, size_t capacity, size_t* count,
                                                clm_engine* engine, const char* tenant_salt, size_t salt_len,
                                                int32_t adapter_id, const char* suffix, size_t suffix_len,
                                                const char* group, size_t group_len, int32_t suffix_kind);

/* Serves `version` of the key at levels 1 and 2 from now on, whatever newer
 * versions are recorded, until clm_engine_unpin_snapshot_version. Persisted.
 * CLM_ERR_NOT_FOUND: no such version; CLM_ERR_FAILED_PRECONDITION: its
 * snapshot fails its checksum. */
CLM_API clm_status clm_engine_pin_snapshot_version(clm_engine* engine, const char* tenant_salt, size_t salt_len,
                                                   int32_t adapter_id, const char* suffix, size_t suffix_len,
                                                   const char* group, size_t group_len, int32_t suffix_kind,
                                                   int32_t version);
/* Lifts a key's pin. CLM_ERR_NOT_FOUND: it has none. */
CLM_API clm_status clm_engine_unpin_snapshot_version(clm_engine* engine, const char* tenant_salt, size_t salt_len,
                                                     int32_t adapter_id, const char* suffix, size_t suffix_len,
                                                     const char* group, size_t group_len, int32_t suffix_kind);
/* Deletes the key's versions newer than `version`; *deleted receives how
 * many. A pin on one of them is lifted. CLM_ERR_NOT_FOUND: no such version. */
CLM_API clm_status clm_engine_roll_back_snapshot_key(int64_t* deleted, clm_engine* engine, const char* tenant_salt,
                                                     size_t salt_len, int32_t adapter_id, const char* suffix,
                                                     size_t suffix_len, const char* group, size_t group_len,
                                                     int32_t suffix_kind, int32_t version);
/* Deletes every version of the key, with its index entries, admission count,
 * blacklist entry and pin; *deleted receives how many versions. */
CLM_API clm_status clm_engine_delete_snapshot_key(int64_t* deleted, clm_engine* engine, const char* tenant_salt,
                                                  size_t salt_len, int32_t adapter_id, const char* suffix,
                                                  size_t suffix_len, const char* group, size_t group_len,
                                                  int32_t suffix_kind);
/* Deletes everything of the tenant in every shard (rows, index files,
 * admission counts, blacklist entries, pins, fallbacks); *deleted_rows
 * receives how many snapshot rows. CLM_ERR_NOT_FOUND: the store holds nothing
 * of it. */
CLM_API clm_status clm_engine_delete_snapshot_tenant(int64_t* deleted_rows, clm_engine* engine, const char* tenant_salt,
                                                     size_t salt_len, int32_t adapter_id);
/* Refuses the key at every level until until_ms (milliseconds since the Unix
 * epoch, after now), with reason[0, reason_len) (1..1024 bytes), persisted;
 * replaces an entry it has. The key need not be stored yet. */
CLM_API clm_status clm_engine_blacklist_snapshot_key(clm_engine* engine, const char* tenant_salt, size_t salt_len,
                                                     int32_t adapter_id, const char* suffix, size_t suffix_len,
                                                     const char* group, size_t group_len, int32_t suffix_kind,
                                                     const char* reason, size_t reason_len, int64_t until_ms);
/* One key refused at every level (clm_engine_snapshot_blacklist). An element
 * of an output array: fixed size, no struct_size; later fields take the place
 * of `reserved`, written as zeros. The strings are NUL-terminated and hold
 * their first CLM_SNAPSHOT_KEY_BYTES - 1 bytes (the *_truncated flag says when
 * that is not all of them; a salt may hold NULs: use salt_len). */
typedef struct clm_snapshot_blacklist_entry {
  int64_t until_ms;     /* in force until (milliseconds since the Unix epoch) */
  uint64_t fingerprint; /* FNV-1a 64 of the key */
  int32_t adapter_id;   /* the tenant: its adapter id ... */
  uint32_t salt_len;    /* ... and its cache salt's length */
  uint32_t key_len;
  uint32_t reason_len;
  uint8_t by_hand; /* 1: clm_engine_blacklist_snapshot_key; 0: the accuracy breaker */
  uint8_t salt_truncated;
  uint8_t key_truncated;
  uint8_t reason_truncated;
  uint8_t reserved[20];
  char salt[CLM_SNAPSHOT_KEY_BYTES];
  char key[CLM_SNAPSHOT_KEY_BYTES];
  char reason[CLM_SNAPSHOT_KEY_BYTES];
} clm_snapshot_blacklist_entry;

/* The blacklist entries in force, by tenant and key. *count always receives
 * how many; when they exceed capacity nothing is written and
 * CLM_ERR_INVALID_ARGUMENT is returned (entries = NULL, capacity = 0 is a
 * sizing call). */
CLM_API clm_status clm_engine_snapshot_blacklist(clm_snapshot_blacklist_entry *entries, size_t capacity,
                                                 size_t *count, clm_engine *engine);

/* Lifts the key's blacklist entry (set by hand or by the accuracy breaker)
 * and forgets its reported outcomes. CLM_ERR_NOT_FOUND: none in force. */
CLM_API clm_status clm_engine_unblacklist_snapshot_key(clm_engine* engine, const char* tenant_salt, size_t salt_len,
                                                       int32_t adapter_id, const char* suffix, size_t suffix_len,
                                                       const char* group, size_t group_len, int32_t suffix_kind);

/* ---- attention and KV kernels over the engine's pool (docs/kernels.md) ----
 * For a host that brings its own weights: write the K/V of new tokens into
 * the engine's pool, and compute attention over a sequence's pages (the
 * reused prefix and the new tokens) without writing paged kernels.
 *
 * Shapes (row-major; activations f32, KV in the pool's kv_dtype):
 *   k, v      [n_slots][kv_heads][head_dim]           (clm_engine_write_kv)
 *   q, out    [n_new][num_q_heads][head_dim]           (prefill: the last n_new tokens)
 *             [n_seqs][num_q_heads][head_dim]          (decode: each sequence's last token)
 * Grouped-query attention: q head h reads kv head h / (num_q_heads / kv_heads).
 * Every array comes with its length (elements, or bytes for page buffers);
 * q, out, k and v must hold exactly what the shape needs. Nothing outside
 * the arrays or the pool is read or written.
 *
 * Where the memory is, by the pool's memory:
 * - CLM_MEMORY_HOST: host pointers; the CPU kernels (threads: num_threads),
 *   synchronous.
 * - CLM_MEMORY_DEVICE: the CUDA kernels when the library was built with CUDA
 *   (else CLM_ERR_UNSUPPORTED). q, out, k, v: device memory of the pool's
 *   device; page ids, indptr, last_page_len and slots stay host arrays
 *   (validated, then uploaded). The work is queued on `stream` (a
 *   cudaStream_t; NULL = the default stream) and the call returns: buffers
 *   must stay valid until the stream reaches it, and an error inside a kernel
 *   surfaces at the next synchronisation. head_dim 64 or 128 for attention.
 *   The library keeps one CUDA workspace (device scratch, grown as needed) per
 *   host thread and device, freed when the thread exits.
 * - CLM_MEMORY_NONE: no KV bytes; every call is CLM_ERR_FAILED_PRECONDITION.
 *
 * Every call validates before it writes anything (on error nothing was
 * written): layer, head counts, lengths, every page id and slot against the
 * pool, last_page_len in [1, page_size], out not overlapping q, and (host
 * pools) finite queries. Page ids are checked against the pool, not against
 * sequences: pass only pages the host holds (clm_seq_page_table,
 * clm_engine_batch_page_table, clm_seq_slots). Cached prefix pages are shared:
 * read them, never write them. Calls may run on many threads at once, and
 * alongside the engine's calls, as long as no two write the same pages. */
typedef struct clm_attention_params {
  uint32_t struct_size;   /* sizeof(clm_attention_params) as the caller compiled it */
  int32_t layer;          /* in [0, num_layers) (default 0) */
  int32_t num_q_heads;    /* a positive multiple of kv_heads (required: default 0 is rejected) */
  float softmax_scale;    /* 0 (default) = 1/sqrt(head_dim) */
  int32_t sliding_window; /* > 0: a query at position p sees keys in (p - window, p]; 0 (default) = all */
  int32_t num_threads;    /* host pools: CPU threads, 0 (default) = every hardware thread */
  void *stream;           /* device pools: the cudaStream_t to queue on; NULL (default) = the default stream */
} clm_attention_params;
/* Fills *params with defaults. struct_size: sizeof(*params) as compiled by
 * the caller; a size this library does not know is CLM_ERR_INVALID_ARGUMENT. */
CLM_API clm_status clm_attention_params_init(clm_attention_params *params, size_t struct_size);
/* clm_attention_params_init's defaults as a static initialiser (num_q_heads
 * 0: it must still be set). */
#define CLM_ATTENTION_PARAMS_INIT \
  { sizeof(clm_attention_params), 0, 0, 0.0f, 0, 0, NULL }

/* Scatters the K/V rows of one layer into the pool: row i of k and v (each
 * kv_len = n_slots * kv_heads * head_dim floats) goes to slots[i] (page *
 * page_size + row, as clm_seq_slots gives them), converted to the pool's
 * dtype (round to nearest even). stream: device pools only (NULL = default). */
CLM_API clm_status clm_engine_write_kv(clm_engine *engine, int32_t layer, const int64_t *slots, size_t n_slots,
                                       const float *k, const float *v, size_t kv_len, void *stream);

/* Causal attention (GQA, optional sliding window) of the last n_new tokens of
 * a sequence of kv_len tokens, whose K/V (the cached prefix and the new
 * tokens, all written) are in pages[0, n_pages) (at least ceil(kv_len /
 * page_size) ids: clm_seq_page_table). q and out: q_len = out_len = n_new *
 * num_q_heads * head_dim floats. */
CLM_API clm_status clm_engine_paged_prefill_attention(float *out, size_t out_len, const clm_engine *engine,
                                                      const clm_attention_params *params, const float *q,
                                                      size_t q_len, int32_t n_new, const int32_t *pages,
                                                      size_t n_pages, int32_t kv_len);

/* Attention of one query per sequence (its last token) over its pages, for a
 * ragged batch in FlashInfer's CSR form as clm_engine_batch_page_table
 * writes it: sequence i uses pages indices[indptr[i], indptr[i+1]) (>= 1)
 * and rows [0, last_page_len[i]) of its last one. indptr: n_seqs + 1
 * entries; indices: n_indices; last_page_len: n_seqs. q and out: q_len =
 * out_len = n_seqs * num_q_heads * head_dim floats. */
CLM_API clm_status clm_engine_paged_decode_attention(float *out, size_t out_len, const clm_engine *engine,
                                                     const clm_attention_params *params, const float *q,
                                                     size_t q_len, const int32_t *indptr, const int32_t *indices,
                                                     size_t n_indices, const int32_t *last_page_len, size_t n_seqs);

/* Whole pages (every layer): dst_pages[i] <- src_pages[i], pair by pair in
 * order, between the pools of two engines of the same layout (dtype,
 * page_size, num_layers, kv_heads, head_dim), or within one engine (dst ==
 * src). With CUDA, either pool may be in device memory (host pools: pinned
 * memory makes the copy asynchronous). */
CLM_API clm_status clm_engine_copy_pages(clm_engine *dst, const int32_t *dst_pages, const clm_engine *src,
                                         const int32_t *src_pages, size_t n_pages, void *stream);
/* Packs pages[0, n_pages) into buffer (n_pages * page_bytes bytes, page_bytes
 * as clm_engine_kv_layout gives it; buffer_len at least that), and back.
 * Device pools: the buffer may be host or device memory. */
CLM_API clm_status clm_engine_gather_pages(void *buffer, size_t buffer_len, const clm_engine *engine,
                                           const int32_t *pages, size_t n_pages, void *stream);
CLM_API clm_status clm_engine_scatter_pages(clm_engine *engine, const int32_t *pages, size_t n_pages,
                                            const void *buffer, size_t buffer_len, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* CLM_H */

// Package clm is a Go binding of clmcache's C ABI (clm.h): an embeddable
// KV-cache library for LLM inference backends (prefix reuse over a paged KV
// pool).
//
//	opts, _ := clm.DefaultEngineOptions()
//	opts.NumPages = 65536
//	engine, err := clm.NewEngine(opts)
//	if err != nil { ... }
//	defer engine.Close()
//
//	seq, err := engine.Admit(prompt, nil)
//	cached, _ := seq.CachedTokens() // prompt[:cached] is reused
//	slots, _ := seq.Slots()         // write the K/V of prompt[cached:] here
//	... seq.Extend(next) per decode step ...
//	err = seq.Finish()              // publish prompt + output for later requests
//	seq.Close()
//
// Handles are freed by Close (idempotent); a finalizer frees them too if Close
// was forgotten, but callers should not rely on it: the pool's pages stay
// locked until the handle is freed. Every call on a closed handle returns an
// *Error with code FailedPrecondition that wraps ErrClosed.
//
// An Engine may be used from many goroutines at once. A Seq serializes its own
// calls with a mutex, so it may be shared too (the C ABI forbids concurrent
// use of one sequence handle; the wrapper enforces it).
//
// The binding finds the library with pkg-config (package clmcache): set
// PKG_CONFIG_PATH to <prefix>/lib/pkgconfig of an installation, and
// LD_LIBRARY_PATH to <prefix>/lib to run.
package clm

/*
#cgo pkg-config: clmcache
#include <stdint.h>
#include <stdlib.h>
#include <clm.h>

// The salt is a pointer inside the options struct: cgo forbids passing Go
// memory that holds a Go pointer, so the struct travels by value and the salt
// (which points into Go memory) as its own argument.
static clm_status clmgo_admit(clm_seq **out, clm_engine *engine, const int32_t *tokens, size_t n_tokens,
                              int use_options, clm_admit_options options, const char *salt, size_t salt_len) {
  options.cache_salt = salt;
  options.cache_salt_len = salt_len;
  return clm_engine_admit(out, engine, tokens, n_tokens, use_options ? &options : NULL);
}

// The same for clm_engine_plan_admission, which also gets its struct_size here.
static clm_status clmgo_plan_admission(clm_admission_plan *out, const clm_engine *engine, const int32_t *tokens,
                                       size_t n_tokens, int use_options, clm_admit_options options, const char *salt,
                                       size_t salt_len) {
  options.cache_salt = salt;
  options.cache_salt_len = salt_len;
  out->struct_size = sizeof *out;
  return clm_engine_plan_admission(out, engine, tokens, n_tokens, use_options ? &options : NULL);
}

// The same for clm_engine_pin_prefix.
static clm_status clmgo_pin_prefix(clm_engine *engine, const int32_t *tokens, size_t n_tokens, int use_options,
                                   clm_admit_options options, const char *salt, size_t salt_len, int64_t ttl_ms,
                                   uint64_t *pin_id, int32_t *pinned_tokens) {
  options.cache_salt = salt;
  options.cache_salt_len = salt_len;
  return clm_engine_pin_prefix(engine, tokens, n_tokens, use_options ? &options : NULL, ttl_ms, pin_id,
                               pinned_tokens);
}

// The same for clm_engine_hint_prefix (the key travels as bytes beside the salt).
static clm_status clmgo_hint_prefix(clm_engine *engine, const int32_t *tokens, size_t n_tokens, int use_options,
                                    clm_admit_options options, const char *salt, size_t salt_len, const char *key,
                                    size_t key_len, int32_t priority, int64_t ttl_ms, int32_t *reached) {
  options.cache_salt = salt;
  options.cache_salt_len = salt_len;
  return clm_engine_hint_prefix(engine, key, key_len, tokens, n_tokens, use_options ? &options : NULL, priority,
                                ttl_ms, reached);
}

// The KV-event callback (events.go): clmgoKVEventBatch is exported from Go,
// whose prototype drops the const of clm_kv_event_callback's, so this shim has
// the callback's exact type. user_data is a runtime/cgo.Handle, an integer:
// no Go pointer is kept in C memory.
extern void clmgoKVEventBatch(clm_kv_event_batch *batch, uintptr_t handle);
static void clmgo_kv_event_batch(const clm_kv_event_batch *batch, void *user_data) {
  clmgoKVEventBatch((clm_kv_event_batch *)batch, (uintptr_t)user_data);
}

// The same for the CLM watch's line callback (anomalies.go): clmgoClmWatchLine
// drops the const of clm_watch_line_callback's line; user_data is a handle.
extern void clmgoClmWatchLine(char *line, size_t line_len, uintptr_t handle);
static void clmgo_clm_watch_line(const char *line, size_t line_len, void *user_data) {
  clmgoClmWatchLine((char *)line, line_len, (uintptr_t)user_data);
}

// The same for the special token ids of the engine options (version 2), the
// KV-event callback (version 7) when kv_events_handle is not 0, and the CLM
// watch's line callback (version 9) when clm_watch_handle is not 0.
static clm_status clmgo_create(clm_engine **out, clm_engine_options options, const int32_t *special, size_t n_special,
                               uintptr_t kv_events_handle, uintptr_t clm_watch_handle) {
  options.special_token_ids = special;
  options.n_special_token_ids = n_special;
  if (kv_events_handle != 0) {
    options.kv_events_callback = clmgo_kv_event_batch;
    options.kv_events_callback_data = (void *)kv_events_handle;
  }
  if (clm_watch_handle != 0) {
    options.clm_watch_callback = clmgo_clm_watch_line;
    options.clm_watch_callback_data = (void *)clm_watch_handle;
  }
  return clm_engine_create(out, &options);
}
*/
import "C"

import (
	"runtime"
	"runtime/cgo"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// HeaderVersion is CLM_VERSION_NUMBER of the clm.h this package was compiled
// against; compare with Version() to detect a header/library skew.
const HeaderVersion = int(C.CLM_VERSION_NUMBER)

// Version is the library's version number (major*10000 + minor*100 + patch).
func Version() int { return int(C.clm_version()) }

// VersionString is the library's version as "major.minor.patch".
func VersionString() string { return C.GoString(C.clm_version_string()) }

// KVDType is the element type of the pool's K/V (CLM_KV_*).
type KVDType int32

const (
	KVF32  KVDType = C.CLM_KV_F32
	KVF16  KVDType = C.CLM_KV_F16
	KVBF16 KVDType = C.CLM_KV_BF16
)

// MemoryKind is where the pool keeps the KV bytes (CLM_MEMORY_*).
type MemoryKind int32

const (
	MemoryNone   MemoryKind = C.CLM_MEMORY_NONE
	MemoryHost   MemoryKind = C.CLM_MEMORY_HOST
	MemoryDevice MemoryKind = C.CLM_MEMORY_DEVICE
)

// EvictionPolicy chooses which unlocked prefixes are evicted first (CLM_EVICT_*).
type EvictionPolicy int32

const (
	EvictLRU      EvictionPolicy = C.CLM_EVICT_LRU
	EvictLFU      EvictionPolicy = C.CLM_EVICT_LFU
	EvictSLRU     EvictionPolicy = C.CLM_EVICT_SLRU
	EvictPriority EvictionPolicy = C.CLM_EVICT_PRIORITY
	// EvictGhostSLRU: SLRU whose ghost of evicted prefixes admits a returning
	// one to the protected segment (docs/eviction.md), with its defaults.
	EvictGhostSLRU EvictionPolicy = C.CLM_EVICT_GHOST_SLRU
)

// PriorityUpdate says how an admission's priority meets the priority already
// cached along its prompt (CLM_PRIORITY_*).
type PriorityUpdate int32

const (
	// PriorityRaise (the zero value, the default): each cached node keeps the
	// highest priority it was given, so a shared system prompt stays at the
	// priority it was admitted with once.
	PriorityRaise PriorityUpdate = C.CLM_PRIORITY_RAISE
	// PrioritySet: the whole prefix takes this admission's priority, so a hint
	// that a conversation comes back soon ends when it is admitted again
	// without one.
	PrioritySet PriorityUpdate = C.CLM_PRIORITY_SET
)

// EngineOptions mirrors clm_engine_options. Start from DefaultEngineOptions;
// NumPages has no default and must be set.
type EngineOptions struct {
	NumPages              int32
	PageSize              int32
	NumLayers             int32
	KVHeads               int32
	HeadDim               int32
	KVDType               KVDType
	Memory                MemoryKind
	Device                int32
	EvictionPolicy        EvictionPolicy
	SLRUProtectedFraction float64

	// Version 2: CLM suffix reuse (docs/clm.md).

	// SRCDailyRequests is the expected traffic (requests/day); it sets the
	// SRC threshold (0.8 + 0.05*log10(daily/10000), clamped to [0.7, 0.95])
	// when SRCThreshold < 0.
	SRCDailyRequests float64
	// SRCThreshold in [0, 1] fixes the threshold; < 0 derives it.
	SRCThreshold float32
	// SRCBreakerScore: scores above it whose retrieval failed count toward
	// the breaker.
	SRCBreakerScore float32
	// SRCBreakerSteps such steps in a row switch a sequence to baseline mode.
	SRCBreakerSteps int32
	// SpecialTokenIDs are left out of the SRC head's running mean (copied).
	SpecialTokenIDs []int32

	// Version 3: the semantic snapshot store (store.go).

	// SnapshotStorePath is the store's directory (":memory:" keeps it in
	// memory, for tests); "" is no store. Copied at creation.
	SnapshotStorePath string
	// SnapshotStoreShards (1..256) and SnapshotDim (floats per snapshot,
	// 1..4096) are fixed when the store is created.
	SnapshotStoreShards int32
	SnapshotDim         int32
	// SnapshotMinUsage is how often a suffix is seen before it is stored (>= 1).
	SnapshotMinUsage int64
	// SnapshotVersionCosine in (0, 1]: a record below this cosine to the
	// newest version is a new version.
	SnapshotVersionCosine float32
	// SnapshotSimilarityFloor in [-1, 1]: level 2 serves nothing below it.
	SnapshotSimilarityFloor float32
	// SnapshotANNEfSearch is level 2's search breadth.
	SnapshotANNEfSearch int32
	// SnapshotLookupTimeoutUS: a lookup waits this long for a busy shard, then misses.
	SnapshotLookupTimeoutUS int32

	// Version 4: the tiered KV cache (tiers.go, docs/tiers.md).

	// HostPages is the size, in pages of the pool's layout, of the host
	// tier that evicted pages move down to and load back from (>= 0; 0 is
	// no tiers).
	HostPages int32
	// WritePolicy says when a cached page gets its host copy.
	WritePolicy WritePolicy
	// StorageURL names the storage tier below the host tier (it needs
	// HostPages > 0): "file:///var/cache/clm?capacity_mb=4096" or
	// "redis://127.0.0.1:6379/0?prefix=clm:&ttl=3600"; "" is none. Copied at
	// creation.
	StorageURL string
	// PrefetchPolicy says how long an admission waits for pages found in storage.
	PrefetchPolicy PrefetchPolicy
	// PrefetchTimeoutMS is PrefetchTimeout's base wait, in milliseconds ...
	PrefetchTimeoutMS float64
	// PrefetchTimeoutPer1KTokensMS ... plus this per 1000 tokens fetched.
	PrefetchTimeoutPer1KTokensMS float64
	// StorageWorkers is the number of threads that talk to storage, 1..64.
	StorageWorkers int32
	// StorageBatchPages is the number of pages per storage call, 1..4096.
	StorageBatchPages int32
	// SnapshotReadOnly opens the snapshot store read-only beside the process
	// that writes it: lookups only (records, outcomes, evictions and
	// administration fail with FailedPrecondition).
	SnapshotReadOnly bool
	// SnapshotMaintenanceIntervalMS > 0 evicts and flushes the snapshot store
	// on a background thread this often (0: off, the host evicts).
	SnapshotMaintenanceIntervalMS int64
	// ModelID is the host's fingerprint of its model (weights + config), e.g.
	// the SHA-256 of its weights file: hashed into every stored page's key
	// and header, so that no other model is served them. Required with a
	// storage tier.
	ModelID string
	// PageSecretFile is a file (not readable by everyone) holding the
	// deployment secret that signs every stored page (AES-256-GMAC); "" is none.
	PageSecretFile string
	// PageSecretEnv is the name of the environment variable holding it
	// instead (at most one of the two).
	PageSecretEnv string
	// MaxQueuedFetches caps the fetches waiting for a storage worker
	// (1..2^20): past it the oldest prefetch, or the new fetch, is dropped.
	MaxQueuedFetches int32
	// BreakerFailures failed storage calls in a row stop storage being asked.
	BreakerFailures int32
	// AdmissionDeadlineMS bounds an admission's wait for storage, whatever
	// the prefetch policy.
	AdmissionDeadlineMS float64
	// BreakerOpenMS is how long storage is not asked before one call probes it.
	BreakerOpenMS float64

	// Version 7: KV events for cache-aware routers (events.go, docs/fleet.md).
	// Copied at creation.

	// KVEvents publishes every page that enters or leaves the pool or the
	// host tier. It needs ModelID: the block hashes name the model.
	KVEvents bool
	// KVEventsBind says whether the PUB socket binds or connects.
	KVEventsBind KVEventsBindMode
	// KVEventsEndpoint is the PUB socket, e.g. "tcp://127.0.0.1:*" for a free
	// port (Engine.KVEventsEndpoint says which); "" is
	// "tcp://127.0.0.1:5557".
	KVEventsEndpoint string
	// KVEventsReplayEndpoint is a ROUTER socket (always bound) that sends
	// missed batches again on request; "" is none.
	KVEventsReplayEndpoint string
	// KVEventsTopic is every message's first frame, up to 256 bytes, e.g.
	// llm-d's "kv@<pod>@<model>"; "" is none.
	KVEventsTopic string
	// KVEventsCallback, when set, gets each batch instead of a socket (none
	// is opened, and a replay endpoint is refused), for a host that
	// publishes on a bus of its own. It runs on one thread of the library's,
	// never on an engine call's, one batch at a time, in order, and never
	// once Close has returned (what was recorded by then is delivered
	// during Close). It must not call the Engine (Close would deadlock), and
	// a panic in it ends the program, as in any goroutine. The batch is a Go
	// copy: the callback may keep it. The Engine holds the function until
	// Close (a finalizer cannot free an Engine it refers to).
	KVEventsCallback func(KVEventBatch)
	// KVEventsLayout is the msgpack shape of the events on the socket.
	KVEventsLayout KVEventsLayout
	// KVEventsBatchIntervalMS: a batch goes out this often ...
	KVEventsBatchIntervalMS int32
	// KVEventsMaxBatchEvents ... or as soon as it holds this many events.
	KVEventsMaxBatchEvents int32
	// KVEventsQueueEvents caps the events not yet published: past it they are
	// dropped, counted, and a resync (all cleared, then every cached page)
	// follows.
	KVEventsQueueEvents int32
	// KVEventsBufferBatches is how many batches the replay socket can send again.
	KVEventsBufferBatches int32
	// KVEventsSendHWM is the PUB socket's high-water mark, in messages.
	KVEventsSendHWM int32
	// KVEventsDataParallelRank is each batch's third field (KVEventBatch.DataParallelRank).
	KVEventsDataParallelRank int32
	// KVEventsTokenIDs sends the pages' token ids (the default); false
	// leaves them out, for routers that key on the block hashes.
	KVEventsTokenIDs bool

	// Version 8: divergence hot spots (divergence.go, docs/observability.md).

	// Divergence counts where prompts split off the cached paths: the branch
	// points of Engine.DivergenceReport and the match-depth counters of
	// Metrics (the default). Off, the report is FailedPrecondition and those
	// counters stay 0.
	Divergence bool
	// DivergenceBranchPoints is how many branch points are kept, 16..65536.
	DivergenceBranchPoints int32
	// DivergenceWindowMS is how far back a report counts, in milliseconds (>= 2).
	DivergenceWindowMS int32
	// DivergenceContextTokens is how many tokens are kept either side of a
	// split (BranchPoint.Before, ...), 0..64.
	DivergenceContextTokens int32

	// Version 9: CLM anomalies (anomalies.go, docs/observability.md; with a
	// snapshot store only). As every option, these are the library's
	// defaults in DefaultEngineOptions and passed as they are: a zero
	// ClmWatchMaxKeys is refused, not the default.

	// ClmWatch watches snapshot lookups' SRC scores and the store's key
	// events: Engine.ClmAnomalies, OnClmWatchLine and the ClmWatch* counters
	// of Metrics (the default). Off, the report is FailedPrecondition and
	// those counters stay 0.
	ClmWatch bool
	// ClmWatchMaxKeys is how many keys are watched at once, 1..2^20 (a full
	// watch gives up its least seen keys for new ones).
	ClmWatchMaxKeys int32
	// ClmWatchWindowMS is how far back a key's sightings count, in
	// milliseconds (>= 2).
	ClmWatchWindowMS int64
	// ClmWatchMinSightings (>= 1) and ClmWatchLowSrc (in (0, 1]): a key is
	// low-SRC once seen at least ClmWatchMinSightings times in the window
	// with a median SRC score below ClmWatchLowSrc.
	ClmWatchMinSightings int64
	ClmWatchLowSrc       float32
	// ClmWatchMaxEvents is how many events a report keeps, the newest,
	// 0..2^20.
	ClmWatchMaxEvents int32
	// OnClmWatchLine, when set, gets each event, and each key turning
	// low-SRC, as one JSON line (ClmEvent.JSON), e.g.
	//	{"time_ms":1796544000123,"event":"low_src","tenant":"acme","adapter_id":1,"key":"REFUND-ORDER","sightings":20,"median_src":0.0625}
	// It runs on the goroutine of the Engine call that caused the event
	// (LookupSnapshots, RecordSnapshot, ReportSnapshotOutcome,
	// BlacklistSnapshotKey, ...), before that call returns, in order, under
	// the engine's locks: it must return quickly and must not call the
	// Engine (that call would deadlock). A panic in it is recovered and
	// dropped: the engine call goes on, and later lines still come. It is
	// never called once Close has returned; the Engine holds the function
	// until then.
	OnClmWatchLine func(line string)
}

func engineOptionsInit(c *C.clm_engine_options) error {
	return call("clm_engine_options_init", func() C.clm_status {
		return C.clm_engine_options_init(c, C.sizeof_clm_engine_options)
	})
}

// DefaultEngineOptions is the library's defaults (clm_engine_options_init).
// It fails only on a header/library skew.
func DefaultEngineOptions() (EngineOptions, error) {
	var c C.clm_engine_options
	if err := engineOptionsInit(&c); err != nil {
		return EngineOptions{}, err
	}
	return EngineOptions{
		NumPages:              int32(c.num_pages),
		PageSize:              int32(c.page_size),
		NumLayers:             int32(c.num_layers),
		KVHeads:               int32(c.kv_heads),
		HeadDim:               int32(c.head_dim),
		KVDType:               KVDType(c.kv_dtype),
		Memory:                MemoryKind(c.memory),
		Device:                int32(c.device),
		EvictionPolicy:        EvictionPolicy(c.eviction_policy),
		SLRUProtectedFraction: float64(c.slru_protected_fraction),
		SRCDailyRequests:      float64(c.src_daily_requests),
		SRCThreshold:          float32(c.src_threshold),
		SRCBreakerScore:       float32(c.src_breaker_score),
		SRCBreakerSteps:       int32(c.src_breaker_steps),

		SnapshotStoreShards:     int32(c.snapshot_store_shards),
		SnapshotDim:             int32(c.snapshot_dim),
		SnapshotMinUsage:        int64(c.snapshot_min_usage),
		SnapshotVersionCosine:   float32(c.snapshot_version_cosine),
		SnapshotSimilarityFloor: float32(c.snapshot_similarity_floor),
		SnapshotANNEfSearch:     int32(c.snapshot_ann_ef_search),
		SnapshotLookupTimeoutUS: int32(c.snapshot_lookup_timeout_us),

		HostPages:                     int32(c.host_pages),
		WritePolicy:                   WritePolicy(c.write_policy),
		PrefetchPolicy:                PrefetchPolicy(c.prefetch_policy),
		PrefetchTimeoutMS:             float64(c.prefetch_timeout_ms),
		PrefetchTimeoutPer1KTokensMS:  float64(c.prefetch_timeout_per_1k_tokens_ms),
		StorageWorkers:                int32(c.storage_workers),
		StorageBatchPages:             int32(c.storage_batch_pages),
		SnapshotReadOnly:              c.snapshot_read_only != 0,
		SnapshotMaintenanceIntervalMS: int64(c.snapshot_maintenance_interval_ms),
		MaxQueuedFetches:              int32(c.max_queued_fetches),
		BreakerFailures:               int32(c.breaker_failures),
		AdmissionDeadlineMS:           float64(c.admission_deadline_ms),
		BreakerOpenMS:                 float64(c.breaker_open_ms),

		KVEvents:                 c.kv_events != 0,
		KVEventsBind:             KVEventsBindMode(c.kv_events_bind),
		KVEventsLayout:           KVEventsLayout(c.kv_events_layout),
		KVEventsBatchIntervalMS:  int32(c.kv_events_batch_interval_ms),
		KVEventsMaxBatchEvents:   int32(c.kv_events_max_batch_events),
		KVEventsQueueEvents:      int32(c.kv_events_queue_events),
		KVEventsBufferBatches:    int32(c.kv_events_buffer_batches),
		KVEventsSendHWM:          int32(c.kv_events_send_hwm),
		KVEventsDataParallelRank: int32(c.kv_events_data_parallel_rank),
		KVEventsTokenIDs:         c.kv_events_token_ids != 0,

		Divergence:              c.divergence != 0,
		DivergenceBranchPoints:  int32(c.divergence_branch_points),
		DivergenceWindowMS:      int32(c.divergence_window_ms),
		DivergenceContextTokens: int32(c.divergence_context_tokens),

		ClmWatch:             c.clm_watch != 0,
		ClmWatchMaxKeys:      int32(c.clm_watch_max_keys),
		ClmWatchWindowMS:     int64(c.clm_watch_window_ms),
		ClmWatchMinSightings: int64(c.clm_watch_min_sightings),
		ClmWatchLowSrc:       float32(c.clm_watch_low_src),
		ClmWatchMaxEvents:    int32(c.clm_watch_max_events),
	}, nil
}

// AdmitOptions mirrors clm_admit_options.
type AdmitOptions struct {
	// CacheSalt isolates tenants: requests with different salts never share
	// pages. "" is no salt.
	CacheSalt string
	// AdapterID is the LoRA adapter the KV is computed with.
	AdapterID int32
	// Priority (0-100) is used by EvictPriority and EvictGhostSLRU.
	Priority int32
	// PriorityUpdate says how Priority meets the priority already cached.
	PriorityUpdate PriorityUpdate
	// Tenant is the tenant's name in divergence reports
	// (Engine.DivergenceReport) and CLM anomalies (Engine.ClmAnomalies),
	// e.g. an API key's tenant. "" is none: a report names the salt's digest
	// ("salt:" and 32 hex digits), never the salt. It is not part of the
	// namespace: only CacheSalt keeps tenants apart.
	Tenant string
}

func admitOptionsInit(c *C.clm_admit_options) error {
	return call("clm_admit_options_init", func() C.clm_status {
		return C.clm_admit_options_init(c, C.sizeof_clm_admit_options)
	})
}

// DefaultAdmitOptions is the library's defaults (clm_admit_options_init).
func DefaultAdmitOptions() (AdmitOptions, error) {
	var c C.clm_admit_options
	if err := admitOptionsInit(&c); err != nil {
		return AdmitOptions{}, err
	}
	return AdmitOptions{AdapterID: int32(c.adapter_id), Priority: int32(c.priority),
		PriorityUpdate: PriorityUpdate(c.priority_update)}, nil
}

// KVLayout mirrors clm_kv_layout: page p, layer l: K at Base + p*PageBytes +
// l*LayerBytes, V LayerBytes/2 further, each [PageSize][KVHeads][HeadDim].
// Base is C memory (nil with MemoryNone) owned by the engine; it stays valid
// while the Engine or any of its Seqs is open.
type KVLayout struct {
	Base       unsafe.Pointer
	PageBytes  uint64
	LayerBytes uint64
	NumPages   int32
	PageSize   int32
	NumLayers  int32
	KVHeads    int32
	HeadDim    int32
	KVDType    KVDType
	Memory     MemoryKind
}

// Metrics mirrors clm_metrics.
type Metrics struct {
	TokensQueried   uint64
	TokensHit       uint64
	HitRate         float64
	CachedTokens    int64
	EvictableTokens int64
	ProtectedTokens int64
	PagesUsed       int32
	PagesFree       int32
	EvictedTokens   uint64
	Evictions       uint64
	InsertedTokens  uint64
	Admitted        uint64
	Finished        uint64
	Aborted         uint64
	Rejected        uint64
	ActiveSequences int64
	MetadataBytes   uint64

	// Version 2: the SRC head, its threshold and breaker.
	SRCThreshold         float64 // the threshold in force
	SRCSteps             uint64  // sequence-steps scored
	SRCUnscoredSteps     uint64  // sequence-steps with no non-special row yet
	SRCReuseDecisions    uint64  // steps whose score passed the threshold
	SRCRetrievalsFound   uint64  // reported snapshot lookups that found one
	SRCRetrievalsFailed  uint64  // ... that found none
	SRCBreakerTrips      uint64  // sequences switched to baseline mode, ever
	SRCBaselineSequences int64   // running sequences in baseline mode now
	SRCInjections        uint64  // sequence-layers that received a snapshot

	// Version 3: the snapshot store (all 0 without one).
	HasSnapshotStore      bool   // the engine was created with a store
	StoreLookups          uint64 // suffixes looked up (LookupSnapshots)
	StoreHitsExact        uint64 // ... answered at level 1
	StoreHitsANN          uint64 // ... at level 2
	StoreHitsFallback     uint64 // ... at level 3
	StoreMisses           uint64 // ... not answered (including busy and blacklisted ones)
	StoreBusyMisses       uint64 // misses because a shard stayed busy past the lookup timeout
	StoreBlacklistedSkips uint64 // lookups or level-2 candidates refused for a blacklisted key
	StoreANNUnavailable   uint64 // level-2 lookups while the index was being rebuilt
	StoreRecords          uint64 // snapshots recorded (RecordSnapshot)
	StoreCounted          uint64 // ... only counted: below SnapshotMinUsage
	StoreAdmissions       uint64 // suffixes stored for the first time
	StoreConfirmations    uint64 // records that agreed with the newest version
	StoreVersions         uint64 // new versions of stored suffixes (cosine or drift)
	StoreDriftVersions    uint64 // ... of them started by drift
	StoreEvictions        uint64 // rows deleted by EvictSnapshots
	StoreCorruptSkipped   uint64 // rows skipped because their checksum or header failed
	StoreIndexRebuilds    uint64 // similarity indexes rebuilt from the database
	StoreOutcomeReports   uint64 // outcomes reported (ReportSnapshotOutcome)
	StoreSnapshots        int64  // rows stored now
	StoreBlacklistedKeys  int64  // keys blacklisted now

	// Version 4: the tiered KV cache (all 0 without tiers).
	HasTiers             bool   // the engine has a host tier
	HasStorage           bool   // ... and a storage tier
	DeviceHitTokens      uint64 // cached tokens admissions found on the device
	HostHitTokens        uint64 // ... copied in from the host tier
	StorageHitTokens     uint64 // ... fetched from storage for the admission
	LoadBacks            uint64 // admissions that copied host pages to the device
	LoadedPages          uint64 // pages copied host -> device
	BackedUpPages        uint64 // pages copied device -> host (the write policy)
	StoredPages          uint64 // pages written to storage
	FetchedPages         uint64 // pages read from storage into the host tier
	PrefetchTimeouts     uint64 // admissions that stopped waiting for storage
	StorageErrors        uint64 // storage calls that failed (the admission recomputed)
	DroppedBackups       uint64 // host copies given up (no room, failed copy)
	HostCachedTokens     int64  // tokens with a host copy now
	HostPagesUsed        int64  // host-tier pages in use now
	HostPagesTotal       int64  // host-tier pages in all
	StorageCorruptPages  uint64 // stored values refused (checksum, layout, size)
	StorageDroppedWrites uint64 // pages storage could not write (full disk, ...)
	StorageEvictedPages  uint64 // pages the file backend removed for its size cap
	// Stored values refused: written for another model; not signed where this
	// engine has a page secret; signed with another secret (or forged).
	StorageForeignModelPages uint64
	StorageUnsignedPages     uint64
	StorageForgedPages       uint64
	StorageRepairedPages     uint64 // refused values deleted, so that the next store writes them again
	TierWorkerFailures       uint64 // tier jobs given up for want of host memory
	SignedPages              bool   // stored pages are signed
	StorageBreakerState      int32  // 0 closed, 1 open (storage not asked), 2 half-open
	StorageBreakerTrips      uint64 // times the storage breaker opened
	StorageBreakerSkips      uint64 // storage jobs skipped, fetches not queued, while it was open
	DroppedFetches           uint64 // fetches dropped for MaxQueuedFetches (prefetches first)
	MergedFetches            uint64 // fetches that joined one queued or running for the same prefix
	QueuedFetches            int64  // fetches waiting for a storage worker now

	// Version 6: KV events (all 0 when they are off; events.go).
	HasKVEvents              bool   // the engine publishes KV events
	KVEventsResyncPending    bool   // events are being dropped and a resync is to come
	KVEventsRecorded         uint64 // events the cache's changes made
	KVEventsPublished        uint64 // events sent in a batch (to the socket or the callback)
	KVEventsPublishedBatches uint64 // batches sent
	KVEventsDropped          uint64 // recorded while the queue was full: lost, then resynced
	KVEventsResyncs          uint64 // all cleared + every cached page, after drops
	KVEventsReplayRequests   uint64 // served on the replay socket
	KVEventsReplayRefused    uint64 // malformed replay requests
	KVEventsSendFailures     uint64 // messages the socket would not take
	KVEventsQueued           int64  // recorded, not yet published, now
	KVEventsNextSequence     uint64 // the Sequence the next batch gets

	// Version 7: where lookups stop matching (all 0 with Divergence off;
	// divergence.go).
	DivergedLookups uint64 // lookups that split off a longer cached path, a page or more left
	// MatchDepthCounts counts lookups by the tokens they matched:
	// MatchDepthCounts[i] those in (MatchDepthBounds[i-1], MatchDepthBounds[i]]
	// (bucket 0: nothing matched), the last those above 2^20.
	MatchDepthCounts    [19]uint64
	MatchDepthSumTokens uint64 // tokens matched, summed over those lookups

	// Version 8: CLM anomalies (all 0 without a snapshot store, or with
	// ClmWatch off; anomalies.go).
	ClmWatchSightings   uint64 // snapshot lookups recorded with their sequence's SRC score
	ClmWatchLowSrcTurns uint64 // times a key turned low-SRC
	// ClmWatchKeyEvents counts the store's key events by kind:
	// ClmWatchKeyEvents[ClmEventBlacklisted] .. [ClmEventDrift].
	ClmWatchKeyEvents   [4]uint64
	ClmWatchWatchedKeys int64 // keys watched now
	ClmWatchLowSrcKeys  int64 // ... of them low-SRC as of their last sighting
}

// PagedBatch is FlashInfer's paged-KV CSR description of a batch: sequence i
// uses Indices[Indptr[i]:Indptr[i+1]] and rows [0, LastPageLen[i]) of its
// last page.
type PagedBatch struct {
	Indptr      []int32
	Indices     []int32
	LastPageLen []int32
}

// Engine is a clm_engine: the KV pool and the prefix cache.
type Engine struct {
	mu     sync.RWMutex // read: a call in flight; write: Close
	ptr    *C.clm_engine
	closed atomic.Bool // read by Seqs without taking mu
	layout KVLayout    // the pool's shape, for the kernels' checks (kernels.go)
	// snapshotDim is the store's SnapshotDim as created, 0 without a store (store.go).
	snapshotDim int
	// kvEvents is the KVEventsCallback's handle (events.go), 0 without one;
	// released once clm_engine_free has returned.
	kvEvents cgo.Handle
	// clmWatch is the OnClmWatchLine's handle (anomalies.go), 0 without one;
	// released once clm_engine_free has returned.
	clmWatch cgo.Handle
}

// NewEngine creates an engine (clm_engine_create).
func NewEngine(opts EngineOptions) (*Engine, error) {
	var c C.clm_engine_options
	if err := engineOptionsInit(&c); err != nil {
		return nil, err
	}
	c.num_pages = C.int32_t(opts.NumPages)
	c.page_size = C.int32_t(opts.PageSize)
	c.num_layers = C.int32_t(opts.NumLayers)
	c.kv_heads = C.int32_t(opts.KVHeads)
	c.head_dim = C.int32_t(opts.HeadDim)
	c.kv_dtype = C.int32_t(opts.KVDType)
	c.memory = C.int32_t(opts.Memory)
	c.device = C.int32_t(opts.Device)
	c.eviction_policy = C.int32_t(opts.EvictionPolicy)
	c.slru_protected_fraction = C.double(opts.SLRUProtectedFraction)
	c.src_daily_requests = C.double(opts.SRCDailyRequests)
	c.src_threshold = C.float(opts.SRCThreshold)
	c.src_breaker_score = C.float(opts.SRCBreakerScore)
	c.src_breaker_steps = C.int32_t(opts.SRCBreakerSteps)
	c.snapshot_store_shards = C.int32_t(opts.SnapshotStoreShards)
	c.snapshot_dim = C.int32_t(opts.SnapshotDim)
	c.snapshot_min_usage = C.int64_t(opts.SnapshotMinUsage)
	c.snapshot_version_cosine = C.float(opts.SnapshotVersionCosine)
	c.snapshot_similarity_floor = C.float(opts.SnapshotSimilarityFloor)
	c.snapshot_ann_ef_search = C.int32_t(opts.SnapshotANNEfSearch)
	c.snapshot_lookup_timeout_us = C.int32_t(opts.SnapshotLookupTimeoutUS)
	c.host_pages = C.int32_t(opts.HostPages)
	c.write_policy = C.int32_t(opts.WritePolicy)
	c.prefetch_policy = C.int32_t(opts.PrefetchPolicy)
	c.prefetch_timeout_ms = C.double(opts.PrefetchTimeoutMS)
	c.prefetch_timeout_per_1k_tokens_ms = C.double(opts.PrefetchTimeoutPer1KTokensMS)
	c.storage_workers = C.int32_t(opts.StorageWorkers)
	c.storage_batch_pages = C.int32_t(opts.StorageBatchPages)
	c.snapshot_read_only = 0
	if opts.SnapshotReadOnly {
		c.snapshot_read_only = 1
	}
	c.snapshot_maintenance_interval_ms = C.int64_t(opts.SnapshotMaintenanceIntervalMS)
	c.max_queued_fetches = C.int32_t(opts.MaxQueuedFetches)
	c.breaker_failures = C.int32_t(opts.BreakerFailures)
	c.admission_deadline_ms = C.double(opts.AdmissionDeadlineMS)
	c.breaker_open_ms = C.double(opts.BreakerOpenMS)
	c.kv_events = cFlag(opts.KVEvents)
	c.kv_events_bind = C.int32_t(opts.KVEventsBind)
	c.kv_events_layout = C.int32_t(opts.KVEventsLayout)
	c.kv_events_batch_interval_ms = C.int32_t(opts.KVEventsBatchIntervalMS)
	c.kv_events_max_batch_events = C.int32_t(opts.KVEventsMaxBatchEvents)
	c.kv_events_queue_events = C.int32_t(opts.KVEventsQueueEvents)
	c.kv_events_buffer_batches = C.int32_t(opts.KVEventsBufferBatches)
	c.kv_events_send_hwm = C.int32_t(opts.KVEventsSendHWM)
	c.kv_events_data_parallel_rank = C.int32_t(opts.KVEventsDataParallelRank)
	c.kv_events_token_ids = cFlag(opts.KVEventsTokenIDs)
	c.divergence = cFlag(opts.Divergence)
	c.divergence_branch_points = C.int32_t(opts.DivergenceBranchPoints)
	c.divergence_window_ms = C.int32_t(opts.DivergenceWindowMS)
	c.divergence_context_tokens = C.int32_t(opts.DivergenceContextTokens)
	c.clm_watch = cFlag(opts.ClmWatch)
	c.clm_watch_max_keys = C.int32_t(opts.ClmWatchMaxKeys)
	c.clm_watch_window_ms = C.int64_t(opts.ClmWatchWindowMS)
	c.clm_watch_min_sightings = C.int64_t(opts.ClmWatchMinSightings)
	c.clm_watch_low_src = C.float(opts.ClmWatchLowSrc)
	c.clm_watch_max_events = C.int32_t(opts.ClmWatchMaxEvents)
	// The option strings: C memory, so that the struct may carry them into C
	// (freed after); "" stays NULL.
	for _, s := range []struct {
		name, value string
		field       **C.char
	}{
		{"StorageURL", opts.StorageURL, &c.storage_url},
		{"ModelID", opts.ModelID, &c.model_id},
		{"PageSecretFile", opts.PageSecretFile, &c.page_secret_file},
		{"PageSecretEnv", opts.PageSecretEnv, &c.page_secret_env},
		{"KVEventsEndpoint", opts.KVEventsEndpoint, &c.kv_events_endpoint},
		{"KVEventsReplayEndpoint", opts.KVEventsReplayEndpoint, &c.kv_events_replay_endpoint},
		{"KVEventsTopic", opts.KVEventsTopic, &c.kv_events_topic},
	} {
		if s.value == "" {
			continue
		}
		if strings.IndexByte(s.value, 0) >= 0 {
			return nil, &Error{code: InvalidArgument, op: "clm_engine_create",
				msg: s.name + " " + strconv.Quote(s.value) + " contains a NUL byte"}
		}
		cs := C.CString(s.value)
		defer C.free(unsafe.Pointer(cs))
		*s.field = cs
	}
	snapshotDim := 0
	if opts.SnapshotStorePath != "" {
		if strings.IndexByte(opts.SnapshotStorePath, 0) >= 0 {
			return nil, &Error{code: InvalidArgument, op: "clm_engine_create",
				msg: "SnapshotStorePath " + strconv.Quote(opts.SnapshotStorePath) + " contains a NUL byte"}
		}
		// C memory, so the struct may carry it into C (and it is freed after).
		path := C.CString(opts.SnapshotStorePath)
		defer C.free(unsafe.Pointer(path))
		c.snapshot_store_path = path
		if opts.SnapshotDim > 0 {
			snapshotDim = int(opts.SnapshotDim)
		}
	}
	var ptr *C.clm_engine
	special := opts.SpecialTokenIDs
	// The callbacks travel as handles (integers), which the C shim sets with
	// its trampolines; released if the engine is not created.
	kvEvents := newKVEventCallback(opts.KVEventsCallback)
	clmWatch := newClmWatchCallback(opts.OnClmWatchLine)
	err := call("clm_engine_create", func() C.clm_status {
		return C.clmgo_create(&ptr, c, tokensPtr(special), C.size_t(len(special)), C.uintptr_t(kvEvents),
			C.uintptr_t(clmWatch))
	})
	runtime.KeepAlive(special)
	if err != nil {
		releaseKVEventCallback(kvEvents)
		releaseClmWatchCallback(clmWatch)
		return nil, err
	}
	e := &Engine{ptr: ptr, snapshotDim: snapshotDim, kvEvents: kvEvents, clmWatch: clmWatch}
	runtime.SetFinalizer(e, (*Engine).free)
	layout, err := e.KVLayout()
	if err != nil {
		e.Close()
		return nil, err
	}
	e.layout = layout
	return e, nil
}

// Close frees the engine (clm_engine_free): running sequences end as if
// aborted, and calls on their Seqs fail with FailedPrecondition; the Seqs
// must still be closed. Close is idempotent and always returns nil.
func (e *Engine) Close() error {
	e.free()
	runtime.SetFinalizer(e, nil)
	return nil
}

func (e *Engine) free() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ptr != nil {
		e.closed.Store(true)
		// Delivers what was recorded to the KV-event callback, which (as the
		// CLM watch's) is never called once this returns: only then may
		// their handles go.
		C.clm_engine_free(e.ptr)
		e.ptr = nil
		releaseKVEventCallback(e.kvEvents)
		e.kvEvents = 0
		releaseClmWatchCallback(e.clmWatch)
		e.clmWatch = 0
	}
}

// acquire read-locks the engine for one call; release must follow.
func (e *Engine) acquire(op string) (*C.clm_engine, error) {
	if e == nil {
		return nil, closedError(op, "engine")
	}
	e.mu.RLock()
	if e.ptr == nil {
		e.mu.RUnlock()
		return nil, closedError(op, "engine")
	}
	return e.ptr, nil
}

func (e *Engine) release() {
	e.mu.RUnlock()
	runtime.KeepAlive(e)
}

// cFlag is a C int32_t flag: 1 for true, 0 for false.
func cFlag(b bool) C.int32_t {
	if b {
		return 1
	}
	return 0
}

// tokensPtr is a pointer to the first token, or nil for none. The C library
// copies the tokens and keeps no pointer to them, so Go memory is passed
// directly, without a copy.
func tokensPtr(tokens []int32) *C.int32_t {
	if len(tokens) == 0 {
		return nil
	}
	return (*C.int32_t)(unsafe.Pointer(&tokens[0]))
}

// stringPtr is a pointer to the bytes of s (nil for ""), for C to read during
// one call.
func stringPtr(s string) *C.char {
	if len(s) == 0 {
		return nil
	}
	return (*C.char)(*(*unsafe.Pointer)(unsafe.Pointer(&s)))
}

// Admit matches the longest cached prefix of tokens, locks it, and allocates
// pages for the rest of the prompt (clm_engine_admit). opts may be nil.
func (e *Engine) Admit(tokens []int32, opts *AdmitOptions) (*Seq, error) {
	var ptr *C.clm_seq
	err := e.callWithPrompt("clm_engine_admit", tokens, opts, func(ep *C.clm_engine, p *C.int32_t, n C.size_t,
		use C.int, copts C.clm_admit_options, salt *C.char, saltLen C.size_t) C.clm_status {
		return C.clmgo_admit(&ptr, ep, p, n, use, copts, salt, saltLen)
	})
	if err != nil {
		return nil, err
	}
	s := &Seq{ptr: ptr, engine: e}
	runtime.SetFinalizer(s, (*Seq).free)
	return s, nil
}

// AdmissionPlan is what Admit would take from the pool now, found without
// admitting (clm_engine_plan_admission): nothing is counted, touched, locked,
// allocated or evicted. Admitting takes NewPages + UnlockedPages off PagesFree
// plus the pages of EvictableTokens.
type AdmissionPlan struct {
	CachedTokens    int32 // on the device now: Admit reuses them (it may load more from the host tier)
	NewPages        int32 // pages Admit allocates: the prompt's, less the cached ones
	UnlockedPages   int32 // cached pages no sequence holds: Admit locks them, so they stop being evictable
	PagesFree       int32 // the pool at the same instant
	EvictableTokens int64
}

// PlanAdmission says what Admit(tokens, opts) would take from the pool, with
// Admit's errors for bad tokens or options. A scheduler that admits only what
// can run to the end asks this first, so that a waiting request leaves the
// cache alone.
func (e *Engine) PlanAdmission(tokens []int32, opts *AdmitOptions) (AdmissionPlan, error) {
	var c C.clm_admission_plan
	err := e.callWithPrompt("clm_engine_plan_admission", tokens, opts, func(ep *C.clm_engine, p *C.int32_t,
		n C.size_t, use C.int, copts C.clm_admit_options, salt *C.char, saltLen C.size_t) C.clm_status {
		return C.clmgo_plan_admission(&c, ep, p, n, use, copts, salt, saltLen)
	})
	if err != nil {
		return AdmissionPlan{}, err
	}
	return AdmissionPlan{
		CachedTokens:    int32(c.cached_tokens),
		NewPages:        int32(c.new_pages),
		UnlockedPages:   int32(c.unlocked_pages),
		PagesFree:       int32(c.pages_free),
		EvictableTokens: int64(c.evictable_tokens),
	}, nil
}

// Pin is a pinned prefix (Engine.PinPrefix): its id, and the tokens it holds.
type Pin struct {
	ID           uint64
	PinnedTokens int32
}

// PinPrefix keeps the cached part of tokens' prefix (whole pages on the pool,
// under opts' salt and adapter) from eviction for ttl (clm_engine_pin_prefix):
// each admission covering the whole prefix restarts its time; it ends by
// itself, or with Unpin. Pins share a budget of a quarter of the pool's pages:
// past it the pin is OutOfMemory and nothing is pinned. NotFound when nothing
// of the prefix is cached; InvalidArgument for a bad prompt or a ttl outside
// [1 ms, 24 h].
func (e *Engine) PinPrefix(tokens []int32, opts *AdmitOptions, ttl time.Duration) (Pin, error) {
	var id C.uint64_t
	var pinned C.int32_t
	err := e.callWithPrompt("clm_engine_pin_prefix", tokens, opts, func(ep *C.clm_engine, p *C.int32_t,
		n C.size_t, use C.int, copts C.clm_admit_options, salt *C.char, saltLen C.size_t) C.clm_status {
		return C.clmgo_pin_prefix(ep, p, n, use, copts, salt, saltLen, C.int64_t(ttl.Milliseconds()), &id, &pinned)
	})
	if err != nil {
		return Pin{}, err
	}
	return Pin{ID: uint64(id), PinnedTokens: int32(pinned)}, nil
}

// HintPrefix sets a priority that expires (clm_engine_hint_prefix): priority
// (1 to 100) along the cached prefix of tokens now, back to 0 after ttl unless
// a later hint under the same key (a conversation's name) replaced it. It
// returns the tokens of the prefix found cached. InvalidArgument for an empty
// key, a bad prompt, a priority outside [1, 100] or a ttl outside [1 ms, 24 h].
func (e *Engine) HintPrefix(key string, tokens []int32, opts *AdmitOptions, priority int32,
	ttl time.Duration) (int32, error) {
	if key == "" {
		return 0, &Error{code: InvalidArgument, op: "clm_engine_hint_prefix", msg: "the key is empty"}
	}
	ckey := C.CString(key)
	defer C.free(unsafe.Pointer(ckey))
	var reached C.int32_t
	err := e.callWithPrompt("clm_engine_hint_prefix", tokens, opts, func(ep *C.clm_engine, p *C.int32_t,
		n C.size_t, use C.int, copts C.clm_admit_options, salt *C.char, saltLen C.size_t) C.clm_status {
		return C.clmgo_hint_prefix(ep, p, n, use, copts, salt, saltLen, ckey, C.size_t(len(key)), C.int32_t(priority),
			C.int64_t(ttl.Milliseconds()), &reached)
	})
	return int32(reached), err
}

// Unpin ends a pin (clm_engine_unpin); NotFound when it has ended or expired.
func (e *Engine) Unpin(pin Pin) error {
	const op = "clm_engine_unpin"
	ep, err := e.acquire(op)
	if err != nil {
		return err
	}
	defer e.release()
	return call(op, func() C.clm_status { return C.clm_engine_unpin(ep, C.uint64_t(pin.ID)) })
}

// callWithPrompt runs op, a call of a clmgo_ helper that takes a prompt and
// admit options (clmgo_admit, clmgo_plan_admission, clmgo_prefetch), on the live engine: the
// tokens and the salt stay alive for the call.
func (e *Engine) callWithPrompt(op string, tokens []int32, opts *AdmitOptions,
	fn func(ep *C.clm_engine, p *C.int32_t, n C.size_t, use C.int, copts C.clm_admit_options, salt *C.char,
		saltLen C.size_t) C.clm_status) error {
	ep, err := e.acquire(op)
	if err != nil {
		return err
	}
	defer e.release()
	copts, useOptions, salt, err := admitOptionsToC(opts)
	if err != nil {
		return err
	}
	if copts.tenant != nil {
		defer C.free(unsafe.Pointer(copts.tenant))
	}
	err = call(op, func() C.clm_status {
		return fn(ep, tokensPtr(tokens), C.size_t(len(tokens)), useOptions, copts, stringPtr(salt), C.size_t(len(salt)))
	})
	runtime.KeepAlive(tokens)
	runtime.KeepAlive(salt)
	return err
}

// admitOptionsToC is what the clmgo_ helpers of callWithPrompt take for opts: the
// struct, whether to pass it (0 for nil opts: the defaults), and the salt,
// which travels as its own argument. The tenant's name travels in the struct,
// as a C copy (NULL for ""), which the caller frees after the call.
func admitOptionsToC(opts *AdmitOptions) (C.clm_admit_options, C.int, string, error) {
	var c C.clm_admit_options
	if opts == nil {
		return c, 0, "", nil
	}
	if err := admitOptionsInit(&c); err != nil {
		return c, 0, "", err
	}
	c.adapter_id = C.int32_t(opts.AdapterID)
	c.priority = C.int32_t(opts.Priority)
	c.priority_update = C.int32_t(opts.PriorityUpdate)
	if opts.Tenant != "" {
		c.tenant = C.CString(opts.Tenant) // every byte, NUL bytes too: tenant_len bounds it
		c.tenant_len = C.size_t(len(opts.Tenant))
	}
	return c, 1, opts.CacheSalt, nil
}

// KVLayout describes the pool's memory (clm_engine_kv_layout).
func (e *Engine) KVLayout() (KVLayout, error) {
	const op = "clm_engine_kv_layout"
	ep, err := e.acquire(op)
	if err != nil {
		return KVLayout{}, err
	}
	defer e.release()
	var c C.clm_kv_layout
	c.struct_size = C.uint32_t(C.sizeof_clm_kv_layout)
	if err := call(op, func() C.clm_status { return C.clm_engine_kv_layout(&c, ep) }); err != nil {
		return KVLayout{}, err
	}
	return KVLayout{
		Base:       c.base,
		PageBytes:  uint64(c.page_bytes),
		LayerBytes: uint64(c.layer_bytes),
		NumPages:   int32(c.num_pages),
		PageSize:   int32(c.page_size),
		NumLayers:  int32(c.num_layers),
		KVHeads:    int32(c.kv_heads),
		HeadDim:    int32(c.head_dim),
		KVDType:    KVDType(c.kv_dtype),
		Memory:     MemoryKind(c.memory),
	}, nil
}

// Metrics copies the engine's counters out (clm_engine_metrics).
func (e *Engine) Metrics() (Metrics, error) {
	const op = "clm_engine_metrics"
	ep, err := e.acquire(op)
	if err != nil {
		return Metrics{}, err
	}
	defer e.release()
	var c C.clm_metrics
	c.struct_size = C.uint32_t(C.sizeof_clm_metrics)
	if err := call(op, func() C.clm_status { return C.clm_engine_metrics(&c, ep) }); err != nil {
		return Metrics{}, err
	}
	return Metrics{
		TokensQueried:   uint64(c.tokens_queried),
		TokensHit:       uint64(c.tokens_hit),
		HitRate:         float64(c.hit_rate),
		CachedTokens:    int64(c.cached_tokens),
		EvictableTokens: int64(c.evictable_tokens),
		ProtectedTokens: int64(c.protected_tokens),
		PagesUsed:       int32(c.pages_used),
		PagesFree:       int32(c.pages_free),
		EvictedTokens:   uint64(c.evicted_tokens),
		Evictions:       uint64(c.evictions),
		InsertedTokens:  uint64(c.inserted_tokens),
		Admitted:        uint64(c.admitted),
		Finished:        uint64(c.finished),
		Aborted:         uint64(c.aborted),
		Rejected:        uint64(c.rejected),
		ActiveSequences: int64(c.active_sequences),
		MetadataBytes:   uint64(c.metadata_bytes),

		SRCThreshold:         float64(c.src_threshold),
		SRCSteps:             uint64(c.src_steps),
		SRCUnscoredSteps:     uint64(c.src_unscored_steps),
		SRCReuseDecisions:    uint64(c.src_reuse_decisions),
		SRCRetrievalsFound:   uint64(c.src_retrievals_found),
		SRCRetrievalsFailed:  uint64(c.src_retrievals_failed),
		SRCBreakerTrips:      uint64(c.src_breaker_trips),
		SRCBaselineSequences: int64(c.src_baseline_sequences),
		SRCInjections:        uint64(c.src_injections),

		HasSnapshotStore:      c.has_snapshot_store != 0,
		StoreLookups:          uint64(c.store_lookups),
		StoreHitsExact:        uint64(c.store_hits_exact),
		StoreHitsANN:          uint64(c.store_hits_ann),
		StoreHitsFallback:     uint64(c.store_hits_fallback),
		StoreMisses:           uint64(c.store_misses),
		StoreBusyMisses:       uint64(c.store_busy_misses),
		StoreBlacklistedSkips: uint64(c.store_blacklisted_skips),
		StoreANNUnavailable:   uint64(c.store_ann_unavailable),
		StoreRecords:          uint64(c.store_records),
		StoreCounted:          uint64(c.store_counted),
		StoreAdmissions:       uint64(c.store_admissions),
		StoreConfirmations:    uint64(c.store_confirmations),
		StoreVersions:         uint64(c.store_versions),
		StoreDriftVersions:    uint64(c.store_drift_versions),
		StoreEvictions:        uint64(c.store_evictions),
		StoreCorruptSkipped:   uint64(c.store_corrupt_skipped),
		StoreIndexRebuilds:    uint64(c.store_index_rebuilds),
		StoreOutcomeReports:   uint64(c.store_outcome_reports),
		StoreSnapshots:        int64(c.store_snapshots),
		StoreBlacklistedKeys:  int64(c.store_blacklisted_keys),

		HasTiers:                 c.has_tiers != 0,
		HasStorage:               c.has_storage != 0,
		DeviceHitTokens:          uint64(c.device_hit_tokens),
		HostHitTokens:            uint64(c.host_hit_tokens),
		StorageHitTokens:         uint64(c.storage_hit_tokens),
		LoadBacks:                uint64(c.load_backs),
		LoadedPages:              uint64(c.loaded_pages),
		BackedUpPages:            uint64(c.backed_up_pages),
		StoredPages:              uint64(c.stored_pages),
		FetchedPages:             uint64(c.fetched_pages),
		PrefetchTimeouts:         uint64(c.prefetch_timeouts),
		StorageErrors:            uint64(c.storage_errors),
		DroppedBackups:           uint64(c.dropped_backups),
		HostCachedTokens:         int64(c.host_cached_tokens),
		HostPagesUsed:            int64(c.host_pages_used),
		HostPagesTotal:           int64(c.host_pages_total),
		StorageCorruptPages:      uint64(c.storage_corrupt_pages),
		StorageDroppedWrites:     uint64(c.storage_dropped_writes),
		StorageEvictedPages:      uint64(c.storage_evicted_pages),
		StorageForeignModelPages: uint64(c.storage_foreign_model_pages),
		StorageUnsignedPages:     uint64(c.storage_unsigned_pages),
		StorageForgedPages:       uint64(c.storage_forged_pages),
		StorageRepairedPages:     uint64(c.storage_repaired_pages),
		TierWorkerFailures:       uint64(c.tier_worker_failures),
		SignedPages:              c.signed_pages != 0,
		StorageBreakerState:      int32(c.storage_breaker_state),
		StorageBreakerTrips:      uint64(c.storage_breaker_trips),
		StorageBreakerSkips:      uint64(c.storage_breaker_skips),
		DroppedFetches:           uint64(c.dropped_fetches),
		MergedFetches:            uint64(c.merged_fetches),
		QueuedFetches:            int64(c.queued_fetches),

		HasKVEvents:              c.has_kv_events != 0,
		KVEventsResyncPending:    c.kv_events_resync_pending != 0,
		KVEventsRecorded:         uint64(c.kv_events_recorded),
		KVEventsPublished:        uint64(c.kv_events_published),
		KVEventsPublishedBatches: uint64(c.kv_events_published_batches),
		KVEventsDropped:          uint64(c.kv_events_dropped),
		KVEventsResyncs:          uint64(c.kv_events_resyncs),
		KVEventsReplayRequests:   uint64(c.kv_events_replay_requests),
		KVEventsReplayRefused:    uint64(c.kv_events_replay_refused),
		KVEventsSendFailures:     uint64(c.kv_events_send_failures),
		KVEventsQueued:           int64(c.kv_events_queued),
		KVEventsNextSequence:     uint64(c.kv_events_next_sequence),

		DivergedLookups:     uint64(c.diverged_lookups),
		MatchDepthCounts:    matchDepthCounts(&c),
		MatchDepthSumTokens: uint64(c.match_depth_sum_tokens),

		ClmWatchSightings:   uint64(c.clm_watch_sightings),
		ClmWatchLowSrcTurns: uint64(c.clm_watch_low_src_turns),
		ClmWatchKeyEvents:   clmWatchKeyEvents(&c),
		ClmWatchWatchedKeys: int64(c.clm_watch_watched_keys),
		ClmWatchLowSrcKeys:  int64(c.clm_watch_low_src_keys),
	}, nil
}

// clmWatchKeyEvents copies clm_metrics.clm_watch_key_events.
func clmWatchKeyEvents(c *C.clm_metrics) [4]uint64 {
	var out [4]uint64
	for i := range out {
		out[i] = uint64(c.clm_watch_key_events[i])
	}
	return out
}

// matchDepthCounts copies clm_metrics.match_depth_counts.
func matchDepthCounts(c *C.clm_metrics) [19]uint64 {
	var out [19]uint64
	for i := range out {
		out[i] = uint64(c.match_depth_counts[i])
	}
	return out
}

// MetricsText gives the engine's metrics as Prometheus text, exposition format
// 0.0.4 (clm_engine_metrics_text; the names are in docs/metrics.md), for a
// host's GET /metrics.
func (e *Engine) MetricsText() (string, error) {
	const op = "clm_engine_metrics_text"
	ep, err := e.acquire(op)
	if err != nil {
		return "", err
	}
	defer e.release()
	// The counters may grow between the sizing call and the next: room to spare.
	return sizedText(op, 256, func(text *C.char, capacity C.size_t, length *C.size_t) C.clm_status {
		return C.clm_engine_metrics_text(text, capacity, length, ep)
	})
}

// sizedText is the text a clm_* call writes into a caller's buffer with its
// NUL (text, capacity, *length): a sizing call first (capacity 0), then the
// text, in a buffer `spare` bytes larger than needed, again while the text
// outgrows it (a too-small buffer is InvalidArgument with the length needed,
// and nothing written).
func sizedText(op string, spare int, fill func(text *C.char, capacity C.size_t, length *C.size_t) C.clm_status) (string, error) {
	var buf []byte
	for {
		var length C.size_t
		err := call(op, func() C.clm_status {
			var text *C.char
			if len(buf) > 0 {
				text = (*C.char)(unsafe.Pointer(&buf[0]))
			}
			return fill(text, C.size_t(len(buf)), &length)
		})
		if err == nil {
			return string(buf[:length]), nil
		}
		if CodeOf(err) == InvalidArgument && int(length) >= len(buf) {
			buf = make([]byte, int(length)+1+spare) // and the NUL
			continue
		}
		return "", err
	}
}

// BatchPageTable gives the page tables of running sequences of this engine in
// FlashInfer's CSR form (clm_engine_batch_page_table).
func (e *Engine) BatchPageTable(seqs []*Seq) (PagedBatch, error) {
	const op = "clm_engine_batch_page_table"
	ep, err := e.acquire(op)
	if err != nil {
		return PagedBatch{}, err
	}
	defer e.release()

	cseqs, unlock, err := lockSeqs(op, seqs)
	if err != nil {
		return PagedBatch{}, err
	}
	defer unlock()

	n := len(seqs)
	out := PagedBatch{Indptr: make([]int32, n+1), LastPageLen: make([]int32, n)}
	capacity := 64 * n
	for attempt := 0; ; attempt++ {
		indices := make([]int32, capacity)
		var needed C.size_t
		err := call(op, func() C.clm_status {
			return C.clm_engine_batch_page_table((*C.int32_t)(unsafe.Pointer(&out.Indptr[0])), tokensPtr(indices),
				C.size_t(len(indices)), &needed, tokensPtr(out.LastPageLen), ep, seqsPtr(cseqs), C.size_t(n))
		})
		if err == nil {
			out.Indices = indices[:needed]
			return out, nil
		}
		// Too small a buffer is reported as InvalidArgument with the size needed.
		if attempt == 0 && CodeOf(err) == InvalidArgument && int(needed) > capacity {
			capacity = int(needed)
			continue
		}
		return PagedBatch{}, err
	}
}

// withSeqs runs f with the engine and the batch's handles held: the engine
// acquired, every Seq locked (lockSeqs), both released when f returns.
func (e *Engine) withSeqs(op string, seqs []*Seq, f func(ep *C.clm_engine, cseqs []*C.clm_seq) error) error {
	ep, err := e.acquire(op)
	if err != nil {
		return err
	}
	defer e.release()
	cseqs, unlock, err := lockSeqs(op, seqs)
	if err != nil {
		return err
	}
	defer unlock()
	return f(ep, cseqs)
}

// lockSeqs holds every distinct Seq's lock, in address order (no deadlock
// between overlapping batches; a Seq listed twice is locked once), and gives
// their C handles in the order of seqs. unlock must follow on success.
func lockSeqs(op string, seqs []*Seq) ([]*C.clm_seq, func(), error) {
	distinct := make([]*Seq, 0, len(seqs))
	seen := make(map[*Seq]bool, len(seqs))
	for i, s := range seqs {
		if s == nil {
			return nil, nil, &Error{code: InvalidArgument, op: op, msg: "seqs[" + strconv.Itoa(i) + "] is nil"}
		}
		if !seen[s] {
			seen[s] = true
			distinct = append(distinct, s)
		}
	}
	sort.Slice(distinct, func(i, j int) bool {
		return uintptr(unsafe.Pointer(distinct[i])) < uintptr(unsafe.Pointer(distinct[j]))
	})
	for _, s := range distinct {
		s.mu.Lock()
	}
	unlock := func() {
		for _, s := range distinct {
			s.mu.Unlock()
		}
		runtime.KeepAlive(seqs)
	}
	cseqs := make([]*C.clm_seq, len(seqs))
	for i, s := range seqs {
		if s.ptr == nil {
			unlock()
			return nil, nil, closedError(op, "sequence")
		}
		cseqs[i] = s.ptr
	}
	return cseqs, unlock, nil
}

// seqsPtr is a pointer to the first handle, or nil for none.
func seqsPtr(cseqs []*C.clm_seq) **C.clm_seq {
	if len(cseqs) == 0 {
		return nil
	}
	return &cseqs[0]
}

// Seq is a clm_seq: one request admitted into an engine.
type Seq struct {
	mu     sync.Mutex
	ptr    *C.clm_seq
	engine *Engine // keeps the Engine (and its finalizer) from going before the Seq
	ended  bool    // Finish or Abort succeeded
}

// checkRunning refuses the page table and slots of a sequence that ended: the
// C accessors still return its last arrays, but their pages went back to the
// cache or the pool and may belong to other sequences already.
func (s *Seq) checkRunning(op string) error {
	if s.ended || s.engine.closed.Load() {
		return &Error{code: FailedPrecondition, op: op,
			msg: "the sequence has ended: its pages may belong to other sequences now"}
	}
	return nil
}

// Close frees the handle (clm_seq_free); a sequence still running is aborted
// first. Close is idempotent and always returns nil.
func (s *Seq) Close() error {
	s.free()
	runtime.SetFinalizer(s, nil)
	return nil
}

func (s *Seq) free() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ptr != nil {
		C.clm_seq_free(s.ptr)
		s.ptr = nil
		s.engine = nil
	}
}

func (s *Seq) acquire(op string) (*C.clm_seq, error) {
	if s == nil {
		return nil, closedError(op, "sequence")
	}
	s.mu.Lock()
	if s.ptr == nil {
		s.mu.Unlock()
		return nil, closedError(op, "sequence")
	}
	return s.ptr, nil
}

func (s *Seq) release() {
	s.mu.Unlock()
	runtime.KeepAlive(s)
}

// Extend appends decoded tokens whose K/V the host will write
// (clm_seq_extend); Slots then gives their slots.
func (s *Seq) Extend(tokens []int32) error {
	const op = "clm_seq_extend"
	sp, err := s.acquire(op)
	if err != nil {
		return err
	}
	defer s.release()
	err = call(op, func() C.clm_status { return C.clm_seq_extend(sp, tokensPtr(tokens), C.size_t(len(tokens))) })
	runtime.KeepAlive(tokens)
	return err
}

// Finish publishes prompt + output into the cache and ends the sequence
// (clm_seq_finish). The handle must still be closed.
func (s *Seq) Finish() error {
	const op = "clm_seq_finish"
	sp, err := s.acquire(op)
	if err != nil {
		return err
	}
	defer s.release()
	err = call(op, func() C.clm_status { return C.clm_seq_finish(sp) })
	if err == nil {
		s.ended = true
	}
	return err
}

// Abort ends the sequence without caching anything it computed
// (clm_seq_abort). The handle must still be closed.
func (s *Seq) Abort() error {
	const op = "clm_seq_abort"
	sp, err := s.acquire(op)
	if err != nil {
		return err
	}
	defer s.release()
	err = call(op, func() C.clm_status { return C.clm_seq_abort(sp) })
	if err == nil {
		s.ended = true
	}
	return err
}

// CachedTokens is how many leading prompt tokens were cached at admission
// (clm_seq_cached_tokens).
func (s *Seq) CachedTokens() (int32, error) {
	sp, err := s.acquire("clm_seq_cached_tokens")
	if err != nil {
		return 0, err
	}
	defer s.release()
	return int32(C.clm_seq_cached_tokens(sp)), nil
}

// HostTokens is how many of the cached tokens the admission copied in from
// the host tier (clm_seq_host_tokens); the rest were on the device. 0
// without tiers.
func (s *Seq) HostTokens() (int32, error) {
	sp, err := s.acquire("clm_seq_host_tokens")
	if err != nil {
		return 0, err
	}
	defer s.release()
	return int32(C.clm_seq_host_tokens(sp)), nil
}

// StorageTokens is how many of the host tokens the host tier had just
// fetched from storage for this admission (clm_seq_storage_tokens); pages
// that an earlier Prefetch had already brought in are host tokens only.
func (s *Seq) StorageTokens() (int32, error) {
	sp, err := s.acquire("clm_seq_storage_tokens")
	if err != nil {
		return 0, err
	}
	defer s.release()
	return int32(C.clm_seq_storage_tokens(sp)), nil
}

// PageTable is a copy of the sequence's page table: ceil(length/page_size)
// page ids (clm_seq_page_table). It fails with FailedPrecondition once the
// sequence has ended (Finish, Abort, or the Engine's Close).
func (s *Seq) PageTable() ([]int32, error) {
	const op = "clm_seq_page_table"
	sp, err := s.acquire(op)
	if err != nil {
		return nil, err
	}
	defer s.release()
	if err := s.checkRunning(op); err != nil {
		return nil, err
	}
	var n C.size_t
	p := C.clm_seq_page_table(sp, &n)
	if p == nil {
		// A page table is never empty (a prompt has at least one token), so
		// NULL is the accessor's only way to say it failed; it sets no message.
		return nil, &Error{code: FailedPrecondition, op: op, msg: "the page table is not available"}
	}
	out := make([]int32, int(n))
	copy(out, unsafe.Slice((*int32)(unsafe.Pointer(p)), int(n)))
	return out, nil
}

// Slots is a copy of the slots (page*page_size + row) of the tokens added by
// the last Admit or Extend: where the host writes their K/V (clm_seq_slots).
// It fails with FailedPrecondition once the sequence has ended.
func (s *Seq) Slots() ([]int64, error) {
	const op = "clm_seq_slots"
	sp, err := s.acquire(op)
	if err != nil {
		return nil, err
	}
	defer s.release()
	if err := s.checkRunning(op); err != nil {
		return nil, err
	}
	var n C.size_t
	p := C.clm_seq_slots(sp, &n)
	out := make([]int64, int(n))
	if n > 0 {
		copy(out, unsafe.Slice((*int64)(unsafe.Pointer(p)), int(n)))
	}
	return out, nil
}

package clm

/*
#include <stdint.h>
#include <clm.h>
*/
import "C"

import (
	"math"
	"runtime/cgo"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"
)

// KV events for cache-aware routers (clm.h "KV events", docs/fleet.md): an
// engine created with EngineOptions.KVEvents (and a ModelID: the block hashes
// name the model) reports every page that enters or leaves its pool (medium
// GPU) or its host tier (CPU), as vLLM publishes them, so that a router (llm-d,
// Dynamo, AIBrix, ...) sends each request to the instance that holds its
// prefix. By default the batches go out on a ZeroMQ PUB socket
// (KVEventsEndpoint, with an optional replay socket); a host that publishes on
// a bus of its own (NATS, Kafka) sets EngineOptions.KVEventsCallback and gets
// each batch as Go values instead.
//
// This file's cgo preamble holds declarations only, as //export requires; the
// C shim that calls clmgoKVEventBatch is clmgo_kv_event_batch in clm.go.

// KVEventsBindMode says whether the PUB socket binds its endpoint or connects
// to it (CLM_KV_EVENTS_BIND_*).
type KVEventsBindMode int32

const (
	// KVEventsBindAuto binds a wildcard, loopback, ipc:// or inproc://
	// endpoint and connects to any other (the default).
	KVEventsBindAuto KVEventsBindMode = C.CLM_KV_EVENTS_BIND_AUTO
	// KVEventsBind always binds.
	KVEventsBind KVEventsBindMode = C.CLM_KV_EVENTS_BIND
	// KVEventsConnect always connects, to a router that binds (llm-d's
	// "centralized" mode).
	KVEventsConnect KVEventsBindMode = C.CLM_KV_EVENTS_CONNECT
)

// KVEventsLayout is the msgpack shape of the events on the socket
// (CLM_KV_EVENTS_LAYOUT_*); a callback gets Go values whatever it is.
type KVEventsLayout int32

const (
	// KVEventsLayoutArray is vLLM's tagged arrays (llm-d, AIBrix, Dynamo; the default).
	KVEventsLayoutArray KVEventsLayout = C.CLM_KV_EVENTS_LAYOUT_ARRAY
	// KVEventsLayoutLegacy is the shorter arrays llm-d-kv-cache-manager up to 2025 needs.
	KVEventsLayoutLegacy KVEventsLayout = C.CLM_KV_EVENTS_LAYOUT_LEGACY
	// KVEventsLayoutMap is {"type": tag, field: value}, as vLLM sends since mid-2026.
	KVEventsLayoutMap KVEventsLayout = C.CLM_KV_EVENTS_LAYOUT_MAP
)

// KVEventKind is what happened to the pages of a KVEvent (CLM_KV_EVENT_*).
type KVEventKind int32

const (
	// KVEventBlockStored: the pages were cached on a medium.
	KVEventBlockStored KVEventKind = C.CLM_KV_EVENT_BLOCK_STORED
	// KVEventBlockRemoved: the pages left it.
	KVEventBlockRemoved KVEventKind = C.CLM_KV_EVENT_BLOCK_REMOVED
	// KVEventAllBlocksCleared: nothing is cached on any medium (the first
	// event of every engine, and of a resync after dropped events).
	KVEventAllBlocksCleared KVEventKind = C.CLM_KV_EVENT_ALL_BLOCKS_CLEARED
)

func (k KVEventKind) String() string {
	switch k {
	case KVEventBlockStored:
		return "BlockStored"
	case KVEventBlockRemoved:
		return "BlockRemoved"
	case KVEventAllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "KVEventKind(" + strconv.Itoa(int(k)) + ")"
}

// KVMedium is the tier a KVEvent's pages are on (CLM_KV_MEDIUM_*).
type KVMedium int32

const (
	// KVMediumGPU is the engine's pool, wherever its memory lives (vLLM's
	// name for its own cache).
	KVMediumGPU KVMedium = C.CLM_KV_MEDIUM_GPU
	// KVMediumCPU is the host tier (EngineOptions.HostPages).
	KVMediumCPU KVMedium = C.CLM_KV_MEDIUM_CPU
)

func (m KVMedium) String() string {
	switch m {
	case KVMediumGPU:
		return "GPU"
	case KVMediumCPU:
		return "CPU"
	}
	return "KVMedium(" + strconv.Itoa(int(m)) + ")"
}

// KVEvent is one change of the cache (clm_kv_event), copied into Go memory.
// The fields after Medium are set for KVEventBlockStored (BlockHashes for
// KVEventBlockRemoved too); Medium is meaningful for those two kinds only.
type KVEvent struct {
	Kind   KVEventKind
	Medium KVMedium
	// BlockHashes has one hash per page, in path order.
	BlockHashes []uint64
	// ParentBlockHash is the hash of the page before the first, when
	// HasParent (false at a prefix's first page). The parent is always
	// announced before its child on the same medium.
	ParentBlockHash uint64
	HasParent       bool
	// TokenIDs are the pages' tokens, len(BlockHashes)*BlockSize of them
	// (none with EngineOptions.KVEventsTokenIDs false).
	TokenIDs  []int32
	BlockSize int32 // tokens per page
	LoraID    int32 // the adapter (AdmitOptions.AdapterID), 0 for none
	// ExtraKey is the tenant's salt digest ("salt:" and 32 hex digits), ""
	// for the default tenant; never the salt itself.
	ExtraKey string
}

// KVEventBatch is one batch as EngineOptions.KVEventsCallback gets it
// (clm_kv_event_batch), copied into Go memory: the callback may keep it.
type KVEventBatch struct {
	// Sequence numbers the engine's batches 0, 1, 2, ...; there is never a
	// gap (dropped events are followed by a resync instead).
	Sequence uint64
	// TS is the batch's time, in seconds since the epoch.
	TS float64
	// DataParallelRank is EngineOptions.KVEventsDataParallelRank.
	DataParallelRank int32
	// Events are in the order the cache changed.
	Events []KVEvent
}

// kvEventCallbacks counts the callbacks registered (cgo.Handle) and not yet
// released, so that the tests can see that Close and a failed NewEngine
// release them.
var kvEventCallbacks atomic.Int64

// newKVEventCallback registers fn for the C callback; 0 for nil.
func newKVEventCallback(fn func(KVEventBatch)) cgo.Handle {
	if fn == nil {
		return 0
	}
	kvEventCallbacks.Add(1)
	return cgo.NewHandle(fn)
}

// releaseKVEventCallback forgets a handle of newKVEventCallback: only once the
// library can no longer call it (clm_engine_free returned, or
// clm_engine_create failed).
func releaseKVEventCallback(h cgo.Handle) {
	if h != 0 {
		h.Delete()
		kvEventCallbacks.Add(-1)
	}
}

// clmgoKVEventBatch is the C callback (through clmgo_kv_event_batch, clm.go):
// it runs on the library's publisher thread, one batch at a time, in order,
// never once clm_engine_free has returned. Everything batch points to lives
// only for the call, so it is copied before the host's function sees it.
//
//export clmgoKVEventBatch
func clmgoKVEventBatch(batch *C.clm_kv_event_batch, handle C.uintptr_t) {
	fn := cgo.Handle(handle).Value().(func(KVEventBatch))
	fn(kvEventBatchFromC(batch))
}

// kvEventBatchFromC copies a batch into Go memory. Every field read is in
// version 1 of clm_kv_event_batch, the only one.
func kvEventBatchFromC(b *C.clm_kv_event_batch) KVEventBatch {
	out := KVEventBatch{
		Sequence:         uint64(b.sequence),
		TS:               float64(b.ts),
		DataParallelRank: int32(b.data_parallel_rank),
	}
	if b.n_events == 0 || b.events == nil {
		return out
	}
	events := unsafe.Slice(b.events, int(b.n_events))
	out.Events = make([]KVEvent, len(events))
	for i := range events {
		c := &events[i]
		e := &out.Events[i]
		e.Kind = KVEventKind(c.kind)
		e.Medium = KVMedium(c.medium)
		if n := int(c.n_block_hashes); n > 0 && c.block_hashes != nil {
			e.BlockHashes = make([]uint64, n)
			copy(e.BlockHashes, unsafe.Slice((*uint64)(unsafe.Pointer(c.block_hashes)), n))
		}
		e.HasParent = c.has_parent != 0
		if e.HasParent {
			e.ParentBlockHash = uint64(c.parent_block_hash)
		}
		if n := int(c.n_token_ids); n > 0 && c.token_ids != nil {
			e.TokenIDs = make([]int32, n)
			copy(e.TokenIDs, unsafe.Slice((*int32)(unsafe.Pointer(c.token_ids)), n))
		}
		e.BlockSize = int32(c.block_size)
		e.LoraID = int32(c.lora_id)
		if c.extra_key != nil {
			e.ExtraKey = C.GoString(c.extra_key)
		}
	}
	return out
}

// FlushKVEvents returns once every event recorded so far is published (to
// the socket or the callback), or fails with FailedPrecondition after
// timeout (clm_engine_flush_kv_events; rounded up to whole milliseconds). On
// an engine without KV events it fails with FailedPrecondition at once; a
// negative timeout is InvalidArgument. It must not be called from the
// KVEventsCallback.
func (e *Engine) FlushKVEvents(timeout time.Duration) error {
	const op = "clm_engine_flush_kv_events"
	ep, err := e.acquire(op)
	if err != nil {
		return err
	}
	defer e.release()
	ms := int64(-1) // the library refuses it with its own message
	if timeout >= 0 {
		ms = int64(timeout / time.Millisecond)
		if timeout%time.Millisecond != 0 {
			ms++
		}
		if ms > math.MaxInt32 {
			ms = math.MaxInt32
		}
	}
	return call(op, func() C.clm_status { return C.clm_engine_flush_kv_events(ep, C.int32_t(ms)) })
}

// KVEventBlocks is the hashes of every page now on medium, parents before
// children (clm_engine_kv_event_blocks): what a subscriber that missed
// nothing holds for this engine. FailedPrecondition on an engine without KV
// events; an unknown medium is InvalidArgument.
func (e *Engine) KVEventBlocks(medium KVMedium) ([]uint64, error) {
	const op = "clm_engine_kv_event_blocks"
	ep, err := e.acquire(op)
	if err != nil {
		return nil, err
	}
	defer e.release()
	// A sizing call first (capacity 0), then the hashes; the cache may grow
	// in between, so leave headroom and retry while it is longer.
	var buf []uint64
	for {
		var count C.size_t
		err := call(op, func() C.clm_status {
			var hashes *C.uint64_t
			if len(buf) > 0 {
				hashes = (*C.uint64_t)(unsafe.Pointer(&buf[0]))
			}
			return C.clm_engine_kv_event_blocks(hashes, C.size_t(len(buf)), &count, ep, C.int32_t(medium))
		})
		if err == nil {
			return buf[:int(count):int(count)], nil
		}
		// Too small a buffer (nothing written) is InvalidArgument with the count.
		if CodeOf(err) == InvalidArgument && int(count) > len(buf) {
			buf = make([]uint64, int(count)+int(count)/16+16)
			continue
		}
		return nil, err
	}
}

// KVEventsEndpoint is the PUB socket's endpoint as bound or connected
// (clm_engine_kv_events_endpoint): "tcp://127.0.0.1:40123" for
// "tcp://127.0.0.1:*"; "" with a KVEventsCallback. FailedPrecondition on an
// engine without KV events.
func (e *Engine) KVEventsEndpoint() (string, error) { return e.kvEventsEndpoint(0) }

// KVEventsReplayEndpoint is the replay socket's endpoint as bound, "" without
// one (or with a KVEventsCallback). FailedPrecondition on an engine without
// KV events.
func (e *Engine) KVEventsReplayEndpoint() (string, error) { return e.kvEventsEndpoint(1) }

func (e *Engine) kvEventsEndpoint(replay C.int32_t) (string, error) {
	const op = "clm_engine_kv_events_endpoint"
	ep, err := e.acquire(op)
	if err != nil {
		return "", err
	}
	defer e.release()
	return sizedText(op, 0, func(text *C.char, capacity C.size_t, length *C.size_t) C.clm_status {
		return C.clm_engine_kv_events_endpoint(text, capacity, length, ep, replay)
	})
}

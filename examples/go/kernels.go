package clm

// #include <clm.h>
import "C"

import (
	"runtime"
	"unsafe"
)

// Attention and KV kernels over the engine's pool (clm.h, docs/kernels.md),
// for a host that brings its own weights. Shapes (row-major f32; the KV is in
// the pool's dtype): k, v [n_slots][kv_heads][head_dim]; prefill q, out
// [n_new][num_q_heads][head_dim]; decode q, out [n_seqs][num_q_heads][head_dim].
//
// These take Go slices, so they run on host pools (MemoryHost: the CPU
// kernels, synchronous). A device pool is Unsupported here: its kernels take
// device pointers and queue work on a CUDA stream. MemoryNone is
// FailedPrecondition. Pass only pages the host holds (Seq.PageTable,
// BatchPageTable, Seq.Slots), and never write the cached prefix pages or the
// same pages from two goroutines at once: the library checks page ids
// against the pool, not against sequences.

// AttentionParams mirrors clm_attention_params (without the stream). Start
// from DefaultAttentionParams; NumQHeads has no default.
type AttentionParams struct {
	Layer         int32   // in [0, num_layers)
	NumQHeads     int32   // a positive multiple of kv_heads
	SoftmaxScale  float32 // 0 = 1/sqrt(head_dim)
	SlidingWindow int32   // > 0: a query at position p sees keys in (p - window, p]; 0 = all
	NumThreads    int32   // CPU threads; 0 = every hardware thread
}

func attentionParamsInit(c *C.clm_attention_params) error {
	return call("clm_attention_params_init", func() C.clm_status {
		return C.clm_attention_params_init(c, C.sizeof_clm_attention_params)
	})
}

// DefaultAttentionParams is the library's defaults (clm_attention_params_init).
func DefaultAttentionParams() (AttentionParams, error) {
	var c C.clm_attention_params
	if err := attentionParamsInit(&c); err != nil {
		return AttentionParams{}, err
	}
	return AttentionParams{Layer: int32(c.layer), NumQHeads: int32(c.num_q_heads),
		SoftmaxScale: float32(c.softmax_scale), SlidingWindow: int32(c.sliding_window),
		NumThreads: int32(c.num_threads)}, nil
}

func (p AttentionParams) toC() (C.clm_attention_params, error) {
	var c C.clm_attention_params
	if err := attentionParamsInit(&c); err != nil {
		return c, err
	}
	c.layer = C.int32_t(p.Layer)
	c.num_q_heads = C.int32_t(p.NumQHeads)
	c.softmax_scale = C.float(p.SoftmaxScale)
	c.sliding_window = C.int32_t(p.SlidingWindow)
	c.num_threads = C.int32_t(p.NumThreads)
	return c, nil
}

func (e *Engine) hostPool(op string) error {
	if e.layout.Memory == MemoryDevice {
		return &Error{code: Unsupported, op: op,
			msg: "the engine's pool is in device memory; this binding's kernels take Go (host) slices"}
	}
	return nil
}

// activationLen is rows * heads * head_dim.
func (e *Engine) activationLen(op string, rows int, heads int32) (int, error) {
	if heads < 1 {
		return 0, invalid(op, "num_q_heads %d must be a positive multiple of kv_heads", heads)
	}
	return rows * int(heads) * int(e.layout.HeadDim), nil
}

func slotsPtr(v []int64) *C.int64_t {
	if len(v) == 0 {
		return nil
	}
	return (*C.int64_t)(unsafe.Pointer(&v[0]))
}

// WriteKV writes the K/V rows of one layer into the pool
// (clm_engine_write_kv): row i of k and v ([len(slots)][kv_heads][head_dim])
// goes to slots[i], converted to the pool's dtype (round to nearest even).
func (e *Engine) WriteKV(layer int32, slots []int64, k, v []float32) error {
	const op = "clm_engine_write_kv"
	if err := e.hostPool(op); err != nil {
		return err
	}
	n, err := e.activationLen(op, len(slots), e.layout.KVHeads)
	if err != nil {
		return err
	}
	if err := expectLen(op, "k", len(k), n, "[n_slots][kv_heads][head_dim]"); err != nil {
		return err
	}
	if err := expectLen(op, "v", len(v), n, "[n_slots][kv_heads][head_dim]"); err != nil {
		return err
	}
	ep, err := e.acquire(op)
	if err != nil {
		return err
	}
	defer e.release()
	err = call(op, func() C.clm_status {
		return C.clm_engine_write_kv(ep, C.int32_t(layer), slotsPtr(slots), C.size_t(len(slots)), floatsPtr(k),
			floatsPtr(v), C.size_t(len(k)), nil)
	})
	runtime.KeepAlive(slots)
	runtime.KeepAlive(k)
	runtime.KeepAlive(v)
	return err
}

// PagedPrefillAttention is causal attention of the last nNew tokens of a
// sequence of kvLen tokens whose K/V is all written, in pages (at least
// ceil(kvLen/page_size) ids: Seq.PageTable) (clm_engine_paged_prefill_attention).
// q and the result: [nNew][NumQHeads][head_dim].
func (e *Engine) PagedPrefillAttention(p AttentionParams, q []float32, nNew int, pages []int32, kvLen int) ([]float32,
	error) {
	const op = "clm_engine_paged_prefill_attention"
	if err := e.hostPool(op); err != nil {
		return nil, err
	}
	if nNew < 0 || nNew > 1<<31-1 || kvLen < 0 || kvLen > 1<<31-1 {
		return nil, invalid(op, "n_new %d or kv_len %d is out of range", nNew, kvLen)
	}
	out, err := e.attention(op, p, q, nNew, "[n_new][num_q_heads][head_dim]",
		func(out []float32, ep *C.clm_engine, cp *C.clm_attention_params) C.clm_status {
			return C.clm_engine_paged_prefill_attention(floatsPtr(out), C.size_t(len(out)), ep, cp, floatsPtr(q),
				C.size_t(len(q)), C.int32_t(nNew), tokensPtr(pages), C.size_t(len(pages)), C.int32_t(kvLen))
		})
	runtime.KeepAlive(pages)
	return out, err
}

// PagedDecodeAttention is the attention of one query per sequence (its last
// token) over its pages, for a batch as BatchPageTable gives it
// (clm_engine_paged_decode_attention). q and the result:
// [n_seqs][NumQHeads][head_dim].
func (e *Engine) PagedDecodeAttention(p AttentionParams, q []float32, batch PagedBatch) ([]float32, error) {
	const op = "clm_engine_paged_decode_attention"
	if err := e.hostPool(op); err != nil {
		return nil, err
	}
	nSeqs := len(batch.LastPageLen)
	if err := expectLen(op, "batch.Indptr", len(batch.Indptr), nSeqs+1, "len(batch.LastPageLen) + 1"); err != nil {
		return nil, err
	}
	out, err := e.attention(op, p, q, nSeqs, "[n_seqs][num_q_heads][head_dim]",
		func(out []float32, ep *C.clm_engine, cp *C.clm_attention_params) C.clm_status {
			return C.clm_engine_paged_decode_attention(floatsPtr(out), C.size_t(len(out)), ep, cp, floatsPtr(q),
				C.size_t(len(q)), tokensPtr(batch.Indptr), tokensPtr(batch.Indices), C.size_t(len(batch.Indices)),
				tokensPtr(batch.LastPageLen), C.size_t(nSeqs))
		})
	runtime.KeepAlive(batch)
	return out, err
}

// attention is what both attention calls share: q must hold rows x
// NumQHeads x head_dim floats; run gets a result of the same size, the
// engine and the C params.
func (e *Engine) attention(op string, p AttentionParams, q []float32, rows int, shape string,
	run func(out []float32, ep *C.clm_engine, cp *C.clm_attention_params) C.clm_status) ([]float32, error) {
	n, err := e.activationLen(op, rows, p.NumQHeads)
	if err != nil {
		return nil, err
	}
	if err := expectLen(op, "q", len(q), n, shape); err != nil {
		return nil, err
	}
	cp, err := p.toC()
	if err != nil {
		return nil, err
	}
	ep, err := e.acquire(op)
	if err != nil {
		return nil, err
	}
	defer e.release()
	out := make([]float32, n)
	err = call(op, func() C.clm_status { return run(out, ep, &cp) })
	runtime.KeepAlive(q)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// CopyPages copies whole pages (every layer): dstPages[i] of e <-
// srcPages[i] of src, pair by pair in order (clm_engine_copy_pages). src
// may be e itself; the two pools must have the same layout.
func (e *Engine) CopyPages(dstPages []int32, src *Engine, srcPages []int32) error {
	const op = "clm_engine_copy_pages"
	if err := e.hostPool(op); err != nil {
		return err
	}
	if src == nil {
		return invalid(op, "src is nil")
	}
	if err := src.hostPool(op); err != nil {
		return err
	}
	if err := expectLen(op, "srcPages", len(srcPages), len(dstPages), "one per dst page"); err != nil {
		return err
	}
	dp, err := e.acquire(op)
	if err != nil {
		return err
	}
	defer e.release()
	sp := dp
	if src != e { // a second read lock on e could deadlock behind a waiting Close
		if sp, err = src.acquire(op); err != nil {
			return err
		}
		defer src.release()
	}
	err = call(op, func() C.clm_status {
		return C.clm_engine_copy_pages(dp, tokensPtr(dstPages), sp, tokensPtr(srcPages), C.size_t(len(dstPages)), nil)
	})
	runtime.KeepAlive(dstPages)
	runtime.KeepAlive(srcPages)
	return err
}

// PageBytes is the size of one page (every layer's K and V) in a page buffer.
func (e *Engine) PageBytes() int { return int(e.layout.PageBytes) }

// GatherPages packs pages (every layer) into a new buffer of len(pages) *
// PageBytes() bytes (clm_engine_gather_pages).
func (e *Engine) GatherPages(pages []int32) ([]byte, error) {
	const op = "clm_engine_gather_pages"
	if err := e.hostPool(op); err != nil {
		return nil, err
	}
	ep, err := e.acquire(op)
	if err != nil {
		return nil, err
	}
	defer e.release()
	buf := make([]byte, len(pages)*e.PageBytes())
	var bufPtr unsafe.Pointer
	if len(buf) > 0 {
		bufPtr = unsafe.Pointer(&buf[0])
	}
	err = call(op, func() C.clm_status {
		return C.clm_engine_gather_pages(bufPtr, C.size_t(len(buf)), ep, tokensPtr(pages), C.size_t(len(pages)), nil)
	})
	runtime.KeepAlive(pages)
	if err != nil {
		return nil, err
	}
	return buf, nil
}

// ScatterPages unpacks buf (as GatherPages packs it; at least len(pages) *
// PageBytes() bytes) into pages (clm_engine_scatter_pages).
func (e *Engine) ScatterPages(pages []int32, buf []byte) error {
	const op = "clm_engine_scatter_pages"
	if err := e.hostPool(op); err != nil {
		return err
	}
	if len(buf) < len(pages)*e.PageBytes() {
		return invalid(op, "buf has %d bytes; %d pages of %d bytes need %d", len(buf), len(pages), e.PageBytes(),
			len(pages)*e.PageBytes())
	}
	ep, err := e.acquire(op)
	if err != nil {
		return err
	}
	defer e.release()
	var bufPtr unsafe.Pointer
	if len(buf) > 0 {
		bufPtr = unsafe.Pointer(&buf[0])
	}
	err = call(op, func() C.clm_status {
		return C.clm_engine_scatter_pages(ep, tokensPtr(pages), C.size_t(len(pages)), bufPtr, C.size_t(len(buf)), nil)
	})
	runtime.KeepAlive(pages)
	runtime.KeepAlive(buf)
	return err
}

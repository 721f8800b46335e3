package clm

/*
#include <stdlib.h>
#include <clm.h>

// The adapter options carry a pointer to the layers: cgo forbids passing Go
// memory that holds a Go pointer, so the struct travels by value and the
// layers (Go memory) as their own argument.
static clm_status clmgo_set_adapter(clm_engine *engine, int32_t snapshot_dim, int32_t hidden, const float *weight,
                                    const float *bias, clm_adapter_options options, const int32_t *layers,
                                    size_t n_layers) {
  options.layers = layers;
  options.n_layers = n_layers;
  return clm_engine_set_snapshot_adapter(engine, snapshot_dim, hidden, weight, bias, &options);
}

static clm_status clmgo_load_adapter(clm_engine *engine, const char *path, clm_adapter_options options,
                                     const int32_t *layers, size_t n_layers) {
  options.layers = layers;
  options.n_layers = n_layers;
  return clm_engine_load_snapshot_adapter(engine, path, &options);
}
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// CLM suffix reuse (clm.h, docs/clm.md): the SRC head scores, per running
// sequence and step, how likely the current suffix repeats an earlier one; on
// a reuse decision the host looks up a semantic snapshot (a PCA projection of
// a hidden state) and the adapter injects it back. Every method checks the
// lengths of its slices before the C call (InvalidArgument naming the
// argument), so the library never reads or writes past a slice.

// Gelu is the SRC head's activation (CLM_GELU_*).
type Gelu int32

const (
	GeluTanh Gelu = C.CLM_GELU_TANH // 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))
	GeluErf  Gelu = C.CLM_GELU_ERF  // 0.5x(1 + erf(x / sqrt(2)))
	// GeluFromFile (LoadSRCHead only): the form the file names in its "gelu"
	// metadata, as clm_fit writes it.
	GeluFromFile Gelu = C.CLM_GELU_FROM_FILE
)

// DType is the element type of activations (CLM_DTYPE_*).
type DType int32

const (
	DTypeF32  DType = C.CLM_DTYPE_F32
	DTypeF16  DType = C.CLM_DTYPE_F16
	DTypeBF16 DType = C.CLM_DTYPE_BF16
)

// Rows are activations [n_rows][hidden], row-major: f32, or the bit patterns
// of f16 / bf16 values. Make them with F32Rows, F16Rows or BF16Rows; they
// share the slice (InjectSnapshots updates it in place).
type Rows struct {
	dtype DType
	f32   []float32
	u16   []uint16
}

// F32Rows are f32 activations.
func F32Rows(v []float32) Rows { return Rows{dtype: DTypeF32, f32: v} }

// F16Rows are IEEE half activations, as their bits.
func F16Rows(bits []uint16) Rows { return Rows{dtype: DTypeF16, u16: bits} }

// BF16Rows are bfloat16 activations, as their bits.
func BF16Rows(bits []uint16) Rows { return Rows{dtype: DTypeBF16, u16: bits} }

// DType is the element type.
func (r Rows) DType() DType { return r.dtype }

// Len is the number of elements.
func (r Rows) Len() int {
	if r.dtype == DTypeF32 {
		return len(r.f32)
	}
	return len(r.u16)
}

func (r Rows) ptr() unsafe.Pointer {
	if r.dtype == DTypeF32 {
		if len(r.f32) > 0 {
			return unsafe.Pointer(&r.f32[0])
		}
	} else if len(r.u16) > 0 {
		return unsafe.Pointer(&r.u16[0])
	}
	return nil
}

// SRCHeadWeights is the SRC head in host memory, row-major f32:
// sigmoid(W2 . GELU(W1 h + B1) + B2), W1 [Hidden/4][Hidden], B1 and W2
// [Hidden/4]; Hidden is a positive multiple of 4.
type SRCHeadWeights struct {
	Hidden     int32
	W1, B1, W2 []float32
	B2         float32
}

// SRCDecision is one sequence's outcome of an SRC step (clm_src_decision).
type SRCDecision struct {
	Score     float32 // SRC in [0, 1]; 0 when not scored
	Threshold float32 // the threshold it was compared with
	Scored    bool    // false while the sequence has no non-special row
	Reuse     bool    // look up a snapshot and inject it (then ReportRetrieval)
	Baseline  bool    // the breaker switched this sequence off for good
}

// AdapterOptions mirrors clm_adapter_options. Start from
// DefaultAdapterOptions; NumLayers has no default and must be set.
type AdapterOptions struct {
	NumLayers     int32   // the model's layer count (>= 1)
	Layers        []int32 // layers that inject; empty = the last 3
	ResidualScale float32 // the injection adds ResidualScale * (W s + b)
}

func adapterOptionsInit(c *C.clm_adapter_options) error {
	return call("clm_adapter_options_init", func() C.clm_status {
		return C.clm_adapter_options_init(c, C.sizeof_clm_adapter_options)
	})
}

// DefaultAdapterOptions is the library's defaults (clm_adapter_options_init).
func DefaultAdapterOptions() (AdapterOptions, error) {
	var c C.clm_adapter_options
	if err := adapterOptionsInit(&c); err != nil {
		return AdapterOptions{}, err
	}
	return AdapterOptions{NumLayers: int32(c.num_layers), ResidualScale: float32(c.residual_scale)}, nil
}

func (o AdapterOptions) toC() (C.clm_adapter_options, error) {
	var c C.clm_adapter_options
	if err := adapterOptionsInit(&c); err != nil {
		return c, err
	}
	c.num_layers = C.int32_t(o.NumLayers)
	c.residual_scale = C.float(o.ResidualScale)
	return c, nil
}

func invalid(op, format string, args ...interface{}) error {
	return &Error{code: InvalidArgument, op: op, msg: fmt.Sprintf(format, args...)}
}

func expectLen(op, name string, got, want int, why string) error {
	if got != want {
		return invalid(op, "%s has %d elements; %s needs %d", name, got, why, want)
	}
	return nil
}

// rowsOf is the number of rows of [n][hidden] activations of n elements.
func rowsOf(op, name string, n int, hidden int32) (int, error) {
	if hidden < 1 {
		return 0, invalid(op, "hidden must be >= 1, got %d", hidden)
	}
	if n%int(hidden) != 0 {
		return 0, invalid(op, "%s has %d elements, not a multiple of hidden %d", name, n, hidden)
	}
	return n / int(hidden), nil
}

func floatsPtr(v []float32) *C.float {
	if len(v) == 0 {
		return nil
	}
	return (*C.float)(unsafe.Pointer(&v[0]))
}

func flags(v []bool) []C.uint8_t {
	out := make([]C.uint8_t, len(v))
	for i, b := range v {
		if b {
			out[i] = 1
		}
	}
	return out
}

func flagsPtr(v []C.uint8_t) *C.uint8_t {
	if len(v) == 0 {
		return nil
	}
	return &v[0]
}

// withPath runs f with path as a C string (freed after).
func withPath(op, path string, f func(*C.char) error) error {
	for i := 0; i < len(path); i++ {
		if path[i] == 0 {
			return invalid(op, "path %q contains a NUL byte", path)
		}
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	return f(cpath)
}

// ---- the SRC head -------------------------------------------------------------

// SetSRCHead installs the SRC head from host memory (clm_engine_set_src_head,
// copied), replacing any earlier one.
func (e *Engine) SetSRCHead(w SRCHeadWeights, gelu Gelu) error {
	const op = "clm_engine_set_src_head"
	if w.Hidden < 4 || w.Hidden%4 != 0 {
		return invalid(op, "hidden must be a positive multiple of 4, got %d", w.Hidden)
	}
	inner := int(w.Hidden) / 4
	if err := expectLen(op, "W1", len(w.W1), inner*int(w.Hidden), "[hidden/4][hidden]"); err != nil {
		return err
	}
	if err := expectLen(op, "B1", len(w.B1), inner, "[hidden/4]"); err != nil {
		return err
	}
	if err := expectLen(op, "W2", len(w.W2), inner, "[hidden/4]"); err != nil {
		return err
	}
	ep, err := e.acquire(op)
	if err != nil {
		return err
	}
	defer e.release()
	err = call(op, func() C.clm_status {
		return C.clm_engine_set_src_head(ep, C.int32_t(w.Hidden), floatsPtr(w.W1), floatsPtr(w.B1), floatsPtr(w.W2),
			C.float(w.B2), C.int32_t(gelu))
	})
	runtime.KeepAlive(w)
	return err
}

// LoadSRCHead loads the SRC head (src_head.w1, .b1, .w2, .b2) from a
// safetensors file (clm_engine_load_src_head), replacing any earlier one. A
// file whose "gelu" metadata names another form than gelu, or none when gelu
// is GeluFromFile, is refused (the earlier head stays).
func (e *Engine) LoadSRCHead(path string, gelu Gelu) error {
	const op = "clm_engine_load_src_head"
	ep, err := e.acquire(op)
	if err != nil {
		return err
	}
	defer e.release()
	return withPath(op, path, func(p *C.char) error {
		return call(op, func() C.clm_status { return C.clm_engine_load_src_head(ep, p, C.int32_t(gelu)) })
	})
}

// SRCStep runs one SRC step over a ragged batch (clm_engine_src_step):
// attnOut [n_rows][hidden] holds the new rows of one layer's attention
// output, seqs[i] owning rows indptr[i] .. indptr[i+1]-1 (len(indptr) =
// len(seqs)+1; 0 rows is allowed), tokenIDs[n_rows] their ids. The engine
// keeps each sequence's running mean over non-special rows, so a step passes
// only the new rows. Nothing changes on error.
func (e *Engine) SRCStep(seqs []*Seq, attnOut Rows, hidden int32, tokenIDs, indptr []int32) ([]SRCDecision, error) {
	const op = "clm_engine_src_step"
	nRows, err := rowsOf(op, "attnOut", attnOut.Len(), hidden)
	if err != nil {
		return nil, err
	}
	if err := expectLen(op, "tokenIDs", len(tokenIDs), nRows, "one per row of attnOut"); err != nil {
		return nil, err
	}
	if err := expectLen(op, "indptr", len(indptr), len(seqs)+1, "len(seqs) + 1"); err != nil {
		return nil, err
	}
	raw := make([]C.clm_src_decision, len(seqs))
	var rawPtr *C.clm_src_decision
	if len(raw) > 0 {
		rawPtr = &raw[0]
	}
	err = e.withSeqs(op, seqs, func(ep *C.clm_engine, cseqs []*C.clm_seq) error {
		return call(op, func() C.clm_status {
			return C.clm_engine_src_step(rawPtr, ep, seqsPtr(cseqs), C.size_t(len(cseqs)), attnOut.ptr(),
				C.int32_t(attnOut.dtype), C.size_t(nRows), C.int32_t(hidden), tokensPtr(tokenIDs), tokensPtr(indptr))
		})
	})
	runtime.KeepAlive(attnOut)
	runtime.KeepAlive(tokenIDs)
	runtime.KeepAlive(indptr)
	if err != nil {
		return nil, err
	}
	out := make([]SRCDecision, len(raw))
	for i, d := range raw {
		out[i] = SRCDecision{Score: float32(d.score), Threshold: float32(d.threshold), Scored: d.scored != 0,
			Reuse: d.reuse != 0, Baseline: d.baseline != 0}
	}
	return out, nil
}

// ReportRetrieval says whether each snapshot lookup the last step asked for
// found one (clm_engine_report_retrieval). After SRCBreakerSteps failed
// lookups in a row at scores above SRCBreakerScore a sequence falls back to
// baseline mode.
func (e *Engine) ReportRetrieval(seqs []*Seq, found []bool) error {
	return e.reportPerSeq("clm_engine_report_retrieval", "found", seqs, found,
		func(ep *C.clm_engine, cseqs **C.clm_seq, n C.size_t, cflags *C.uint8_t) C.clm_status {
			return C.clm_engine_report_retrieval(ep, cseqs, n, cflags)
		})
}

// reportPerSeq runs one of the C calls that take one flag per sequence
// (retrievals found, outcomes right), with the engine and the sequences held.
func (e *Engine) reportPerSeq(op, name string, seqs []*Seq, values []bool,
	cfn func(*C.clm_engine, **C.clm_seq, C.size_t, *C.uint8_t) C.clm_status) error {
	if err := expectLen(op, name, len(values), len(seqs), "one per sequence"); err != nil {
		return err
	}
	cvalues := flags(values)
	return e.withSeqs(op, seqs, func(ep *C.clm_engine, cseqs []*C.clm_seq) error {
		return call(op, func() C.clm_status {
			return cfn(ep, seqsPtr(cseqs), C.size_t(len(cseqs)), flagsPtr(cvalues))
		})
	})
}

// ---- snapshots ------------------------------------------------------------------

// SetSnapshotProjection installs the snapshot projection from host memory
// (clm_engine_set_snapshot_projection, copied): mean [hidden], components
// [snapshotDim][hidden] with orthonormal rows.
func (e *Engine) SetSnapshotProjection(hidden, snapshotDim int32, mean, components []float32) error {
	const op = "clm_engine_set_snapshot_projection"
	if hidden < 1 || snapshotDim < 1 {
		return invalid(op, "hidden %d and snapshot_dim %d must be >= 1", hidden, snapshotDim)
	}
	if err := expectLen(op, "mean", len(mean), int(hidden), "[hidden]"); err != nil {
		return err
	}
	if err := expectLen(op, "components", len(components), int(hidden)*int(snapshotDim),
		"[snapshot_dim][hidden]"); err != nil {
		return err
	}
	ep, err := e.acquire(op)
	if err != nil {
		return err
	}
	defer e.release()
	err = call(op, func() C.clm_status {
		return C.clm_engine_set_snapshot_projection(ep, C.int32_t(hidden), C.int32_t(snapshotDim), floatsPtr(mean),
			floatsPtr(components))
	})
	runtime.KeepAlive(mean)
	runtime.KeepAlive(components)
	return err
}

// LoadSnapshotProjection loads the projection (snapshot.mean,
// snapshot.components) from a safetensors file.
func (e *Engine) LoadSnapshotProjection(path string) error {
	const op = "clm_engine_load_snapshot_projection"
	ep, err := e.acquire(op)
	if err != nil {
		return err
	}
	defer e.release()
	return withPath(op, path, func(p *C.char) error {
		return call(op, func() C.clm_status { return C.clm_engine_load_snapshot_projection(ep, p) })
	})
}

// MakeSnapshots gives the snapshots of rows [n_rows][hidden]:
// [n_rows][snapshotDim] f32, normalize(components (x - mean)) each
// (clm_engine_make_snapshots). snapshotDim is the installed projection's.
func (e *Engine) MakeSnapshots(rows Rows, hidden, snapshotDim int32) ([]float32, error) {
	const op = "clm_engine_make_snapshots"
	nRows, err := rowsOf(op, "rows", rows.Len(), hidden)
	if err != nil {
		return nil, err
	}
	if snapshotDim < 1 {
		return nil, invalid(op, "snapshot_dim must be >= 1, got %d", snapshotDim)
	}
	ep, err := e.acquire(op)
	if err != nil {
		return nil, err
	}
	defer e.release()
	out := make([]float32, nRows*int(snapshotDim))
	err = call(op, func() C.clm_status {
		return C.clm_engine_make_snapshots(floatsPtr(out), C.size_t(len(out)), ep, rows.ptr(), C.int32_t(rows.dtype),
			C.size_t(nRows), C.int32_t(hidden))
	})
	runtime.KeepAlive(rows)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// SetSnapshotAdapter installs the snapshot adapter from host memory
// (clm_engine_set_snapshot_adapter, copied): weight [hidden][snapshotDim],
// bias [hidden].
func (e *Engine) SetSnapshotAdapter(snapshotDim, hidden int32, weight, bias []float32, opts AdapterOptions) error {
	const op = "clm_engine_set_snapshot_adapter"
	if hidden < 1 || snapshotDim < 1 {
		return invalid(op, "hidden %d and snapshot_dim %d must be >= 1", hidden, snapshotDim)
	}
	if err := expectLen(op, "weight", len(weight), int(hidden)*int(snapshotDim), "[hidden][snapshot_dim]"); err != nil {
		return err
	}
	if err := expectLen(op, "bias", len(bias), int(hidden), "[hidden]"); err != nil {
		return err
	}
	copts, err := opts.toC()
	if err != nil {
		return err
	}
	ep, err := e.acquire(op)
	if err != nil {
		return err
	}
	defer e.release()
	layers := opts.Layers
	err = call(op, func() C.clm_status {
		return C.clmgo_set_adapter(ep, C.int32_t(snapshotDim), C.int32_t(hidden), floatsPtr(weight), floatsPtr(bias),
			copts, tokensPtr(layers), C.size_t(len(layers)))
	})
	runtime.KeepAlive(weight)
	runtime.KeepAlive(bias)
	runtime.KeepAlive(layers)
	return err
}

// LoadSnapshotAdapter loads the adapter (adapter.weight, adapter.bias) from a
// safetensors file (clm_engine_load_snapshot_adapter).
func (e *Engine) LoadSnapshotAdapter(path string, opts AdapterOptions) error {
	const op = "clm_engine_load_snapshot_adapter"
	copts, err := opts.toC()
	if err != nil {
		return err
	}
	ep, err := e.acquire(op)
	if err != nil {
		return err
	}
	defer e.release()
	layers := opts.Layers
	err = withPath(op, path, func(p *C.char) error {
		return call(op, func() C.clm_status {
			return C.clmgo_load_adapter(ep, p, copts, tokensPtr(layers), C.size_t(len(layers)))
		})
	})
	runtime.KeepAlive(layers)
	return err
}

// InjectSnapshots adds ResidualScale * (W snapshots[i] + b) to rows
// indptr[i] .. indptr[i+1]-1 of hiddenStates [n_rows][hidden] (in place) for
// each i with apply[i] whose sequence is not in baseline mode, when the
// adapter injects at layer (else nothing changes)
// (clm_engine_inject_snapshots). snapshots: [len(seqs)][snapshotDim]. On
// error hiddenStates is untouched.
func (e *Engine) InjectSnapshots(hiddenStates Rows, hidden int32, seqs []*Seq, indptr []int32, snapshots []float32,
	snapshotDim int32, apply []bool, layer int32) error {
	const op = "clm_engine_inject_snapshots"
	nRows, err := rowsOf(op, "hiddenStates", hiddenStates.Len(), hidden)
	if err != nil {
		return err
	}
	if snapshotDim < 1 {
		return invalid(op, "snapshot_dim must be >= 1, got %d", snapshotDim)
	}
	if err := expectLen(op, "indptr", len(indptr), len(seqs)+1, "len(seqs) + 1"); err != nil {
		return err
	}
	if err := expectLen(op, "snapshots", len(snapshots), len(seqs)*int(snapshotDim),
		"[len(seqs)][snapshot_dim]"); err != nil {
		return err
	}
	if err := expectLen(op, "apply", len(apply), len(seqs), "one per sequence"); err != nil {
		return err
	}
	capply := flags(apply)
	err = e.withSeqs(op, seqs, func(ep *C.clm_engine, cseqs []*C.clm_seq) error {
		return call(op, func() C.clm_status {
			return C.clm_engine_inject_snapshots(ep, hiddenStates.ptr(), C.int32_t(hiddenStates.dtype),
				C.size_t(nRows), C.int32_t(hidden), seqsPtr(cseqs), C.size_t(len(cseqs)), tokensPtr(indptr),
				floatsPtr(snapshots), C.int32_t(snapshotDim), flagsPtr(capply), C.int32_t(layer))
		})
	})
	runtime.KeepAlive(hiddenStates)
	runtime.KeepAlive(indptr)
	runtime.KeepAlive(snapshots)
	return err
}

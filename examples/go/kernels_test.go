package clm

import (
	"bytes"
	"math"
	"math/rand"
	"testing"
)

// The kernels through the real library: K/V written at a sequence's slots,
// prefill over a reused prefix and batched decode against float64 dense
// attention, page gathers/scatters/copies, and bad input.

const (
	kPage    = 4
	kKVHeads = 2
	kHeadDim = 8
	kQHeads  = 4
	kRow     = kKVHeads * kHeadDim
)

func kernelEngine(t *testing.T) *Engine {
	t.Helper()
	opts, err := DefaultEngineOptions()
	must(t, err)
	opts.NumPages, opts.PageSize, opts.NumLayers = 32, kPage, 2
	opts.KVHeads, opts.HeadDim, opts.KVDType, opts.Memory = kKVHeads, kHeadDim, KVF32, MemoryHost
	e, err := NewEngine(opts)
	must(t, err)
	t.Cleanup(func() { e.Close() })
	return e
}

// writeNew writes random K/V for the sequence's latest slots at layer and
// appends them to the host's copies k, v.
func writeNew(t *testing.T, r *rand.Rand, e *Engine, s *Seq, layer int32, k, v *[]float32) {
	t.Helper()
	slots, err := s.Slots()
	must(t, err)
	nk, nv := randVec(r, len(slots)*kRow, 1), randVec(r, len(slots)*kRow, 1)
	must(t, e.WriteKV(layer, slots, nk, nv))
	*k = append(*k, nk...)
	*v = append(*v, nv...)
}

// denseAttention is causal GQA attention in float64 of the last nNew tokens.
func denseAttention(k, v, q []float32, nNew int) []float64 {
	n := len(k) / kRow
	out := make([]float64, nNew*kQHeads*kHeadDim)
	scale := 1 / math.Sqrt(kHeadDim)
	for i := 0; i < nNew; i++ {
		p := n - nNew + i
		for h := 0; h < kQHeads; h++ {
			g := h / (kQHeads / kKVHeads)
			scores := make([]float64, p+1)
			mx := math.Inf(-1)
			for j := 0; j <= p; j++ {
				for d := 0; d < kHeadDim; d++ {
					scores[j] += float64(q[(i*kQHeads+h)*kHeadDim+d]) * float64(k[(j*kKVHeads+g)*kHeadDim+d])
				}
				scores[j] *= scale
				mx = math.Max(mx, scores[j])
			}
			total := 0.0
			for j := range scores {
				scores[j] = math.Exp(scores[j] - mx)
				total += scores[j]
			}
			for j := range scores {
				for d := 0; d < kHeadDim; d++ {
					out[(i*kQHeads+h)*kHeadDim+d] += scores[j] / total * float64(v[(j*kKVHeads+g)*kHeadDim+d])
				}
			}
		}
	}
	return out
}

func checkClose(t *testing.T, what string, got []float32, want []float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if !closeTo(float64(got[i]), want[i], 1e-4) {
			t.Fatalf("%s[%d]: %v vs %v", what, i, got[i], want[i])
		}
	}
}

func TestPrefillAndDecodeMatchDenseAttention(t *testing.T) {
	r := rand.New(rand.NewSource(11))
	e := kernelEngine(t)
	p, err := DefaultAttentionParams()
	must(t, err)
	if p.NumQHeads != 0 || p.Layer != 0 || p.SoftmaxScale != 0 {
		t.Fatalf("defaults %+v", p)
	}
	p.NumQHeads, p.Layer, p.NumThreads = kQHeads, 1, 2

	// Turn 1: 10 tokens.
	prompt := span(100, 10)
	s1 := admit(t, e, prompt, nil)
	var k, v []float32
	writeNew(t, r, e, s1, 1, &k, &v)
	pages, err := s1.PageTable()
	must(t, err)
	q := randVec(r, 10*kQHeads*kHeadDim, 1)
	out, err := e.PagedPrefillAttention(p, q, 10, pages, 10)
	must(t, err)
	checkClose(t, "turn 1", out, denseAttention(k, v, q, 10))
	must(t, s1.Finish())

	// Turn 2 reuses two pages (8 tokens): attention of the 7 new over all 15.
	s2 := admit(t, e, concat(prompt, span(200, 5)), nil)
	if c := cached(t, s2); c != 8 {
		t.Fatalf("cached %d, want 8", c)
	}
	k2, v2 := append([]float32(nil), k[:8*kRow]...), append([]float32(nil), v[:8*kRow]...)
	writeNew(t, r, e, s2, 1, &k2, &v2)
	pages2, err := s2.PageTable()
	must(t, err)
	q2 := randVec(r, 7*kQHeads*kHeadDim, 1)
	out, err = e.PagedPrefillAttention(p, q2, 7, pages2, 15)
	must(t, err)
	checkClose(t, "turn 2", out, denseAttention(k2, v2, q2, 7))

	// Decode: one more token for s2 and for a new sequence, as one batch.
	s3 := admit(t, e, span(500, 3), nil)
	var k3, v3 []float32
	writeNew(t, r, e, s3, 1, &k3, &v3)
	must(t, s2.Extend([]int32{1}))
	must(t, s3.Extend([]int32{2}))
	writeNew(t, r, e, s2, 1, &k2, &v2)
	writeNew(t, r, e, s3, 1, &k3, &v3)
	batch, err := e.BatchPageTable([]*Seq{s2, s3})
	must(t, err)
	qd := randVec(r, 2*kQHeads*kHeadDim, 1)
	out, err = e.PagedDecodeAttention(p, qd, batch)
	must(t, err)
	stride := kQHeads * kHeadDim
	checkClose(t, "decode s2", out[:stride], denseAttention(k2, v2, qd[:stride], 1))
	checkClose(t, "decode s3", out[stride:], denseAttention(k3, v3, qd[stride:], 1))

	// Bad input.
	slots, err := s3.Slots()
	must(t, err)
	nanQ := append([]float32(nil), q2...)
	nanQ[0] = float32(math.NaN())
	bad3 := p
	bad3.NumQHeads = 3
	badLayer := p
	badLayer.Layer = 2
	short := batch
	short.Indptr = short.Indptr[:2]
	for name, err := range map[string]error{
		"k length":  e.WriteKV(1, slots, k3[:kRow-1], v3[:kRow]),
		"v length":  e.WriteKV(1, slots, k3[:kRow], v3),
		"slot":      e.WriteKV(1, []int64{1 << 40}, k3[:kRow], v3[:kRow]),
		"kv layer":  e.WriteKV(2, slots, k3[:kRow], v3[:kRow]),
		"q length":  second(e.PagedPrefillAttention(p, q2[1:], 7, pages2, 15)),
		"n_new":     second(e.PagedPrefillAttention(p, q2, 7, pages2, 6)),
		"pages":     second(e.PagedPrefillAttention(p, q2, 7, pages2[:1], 15)),
		"page id":   second(e.PagedPrefillAttention(p, q2, 7, []int32{pages2[0], 99, 98, 97}, 15)),
		"heads":     second(e.PagedPrefillAttention(bad3, q2[:7*3*kHeadDim], 7, pages2, 15)),
		"layer":     second(e.PagedPrefillAttention(badLayer, q2, 7, pages2, 15)),
		"nan q":     second(e.PagedPrefillAttention(p, nanQ, 7, pages2, 15)),
		"indptr":    second(e.PagedDecodeAttention(p, qd, short)),
		"decode q":  second(e.PagedDecodeAttention(p, qd[1:], batch)),
		"no heads":  second(e.PagedDecodeAttention(AttentionParams{}, nil, batch)),
		"scatter":   e.ScatterPages([]int32{0}, make([]byte, e.PageBytes()-1)),
		"copy":      e.CopyPages([]int32{0, 1}, e, []int32{2}),
		"copy page": e.CopyPages([]int32{0}, e, []int32{999}),
	} {
		t.Run(name, func(t *testing.T) { wantCode(t, err, InvalidArgument) })
	}
}

func second(_ []float32, err error) error { return err }

func TestGatherScatterCopyPages(t *testing.T) {
	r := rand.New(rand.NewSource(12))
	a, b := kernelEngine(t), kernelEngine(t)
	sa := admit(t, a, span(0, 8), nil)
	var k, v []float32
	writeNew(t, r, a, sa, 0, &k, &v)
	pa, err := sa.PageTable()
	must(t, err)
	layout, err := a.KVLayout()
	must(t, err)
	buf, err := a.GatherPages(pa)
	must(t, err)
	if len(buf) != 2*int(layout.PageBytes) || a.PageBytes() != int(layout.PageBytes) {
		t.Fatalf("gathered %d bytes, page %d", len(buf), layout.PageBytes)
	}
	// Token t's K at layer 0: page t/kPage, row t%kPage, at the page's start.
	for tok := 0; tok < 8; tok++ {
		off := tok/kPage*int(layout.PageBytes) + tok%kPage*kRow*4
		for i := 0; i < kRow; i++ {
			got := math.Float32frombits(uint32(buf[off+4*i]) | uint32(buf[off+4*i+1])<<8 | uint32(buf[off+4*i+2])<<16 |
				uint32(buf[off+4*i+3])<<24)
			if got != k[tok*kRow+i] {
				t.Fatalf("token %d K[%d]: %v vs %v", tok, i, got, k[tok*kRow+i])
			}
		}
	}
	sb := admit(t, b, span(50, 8), nil)
	pb, err := sb.PageTable()
	must(t, err)
	must(t, b.ScatterPages(pb, buf))
	back, err := b.GatherPages(pb)
	must(t, err)
	if !bytes.Equal(back, buf) {
		t.Fatal("scatter + gather changed the bytes")
	}
	must(t, b.CopyPages([]int32{pb[1], pb[0]}, a, pa))
	swapped, err := b.GatherPages(pb)
	must(t, err)
	half := int(layout.PageBytes)
	if !bytes.Equal(swapped[:half], buf[half:]) || !bytes.Equal(swapped[half:], buf[:half]) {
		t.Fatal("copy between engines")
	}
	must(t, b.CopyPages([]int32{pb[0]}, b, []int32{pb[1]}))
	within, err := b.GatherPages(pb)
	must(t, err)
	if !bytes.Equal(within[:half], within[half:]) {
		t.Fatal("copy within one engine")
	}

	// A pool without KV bytes.
	opts, _ := DefaultEngineOptions()
	opts.NumPages, opts.Memory = 4, MemoryNone
	n, err := NewEngine(opts)
	must(t, err)
	defer n.Close()
	wantCode(t, n.WriteKV(0, nil, nil, nil), FailedPrecondition)
	_, err = n.GatherPages(nil)
	wantCode(t, err, FailedPrecondition)
	wantCode(t, a.CopyPages(nil, n, nil), FailedPrecondition)
}

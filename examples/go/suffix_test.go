package clm

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// CLM suffix reuse through the real library: SRC scores against a float64
// reference over each sequence's running mean, the breaker, snapshots and
// injections against float64 references, weights from safetensors files, the
// version-2 options and metrics, and bad input.

const (
	srcHidden = 8
	srcInner  = srcHidden / 4
	eot       = int32(2) // a special token: left out of the running mean
)

func randVec(r *rand.Rand, n int, scale float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = (2*r.Float32() - 1) * scale
	}
	return v
}

func closeTo(got, want, rel float64) bool { return math.Abs(got-want) <= rel*(1+math.Abs(want)) }

func randomHead(r *rand.Rand, b2 float32) SRCHeadWeights {
	return SRCHeadWeights{Hidden: srcHidden, W1: randVec(r, srcInner*srcHidden, 0.8), B1: randVec(r, srcInner, 0.5),
		W2: randVec(r, srcInner, 1.5), B2: b2}
}

// srcReference is sigmoid(w2 . GELU(W1 h + b1) + b2) in float64.
func srcReference(h SRCHeadWeights, mean []float64, gelu Gelu) float64 {
	logit := float64(h.B2)
	for i := 0; i < srcInner; i++ {
		z := float64(h.B1[i])
		for c := 0; c < srcHidden; c++ {
			z += float64(h.W1[i*srcHidden+c]) * mean[c]
		}
		var g float64
		if gelu == GeluErf {
			g = 0.5 * z * (1 + math.Erf(z/math.Sqrt2))
		} else {
			g = 0.5 * z * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(z+0.044715*z*z*z)))
		}
		logit += float64(h.W2[i]) * g
	}
	return 1 / (1 + math.Exp(-logit))
}

func srcEngine(t *testing.T, edit func(*EngineOptions)) *Engine {
	t.Helper()
	opts, err := DefaultEngineOptions()
	must(t, err)
	opts.NumPages, opts.PageSize, opts.Memory = 64, 4, MemoryNone
	opts.SpecialTokenIDs = []int32{eot}
	if edit != nil {
		edit(&opts)
	}
	e, err := NewEngine(opts)
	if err != nil {
		t.Fatalf("NewEngine: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// writeSafetensors writes F32 tensors in the order given.
func writeSafetensors(t *testing.T, names []string, shapes [][]int, data [][]float32) string {
	t.Helper()
	var header []string
	offset := 0
	for i, name := range names {
		dims := make([]string, len(shapes[i]))
		for j, d := range shapes[i] {
			dims[j] = fmt.Sprint(d)
		}
		header = append(header, fmt.Sprintf(`"%s":{"dtype":"F32","shape":[%s],"data_offsets":[%d,%d]}`, name,
			strings.Join(dims, ","), offset, offset+4*len(data[i])))
		offset += 4 * len(data[i])
	}
	h := "{" + strings.Join(header, ",") + "}"
	buf := make([]byte, 8, 8+len(h)+offset)
	binary.LittleEndian.PutUint64(buf, uint64(len(h)))
	buf = append(buf, h...)
	for _, d := range data {
		for _, v := range d {
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
		}
	}
	path := filepath.Join(t.TempDir(), "weights.safetensors")
	must(t, os.WriteFile(path, buf, 0o600))
	return path
}

func TestVersion2Defaults(t *testing.T) {
	opts, err := DefaultEngineOptions()
	must(t, err)
	if opts.SRCDailyRequests != 10000 || opts.SRCThreshold != -1 || opts.SRCBreakerScore != 0.95 ||
		opts.SRCBreakerSteps != 3 || len(opts.SpecialTokenIDs) != 0 {
		t.Fatalf("version-2 defaults differ from clm.h: %+v", opts)
	}
	a, err := DefaultAdapterOptions()
	must(t, err)
	if a.NumLayers != 0 || len(a.Layers) != 0 || a.ResidualScale != 0.3 {
		t.Fatalf("adapter defaults: %+v", a)
	}
	for _, edit := range []func(*EngineOptions){
		func(o *EngineOptions) { o.SRCDailyRequests = 0 },
		func(o *EngineOptions) { o.SRCThreshold = 1.5 },
		func(o *EngineOptions) { o.SRCBreakerScore = -0.5 },
		func(o *EngineOptions) { o.SRCBreakerSteps = 0 },
	} {
		opts, _ := DefaultEngineOptions()
		opts.NumPages = 8
		edit(&opts)
		_, err := NewEngine(opts)
		wantCode(t, err, InvalidArgument)
	}
}

func TestSRCRunningMeanScores(t *testing.T) {
	for _, gelu := range []Gelu{GeluErf, GeluTanh} {
		r := rand.New(rand.NewSource(int64(gelu) + 1))
		e := srcEngine(t, nil)
		head := randomHead(r, 0.3)
		must(t, e.SetSRCHead(head, gelu))
		a := admit(t, e, []int32{1, 5, 6, 7, 8}, nil)
		b := admit(t, e, []int32{3, 5, 6, 7, 8}, nil)
		sums := [2][]float64{make([]float64, srcHidden), make([]float64, srcHidden)}
		counts := [2]int{}
		for step := 0; step < 6; step++ {
			rows := randVec(r, 3*srcHidden, 1)
			ids := []int32{10, 11, 12}
			if step%2 == 1 {
				ids[1] = eot
			}
			for row := 0; row < 3; row++ {
				if ids[row] == eot {
					continue
				}
				s := 0
				if row == 2 {
					s = 1
				}
				for c := 0; c < srcHidden; c++ {
					sums[s][c] += float64(rows[row*srcHidden+c])
				}
				counts[s]++
			}
			d, err := e.SRCStep([]*Seq{a, b}, F32Rows(rows), srcHidden, ids, []int32{0, 2, 3})
			must(t, err)
			for s := range d {
				mean := make([]float64, srcHidden)
				for c := range mean {
					mean[c] = sums[s][c] / float64(counts[s])
				}
				want := srcReference(head, mean, gelu)
				if !d[s].Scored || !closeTo(float64(d[s].Score), want, 1e-5) {
					t.Fatalf("gelu %d step %d seq %d: %+v, want score %v", gelu, step, s, d[s], want)
				}
				if math.Abs(float64(d[s].Threshold)-0.8) > 1e-6 || d[s].Reuse != (d[s].Score >= d[s].Threshold) ||
					d[s].Baseline {
					t.Fatalf("step %d seq %d: %+v", step, s, d[s])
				}
			}
		}
		m, err := e.Metrics()
		must(t, err)
		if m.SRCSteps != 12 {
			t.Fatalf("SRCSteps %d, want 12", m.SRCSteps)
		}
	}
}

func TestSRCHalfPrecisionAndUnscored(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	head := randomHead(r, 0)
	values := make([]float32, srcHidden)
	bf16 := make([]uint16, srcHidden)
	mean := make([]float64, srcHidden)
	for i := range values {
		values[i] = (float32(i) - 3) * 0.25 // exact in bf16
		bf16[i] = uint16(math.Float32bits(values[i]) >> 16)
		mean[i] = float64(values[i])
	}
	e := srcEngine(t, nil)
	must(t, e.SetSRCHead(head, GeluTanh))
	s := admit(t, e, []int32{1, 5, 6, 7, 8}, nil)
	empty := admit(t, e, []int32{3, 5, 6, 7, 8}, nil)
	d, err := e.SRCStep([]*Seq{s, empty}, BF16Rows(bf16), srcHidden, []int32{9}, []int32{0, 1, 1})
	must(t, err)
	if want := srcReference(head, mean, GeluTanh); !closeTo(float64(d[0].Score), want, 1e-5) {
		t.Fatalf("bf16 score %v, want %v", d[0].Score, want)
	}
	if d[1].Scored || d[1].Score != 0 || d[1].Reuse {
		t.Fatalf("a sequence with no rows: %+v", d[1])
	}
	m, err := e.Metrics()
	must(t, err)
	if m.SRCUnscoredSteps != 1 || m.SRCSteps != 1 {
		t.Fatalf("metrics %+v", m)
	}
}

func TestSRCHeadFromFileAndBreaker(t *testing.T) {
	r := rand.New(rand.NewSource(5))
	head := randomHead(r, 40) // every score is 1, above the breaker's 0.95
	path := writeSafetensors(t, []string{"src_head.b1", "src_head.b2", "src_head.w1", "src_head.w2"},
		[][]int{{srcInner}, {1}, {srcInner, srcHidden}, {srcInner}}, [][]float32{head.B1, {head.B2}, head.W1, head.W2})
	e := srcEngine(t, func(o *EngineOptions) { o.SRCDailyRequests = 1e6 }) // threshold 0.9
	must(t, e.LoadSRCHead(path, GeluTanh))
	wantCode(t, e.LoadSRCHead(filepath.Join(t.TempDir(), "missing.safetensors"), GeluTanh), IO)
	wantCode(t, e.LoadSRCHead("bad\x00path", GeluTanh), InvalidArgument)
	wantCode(t, e.LoadSRCHead(path, Gelu(7)), InvalidArgument)
	wantCode(t, e.LoadSRCHead(path, GeluFromFile), InvalidArgument) // the file does not say

	s := admit(t, e, []int32{1, 5, 6, 7, 8}, nil)
	row := make([]float32, srcHidden)
	for step := 0; step < 4; step++ {
		d, err := e.SRCStep([]*Seq{s}, F32Rows(row), srcHidden, []int32{9}, []int32{0, 1})
		must(t, err)
		if d[0].Score <= 0.95 || math.Abs(float64(d[0].Threshold)-0.9) > 1e-6 || d[0].Reuse != (step < 3) ||
			d[0].Baseline != (step >= 3) {
			t.Fatalf("step %d: %+v", step, d[0])
		}
		if d[0].Reuse {
			must(t, e.ReportRetrieval([]*Seq{s}, []bool{false}))
		}
	}
	m, err := e.Metrics()
	must(t, err)
	if m.SRCBreakerTrips != 1 || m.SRCBaselineSequences != 1 || m.SRCRetrievalsFailed != 3 || m.SRCReuseDecisions != 3 {
		t.Fatalf("metrics %+v", m)
	}
	wantCode(t, e.ReportRetrieval([]*Seq{s}, nil), InvalidArgument)
}

func TestSRCBadInput(t *testing.T) {
	r := rand.New(rand.NewSource(7))
	e := srcEngine(t, nil)
	s := admit(t, e, []int32{1, 5, 6, 7, 8}, nil)
	rows := randVec(r, srcHidden, 1)
	_, err := e.SRCStep([]*Seq{s}, F32Rows(rows), srcHidden, []int32{9}, []int32{0, 1})
	wantCode(t, err, FailedPrecondition) // no head

	head := randomHead(r, 0)
	short := head
	short.W1 = short.W1[1:]
	if e := wantCode(t, e.SetSRCHead(short, GeluErf), InvalidArgument); !strings.Contains(e.Message(), "W1") {
		t.Fatalf("message %q", e.Message())
	}
	odd := head
	odd.Hidden = 6
	wantCode(t, e.SetSRCHead(odd, GeluErf), InvalidArgument)
	nan := head
	nan.B1 = []float32{float32(math.NaN()), 0}
	wantCode(t, e.SetSRCHead(nan, GeluErf), InvalidArgument)
	must(t, e.SetSRCHead(head, GeluErf))

	bad := append([]float32(nil), rows...)
	bad[2] = float32(math.Inf(1))
	other := srcEngine(t, nil)
	foreign := admit(t, other, []int32{1, 2, 3}, nil)
	cases := map[string]func() error{
		"tokenIDs": func() error {
			_, err := e.SRCStep([]*Seq{s}, F32Rows(rows), srcHidden, []int32{9, 9}, []int32{0, 1})
			return err
		},
		"indptr length": func() error {
			_, err := e.SRCStep([]*Seq{s}, F32Rows(rows), srcHidden, []int32{9}, []int32{0})
			return err
		},
		"indptr end": func() error {
			_, err := e.SRCStep([]*Seq{s}, F32Rows(rows), srcHidden, []int32{9}, []int32{0, 2})
			return err
		},
		"rows": func() error {
			_, err := e.SRCStep([]*Seq{s}, F32Rows(rows[1:]), srcHidden, []int32{9}, []int32{0, 1})
			return err
		},
		"twice": func() error {
			_, err := e.SRCStep([]*Seq{s, s}, F32Rows(rows), srcHidden, []int32{9}, []int32{0, 1, 1})
			return err
		},
		"inf": func() error {
			_, err := e.SRCStep([]*Seq{s}, F32Rows(bad), srcHidden, []int32{9}, []int32{0, 1})
			return err
		},
		"foreign": func() error {
			_, err := e.SRCStep([]*Seq{foreign}, F32Rows(rows), srcHidden, []int32{9}, []int32{0, 1})
			return err
		},
		"nil seq": func() error {
			_, err := e.SRCStep([]*Seq{nil}, F32Rows(rows), srcHidden, []int32{9}, []int32{0, 1})
			return err
		},
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) { wantCode(t, f(), InvalidArgument) })
	}
	m, err := e.Metrics()
	must(t, err)
	if m.SRCSteps != 0 {
		t.Fatalf("failed steps were counted: %+v", m)
	}
	s.Close()
	_, err = e.SRCStep([]*Seq{s}, F32Rows(rows), srcHidden, []int32{9}, []int32{0, 1})
	wantCode(t, err, FailedPrecondition)
}

const (
	snapHidden = 6
	snapDim    = 2
)

func projection(r *rand.Rand) (mean, components []float32) {
	c := float32(1 / math.Sqrt2)
	return randVec(r, snapHidden, 0.5), []float32{c, c, 0, 0, 0, 0, 0, 0, c, -c, 0, 0}
}

func TestSnapshotsAndInjection(t *testing.T) {
	r := rand.New(rand.NewSource(8))
	e := srcEngine(t, nil)
	rows := randVec(r, 3*snapHidden, 2)
	_, err := e.MakeSnapshots(F32Rows(rows), snapHidden, snapDim)
	wantCode(t, err, FailedPrecondition)

	mean, components := projection(r)
	must(t, e.SetSnapshotProjection(snapHidden, snapDim, mean, components))
	snaps, err := e.MakeSnapshots(F32Rows(rows), snapHidden, snapDim)
	must(t, err)
	for row := 0; row < 3; row++ {
		want := make([]float64, snapDim)
		norm := 0.0
		for d := range want {
			for c := 0; c < snapHidden; c++ {
				want[d] += float64(components[d*snapHidden+c]) * float64(rows[row*snapHidden+c]-mean[c])
			}
			norm += want[d] * want[d]
		}
		for d := range want {
			if got := float64(snaps[row*snapDim+d]); !closeTo(got, want[d]/math.Sqrt(norm), 1e-5) {
				t.Fatalf("row %d dim %d: %v vs %v", row, d, got, want[d]/math.Sqrt(norm))
			}
		}
	}
	// The same projection from a file.
	path := writeSafetensors(t, []string{"snapshot.components", "snapshot.mean"}, [][]int{{snapDim, snapHidden}, {snapHidden}},
		[][]float32{components, mean})
	f := srcEngine(t, nil)
	must(t, f.LoadSnapshotProjection(path))
	again, err := f.MakeSnapshots(F32Rows(rows), snapHidden, snapDim)
	must(t, err)
	if fmt.Sprint(again) != fmt.Sprint(snaps) {
		t.Fatalf("from a file: %v vs %v", again, snaps)
	}
	wantCode(t, e.SetSnapshotProjection(snapHidden, snapDim, mean[1:], components), InvalidArgument)
	doubled := make([]float32, len(components))
	for i, v := range components {
		doubled[i] = 2 * v
	}
	wantCode(t, e.SetSnapshotProjection(snapHidden, snapDim, mean, doubled), InvalidArgument) // not orthonormal
	_, err = e.MakeSnapshots(F32Rows(rows[1:]), snapHidden, snapDim)
	wantCode(t, err, InvalidArgument)
	_, err = e.MakeSnapshots(F32Rows(rows), snapHidden, 3)
	wantCode(t, err, InvalidArgument) // the projection's snapshot_dim is 2

	// Injection: a gets it (rows 0-1), b does not (apply false).
	weight, bias := randVec(r, snapHidden*snapDim, 1), randVec(r, snapHidden, 1)
	a := admit(t, e, []int32{1, 5, 6, 7, 8}, nil)
	b := admit(t, e, []int32{3, 5, 6, 7, 8}, nil)
	states := randVec(r, 3*snapHidden, 1)
	hs := append([]float32(nil), states...)
	seqs, indptr, snapshots := []*Seq{a, b}, []int32{0, 2, 3}, randVec(r, 2*snapDim, 1)
	wantCode(t, e.InjectSnapshots(F32Rows(hs), snapHidden, seqs, indptr, snapshots, snapDim, []bool{true, true}, 3),
		FailedPrecondition)
	opts, err := DefaultAdapterOptions()
	must(t, err)
	opts.NumLayers, opts.ResidualScale = 4, 0.5 // injects at 1, 2, 3
	must(t, e.SetSnapshotAdapter(snapDim, snapHidden, weight, bias, opts))
	must(t, e.InjectSnapshots(F32Rows(hs), snapHidden, seqs, indptr, snapshots, snapDim, []bool{true, false}, 3))
	for row := 0; row < 3; row++ {
		for c := 0; c < snapHidden; c++ {
			want := float64(states[row*snapHidden+c])
			if row < 2 {
				ws := float64(bias[c])
				for d := 0; d < snapDim; d++ {
					ws += float64(weight[c*snapDim+d]) * float64(snapshots[d])
				}
				want += 0.5 * ws
			}
			if got := float64(hs[row*snapHidden+c]); !closeTo(got, want, 1e-5) {
				t.Fatalf("row %d col %d: %v vs %v", row, c, got, want)
			}
		}
	}
	m, err := e.Metrics()
	must(t, err)
	if m.SRCInjections != 1 {
		t.Fatalf("SRCInjections %d, want 1", m.SRCInjections)
	}
	// Layer 0 does not inject.
	untouched := append([]float32(nil), states...)
	must(t, e.InjectSnapshots(F32Rows(untouched), snapHidden, seqs, indptr, snapshots, snapDim, []bool{true, true}, 0))
	if fmt.Sprint(untouched) != fmt.Sprint(states) {
		t.Fatal("layer 0 injected")
	}
	// From a file, at layer 0 only.
	apath := writeSafetensors(t, []string{"adapter.bias", "adapter.weight"}, [][]int{{snapHidden}, {snapHidden, snapDim}},
		[][]float32{bias, weight})
	opts.Layers, opts.ResidualScale = []int32{0}, 1
	must(t, e.LoadSnapshotAdapter(apath, opts))
	one := append([]float32(nil), states[:snapHidden]...)
	must(t, e.InjectSnapshots(F32Rows(one), snapHidden, []*Seq{b}, []int32{0, 1}, snapshots[:snapDim], snapDim,
		[]bool{true}, 0))
	for c := 0; c < snapHidden; c++ {
		want := float64(states[c]) + float64(bias[c])
		for d := 0; d < snapDim; d++ {
			want += float64(weight[c*snapDim+d]) * float64(snapshots[d])
		}
		if !closeTo(float64(one[c]), want, 1e-5) {
			t.Fatalf("col %d: %v vs %v", c, one[c], want)
		}
	}

	// Bad input never writes.
	hs = append([]float32(nil), states...)
	apply := []bool{true, true}
	nan := append([]float32(nil), snapshots...)
	nan[0] = float32(math.NaN())
	for name, err := range map[string]error{
		"snapshots": e.InjectSnapshots(F32Rows(hs), snapHidden, seqs, indptr, snapshots[1:], snapDim, apply, 0),
		"apply":     e.InjectSnapshots(F32Rows(hs), snapHidden, seqs, indptr, snapshots, snapDim, apply[:1], 0),
		"indptr":    e.InjectSnapshots(F32Rows(hs), snapHidden, seqs, []int32{0, 3}, snapshots, snapDim, apply, 0),
		"order":     e.InjectSnapshots(F32Rows(hs), snapHidden, seqs, []int32{0, 3, 2}, snapshots, snapDim, apply, 0),
		"layer":     e.InjectSnapshots(F32Rows(hs), snapHidden, seqs, indptr, snapshots, snapDim, apply, 9),
		"nan":       e.InjectSnapshots(F32Rows(hs), snapHidden, seqs, indptr, nan, snapDim, apply, 0),
		"weight":    e.SetSnapshotAdapter(snapDim, snapHidden, weight[1:], bias, opts),
		"layers":    e.SetSnapshotAdapter(snapDim, snapHidden, weight, bias, AdapterOptions{NumLayers: 4, Layers: []int32{7}}),
		"no layers": e.SetSnapshotAdapter(snapDim, snapHidden, weight, bias, AdapterOptions{ResidualScale: 1}),
	} {
		t.Run(name, func(t *testing.T) { wantCode(t, err, InvalidArgument) })
	}
	if fmt.Sprint(hs) != fmt.Sprint(states) {
		t.Fatal("a failed injection wrote to the hidden states")
	}
	wantCode(t, e.LoadSnapshotAdapter(filepath.Join(t.TempDir(), "missing"), opts), IO)
	wantCode(t, e.LoadSnapshotProjection(filepath.Join(t.TempDir(), "missing")), IO)
}

package clm

import (
	"math"
	"math/rand"
	"strings"
	"testing"
)

// The snapshot store through the real library: record then lookup against an
// independent float64 normalisation (the store keeps f16), suffix keys of
// paraphrases, the three levels, tenant isolation (salt and adapter id), the
// apply flags feeding InjectSnapshots, outcome reports, the version-3 options
// and metrics, and bad input.

const storeDim = 16

func fnv1a(s string) uint64 {
	h := uint64(0xcbf29ce484222325)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 0x100000001b3
	}
	return h
}

func unit64(v []float32) []float64 {
	norm := 0.0
	for _, x := range v {
		norm += float64(x) * float64(x)
	}
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x) / math.Sqrt(norm)
	}
	return out
}

func maxError(served []float32, want []float64) float64 {
	e := 0.0
	for i := range want {
		e = math.Max(e, math.Abs(float64(served[i])-want[i]))
	}
	return e
}

func cosine64(a, b []float32) float64 {
	var ab, aa, bb float64
	for i := range a {
		ab += float64(a[i]) * float64(b[i])
		aa += float64(a[i]) * float64(a[i])
		bb += float64(b[i]) * float64(b[i])
	}
	return ab / math.Sqrt(aa*bb)
}

func storeEngine(t *testing.T, edit func(*EngineOptions)) *Engine {
	t.Helper()
	opts, err := DefaultEngineOptions()
	must(t, err)
	opts.NumPages, opts.PageSize, opts.Memory = 64, 4, MemoryNone
	opts.SnapshotStorePath = ":memory:"
	opts.SnapshotStoreShards = 2
	opts.SnapshotDim = storeDim
	opts.SnapshotMinUsage = 1
	opts.SnapshotSimilarityFloor = 0.5
	opts.SnapshotLookupTimeoutUS = 2_000_000 // no busy misses (level 2 included) on a loaded machine
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

func lookupOne(t *testing.T, e *Engine, s *Seq, suffix Suffix, query []float32) SnapshotLookup {
	t.Helper()
	r, err := e.LookupSnapshots([]*Seq{s}, []Suffix{suffix}, query)
	must(t, err)
	if len(r.Hits) != 1 || len(r.Snapshots) != storeDim || len(r.Apply) != 1 {
		t.Fatalf("lookup shapes: %d hits, %d floats, %d flags", len(r.Hits), len(r.Snapshots), len(r.Apply))
	}
	return r
}

func wantMiss(t *testing.T, r SnapshotLookup) {
	t.Helper()
	h := r.Hits[0]
	if h.Level != SnapshotMiss || r.Apply[0] || h.Key != "" || h.Fingerprint != 0 {
		t.Fatalf("want a miss, got %+v (apply %v)", h, r.Apply[0])
	}
	for _, x := range r.Snapshots {
		if x != 0 {
			t.Fatalf("a miss's snapshot is not zero: %v", r.Snapshots)
		}
	}
}

func TestVersion3Defaults(t *testing.T) {
	opts, err := DefaultEngineOptions()
	must(t, err)
	if opts.SnapshotStorePath != "" || opts.SnapshotStoreShards != 16 || opts.SnapshotDim != 256 ||
		opts.SnapshotMinUsage != 50 || opts.SnapshotVersionCosine != 0.95 || opts.SnapshotSimilarityFloor != 0.8 ||
		opts.SnapshotANNEfSearch != 128 || opts.SnapshotLookupTimeoutUS != 2000 {
		t.Fatalf("version-3 defaults differ from clm.h: %+v", opts)
	}
	opts.NumPages = 8
	e, err := NewEngine(opts) // no path: no store
	must(t, err)
	defer e.Close()
	m, err := e.Metrics()
	must(t, err)
	if m.HasSnapshotStore || e.SnapshotDim() != 0 {
		t.Fatalf("an engine without a path has a store: %+v", m)
	}
}

func TestStoreLevelsTenantsAndMetrics(t *testing.T) {
	r := rand.New(rand.NewSource(21))
	e := storeEngine(t, nil)
	if e.SnapshotDim() != storeDim {
		t.Fatalf("SnapshotDim %d", e.SnapshotDim())
	}
	a := admit(t, e, []int32{1, 2, 3, 4, 5}, &AdmitOptions{CacheSalt: "tenant-a"})
	b := admit(t, e, []int32{1, 2, 3, 4, 5}, &AdmitOptions{CacheSalt: "tenant-b"})
	a7 := admit(t, e, []int32{1, 2, 3, 4, 5}, &AdmitOptions{CacheSalt: "tenant-a", AdapterID: 7})

	// Level 1: a host key; the f16 round trip within 1e-3 of float64.
	v := randVec(r, storeDim, 3)
	key := KeySuffix("ORDER-1", "g1")
	rec, err := e.RecordSnapshot(a, key, v)
	must(t, err)
	if rec.Result != RecordAdmitted || rec.Version != 1 {
		t.Fatalf("record: %+v", rec)
	}
	got := lookupOne(t, e, a, key, nil)
	h := got.Hits[0]
	if h.Level != SnapshotExact || h.Version != 1 || h.Stable || h.Similarity != 1 || h.Key != "ORDER-1" ||
		h.KeyLen != 7 || h.KeyTruncated || h.Fingerprint != fnv1a("ORDER-1") || !got.Apply[0] {
		t.Fatalf("level 1: %+v", h)
	}
	if d := maxError(got.Snapshots, unit64(v)); d > 1e-3 {
		t.Fatalf("served snapshot off by %g", d)
	}
	half := make([]float32, storeDim)
	for i := range v {
		half[i] = v[i] / 2
	}
	rec, err = e.RecordSnapshot(a, key, half)
	must(t, err)
	if rec.Result != RecordConfirmed || !lookupOne(t, e, a, key, nil).Hits[0].Stable {
		t.Fatalf("a confirmation does not make version 1 stable: %+v", rec)
	}

	// Text: paraphrases share a key; record one, find it by the other.
	k1, fp1, err := e.SuffixKey("Please check the status of order 789")
	must(t, err)
	k2, fp2, err := e.SuffixKey("What's the status of order #789?")
	must(t, err)
	if k1 != "QUERY-ORDER-789-STATUS" || k2 != k1 || fp1 != fnv1a(k1) || fp2 != fp1 {
		t.Fatalf("keys %q %q, fingerprints %x %x", k1, k2, fp1, fp2)
	}
	if k, _, err := e.SuffixKey("Don't check order 789"); err != nil || k == k1 {
		t.Fatalf("the opposite question: %q, %v", k, err)
	}
	w := randVec(r, storeDim, 1)
	_, err = e.RecordSnapshot(a, TextSuffix("Please check the status of order 789"), w)
	must(t, err)
	got = lookupOne(t, e, a, TextSuffix("What's the status of order #789?"), nil)
	if got.Hits[0].Level != SnapshotExact || got.Hits[0].Key != k1 || maxError(got.Snapshots, unit64(w)) > 1e-3 {
		t.Fatalf("text lookup: %+v", got.Hits[0])
	}
	// A text whose key abstains ("cancel it": cancel what?) is neither stored nor counted.
	if rec, err := e.RecordSnapshot(a, TextSuffix("cancel it"), w); err != nil || rec.Result != RecordAbstained || rec.Version != 0 {
		t.Fatalf("an abstained text: %+v, %v", rec, err)
	}

	// Level 2: a neighbour of the same group.
	near := randVec(r, storeDim, 1)
	_, err = e.RecordSnapshot(a, KeySuffix("K-NEAR", "grp"), near)
	must(t, err)
	query := make([]float32, storeDim)
	for i := range near {
		query[i] = near[i] + (2*r.Float32()-1)*0.02
	}
	got = lookupOne(t, e, a, KeySuffix("K-QUERY", "grp"), query)
	h = got.Hits[0]
	if h.Level != SnapshotANN || h.Key != "K-NEAR" || h.Version != 1 || h.Fingerprint != fnv1a("K-NEAR") ||
		math.Abs(float64(h.Similarity)-cosine64(query, near)) > 2e-3 || maxError(got.Snapshots, unit64(near)) > 1e-3 {
		t.Fatalf("level 2: %+v", h)
	}
	wantMiss(t, lookupOne(t, e, a, KeySuffix("K-QUERY", "other"), query))
	wantMiss(t, lookupOne(t, e, a, KeySuffix("K-QUERY", "grp"), nil))

	// Level 3: a greeting's fallback for tenant A only.
	if k, _, err := e.SuffixKey("Hi there"); err != nil || k != "GREETING" {
		t.Fatalf("greeting key %q, %v", k, err)
	}
	wantMiss(t, lookupOne(t, e, a, TextSuffix("Hi there"), nil))
	greeting := randVec(r, storeDim, 2)
	must(t, e.SetFallbackSnapshot("tenant-a", 0, "GREETING", greeting))
	got = lookupOne(t, e, a, TextSuffix("Hi there"), nil)
	if got.Hits[0].Level != SnapshotFallback || got.Hits[0].Key != "GREETING" ||
		maxError(got.Snapshots, unit64(greeting)) > 1e-3 {
		t.Fatalf("level 3: %+v", got.Hits[0])
	}

	// Tenants: B and A-under-adapter-7 see nothing of A's at any level.
	for _, stranger := range []*Seq{b, a7} {
		wantMiss(t, lookupOne(t, e, stranger, key, query))
		wantMiss(t, lookupOne(t, e, stranger, TextSuffix("What's the status of order #789?"), query))
		wantMiss(t, lookupOne(t, e, stranger, KeySuffix("K-QUERY", "grp"), query))
		wantMiss(t, lookupOne(t, e, stranger, TextSuffix("Hi there"), query))
	}
	must(t, e.SetFallbackSnapshot("tenant-a", 7, "*", greeting))
	if lvl := lookupOne(t, e, a7, TextSuffix("thanks!"), nil).Hits[0].Level; lvl != SnapshotFallback {
		t.Fatalf("a7's fallback: level %d", lvl)
	}
	wantMiss(t, lookupOne(t, e, b, TextSuffix("thanks!"), nil))

	// A batch: the apply flags feed InjectSnapshots.
	const hidden = 8
	weight, bias := randVec(r, hidden*storeDim, 1), randVec(r, hidden, 1)
	ao, err := DefaultAdapterOptions()
	must(t, err)
	ao.NumLayers, ao.Layers, ao.ResidualScale = 1, []int32{0}, 0.5
	must(t, e.SetSnapshotAdapter(storeDim, hidden, weight, bias, ao))
	batch, err := e.LookupSnapshots([]*Seq{a, b}, []Suffix{key, key}, nil)
	must(t, err)
	if batch.Hits[0].Level != SnapshotExact || batch.Hits[1].Level != SnapshotMiss || !batch.Apply[0] ||
		batch.Apply[1] {
		t.Fatalf("batch: %+v %v", batch.Hits, batch.Apply)
	}
	hs := randVec(r, 2*hidden, 1)
	before := append([]float32(nil), hs...)
	must(t, e.InjectSnapshots(F32Rows(hs), hidden, []*Seq{a, b}, []int32{0, 1, 2}, batch.Snapshots, storeDim,
		batch.Apply, 0))
	for ch := 0; ch < hidden; ch++ {
		delta := float64(bias[ch])
		for k := 0; k < storeDim; k++ {
			delta += float64(weight[ch*storeDim+k]) * float64(batch.Snapshots[k])
		}
		want := float64(before[ch]) + 0.5*delta
		if !closeTo(float64(hs[ch]), want, 1e-5) || hs[hidden+ch] != before[hidden+ch] {
			t.Fatalf("channel %d: %g, want %g (b: %g, was %g)", ch, hs[ch], want, hs[hidden+ch], before[hidden+ch])
		}
	}

	// Outcomes: a was served, b was not.
	must(t, e.ReportSnapshotOutcome([]*Seq{a}, []bool{true}))
	wantCode(t, e.ReportSnapshotOutcome([]*Seq{b}, []bool{true}), FailedPrecondition)
	must(t, e.FlushSnapshotStore())
	if n, err := e.EvictSnapshots(); err != nil || n != 0 {
		t.Fatalf("evict: %d, %v", n, err)
	}

	// Level 1 x4 (ORDER-1 x2, the text, the batch's a), level 2 x1, level 3
	// x2 (a's greeting, a7's "*"); misses: 3 of a's (another group, no query,
	// the greeting before its fallback), 8 of the strangers, b's "thanks!",
	// the batch's b. Records: 4 stored or confirmed, and the abstained "cancel it".
	m, err := e.Metrics()
	must(t, err)
	if !m.HasSnapshotStore || m.StoreHitsExact != 4 || m.StoreHitsANN != 1 || m.StoreHitsFallback != 2 ||
		m.StoreMisses != 13 || m.StoreLookups != 20 || m.StoreRecords != 5 || m.StoreAdmissions != 3 ||
		m.StoreConfirmations != 1 || m.StoreCounted != 0 || m.StoreSnapshots != 3 || m.StoreOutcomeReports != 1 ||
		m.SRCRetrievalsFound != 7 || m.SRCRetrievalsFailed != 13 {
		t.Fatalf("metrics: %+v", m)
	}
}

func TestStoreBadInput(t *testing.T) {
	r := rand.New(rand.NewSource(22))
	e := storeEngine(t, nil)
	a := admit(t, e, []int32{1, 2, 3, 4, 5}, &AdmitOptions{CacheSalt: "a"})
	b := admit(t, e, []int32{1, 2, 3, 4, 5}, &AdmitOptions{CacheSalt: "b"})
	v := randVec(r, storeDim, 1)
	key := KeySuffix("K", "")
	_, err := e.RecordSnapshot(a, key, v)
	must(t, err)
	before, err := e.Metrics()
	must(t, err)
	lookupErr := func(seqs []*Seq, suffixes []Suffix, queries []float32) error {
		_, err := e.LookupSnapshots(seqs, suffixes, queries)
		return err
	}

	// Lengths, checked in Go.
	wantCode(t, lookupErr([]*Seq{a, b}, []Suffix{key}, nil), InvalidArgument)
	wantCode(t, lookupErr([]*Seq{a}, []Suffix{key}, v[:storeDim-1]), InvalidArgument)
	err = lookupErr([]*Seq{a, b}, []Suffix{key, TextSuffix("hi")}, nil)
	if got := wantCode(t, err, InvalidArgument); !strings.Contains(got.Message(), "mix") {
		t.Fatalf("mixed kinds: %v", err)
	}
	_, err = e.RecordSnapshot(a, key, v[1:])
	wantCode(t, err, InvalidArgument)
	wantCode(t, e.ReportSnapshotOutcome([]*Seq{a}, nil), InvalidArgument)
	wantCode(t, e.SetFallbackSnapshot("a", 0, "GREETING", v[1:]), InvalidArgument)
	wantCode(t, lookupErr([]*Seq{nil}, []Suffix{key}, nil), InvalidArgument)

	// Values, checked by the library: nothing was looked up or stored.
	nan := append([]float32(nil), v...)
	nan[3] = float32(math.NaN())
	queries := append(append([]float32(nil), v...), nan...)
	wantCode(t, lookupErr([]*Seq{a, b}, []Suffix{key, key}, queries), InvalidArgument)
	wantCode(t, lookupErr([]*Seq{a, a}, []Suffix{key, key}, nil), InvalidArgument)
	wantCode(t, lookupErr([]*Seq{a, b}, []Suffix{key, KeySuffix("not printable\n", "")}, nil), InvalidArgument)
	wantCode(t, lookupErr([]*Seq{a}, []Suffix{TextSuffix("")}, nil), InvalidArgument)
	wantCode(t, lookupErr([]*Seq{a}, []Suffix{{Kind: 5, Text: "K"}}, nil), InvalidArgument)
	wantCode(t, lookupErr([]*Seq{a}, []Suffix{{Kind: SuffixText, Text: "hello", Group: "g"}}, nil), InvalidArgument)
	_, err = e.RecordSnapshot(a, key, nan)
	wantCode(t, err, InvalidArgument)
	_, err = e.RecordSnapshot(a, key, make([]float32, storeDim))
	wantCode(t, err, InvalidArgument)
	_, _, err = e.SuffixKey("")
	wantCode(t, err, InvalidArgument)
	wantCode(t, e.SetFallbackSnapshot("a", 0, "", v), InvalidArgument)
	after, err := e.Metrics()
	must(t, err)
	if after.StoreLookups != before.StoreLookups || after.StoreRecords != before.StoreRecords ||
		after.SRCRetrievalsFound+after.SRCRetrievalsFailed != 0 {
		t.Fatalf("a refused call changed the metrics: %+v", after)
	}

	// A sequence of another engine, an ended one, a closed one.
	other := storeEngine(t, nil)
	foreign := admit(t, other, []int32{1, 2, 3, 4, 5}, &AdmitOptions{CacheSalt: "a"})
	wantCode(t, lookupErr([]*Seq{foreign}, []Suffix{key}, nil), InvalidArgument)
	ended := admit(t, e, []int32{1, 2, 3, 4, 5}, &AdmitOptions{CacheSalt: "a"})
	must(t, ended.Finish())
	wantCode(t, lookupErr([]*Seq{ended}, []Suffix{key}, nil), FailedPrecondition)
	_, err = e.RecordSnapshot(ended, key, v)
	wantCode(t, err, FailedPrecondition)
	ended.Close()
	_, err = e.RecordSnapshot(ended, key, v)
	wantCode(t, err, FailedPrecondition)

	// Bad store options, refused at creation.
	for name, edit := range map[string]func(*EngineOptions){
		"dim 0":        func(o *EngineOptions) { o.SnapshotDim = 0 },
		"300 shards":   func(o *EngineOptions) { o.SnapshotStoreShards = 300 },
		"min usage 0":  func(o *EngineOptions) { o.SnapshotMinUsage = 0 },
		"cosine 0":     func(o *EngineOptions) { o.SnapshotVersionCosine = 0 },
		"floor 2":      func(o *EngineOptions) { o.SnapshotSimilarityFloor = 2 },
		"NUL in path":  func(o *EngineOptions) { o.SnapshotStorePath = "bad\x00path" },
		"ef_search -1": func(o *EngineOptions) { o.SnapshotANNEfSearch = -1 },
	} {
		opts, _ := DefaultEngineOptions()
		opts.NumPages, opts.Memory = 8, MemoryNone
		opts.SnapshotStorePath = ":memory:"
		edit(&opts)
		_, err := NewEngine(opts)
		t.Logf("%s: %v", name, err)
		wantCode(t, err, InvalidArgument)
	}
	opts, _ := DefaultEngineOptions()
	opts.NumPages, opts.Memory, opts.SnapshotStorePath = 8, MemoryNone, "/dev/null/store"
	_, err = NewEngine(opts)
	wantCode(t, err, IO)

	// An engine without a store.
	plain := storeEngine(t, func(o *EngineOptions) { o.SnapshotStorePath = "" })
	p := admit(t, plain, []int32{1, 2, 3, 4, 5}, nil)
	_, err = plain.LookupSnapshots([]*Seq{p}, []Suffix{key}, v)
	wantCode(t, err, FailedPrecondition)
	_, err = plain.RecordSnapshot(p, key, v)
	wantCode(t, err, FailedPrecondition)
	wantCode(t, plain.ReportSnapshotOutcome([]*Seq{p}, []bool{true}), FailedPrecondition)
	_, _, err = plain.SuffixKey("hello")
	wantCode(t, err, FailedPrecondition)
	wantCode(t, plain.SetFallbackSnapshot("a", 0, "*", v), FailedPrecondition)
	wantCode(t, plain.FlushSnapshotStore(), FailedPrecondition)
	_, err = plain.EvictSnapshots()
	wantCode(t, err, FailedPrecondition)

	// A closed engine.
	closed := storeEngine(t, nil)
	closed.Close()
	_, _, err = closed.SuffixKey("hello")
	wantCode(t, err, FailedPrecondition)
	wantCode(t, closed.FlushSnapshotStore(), FailedPrecondition)
}

func TestSuffixKeyGrowsItsBuffer(t *testing.T) {
	// SuffixKey starts with 64 bytes and retries with the size the library asks for.
	e := storeEngine(t, nil)
	k, fp, err := e.SuffixKey("Check the status and delivery date and billing address and payment method and " +
		"balance and fees and price and policy and reason and quantity and history of order 789")
	must(t, err)
	if !strings.HasPrefix(k, "QUERY-") || !strings.Contains(k, "ORDER") || !strings.Contains(k, "-789-") ||
		len(k) <= 64 || fp != fnv1a(k) {
		t.Fatalf("key %q (%d bytes), fingerprint %x", k, len(k), fp)
	}
}

package clm

import (
	"errors"
	"math/rand"
	"os"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// The tiered KV cache through the real library: a host tier that loads
// evicted pages back byte for byte, a file:// storage tier shared by engines
// one after another (prefetched, and fetched at admission), tenant isolation
// by salt, the version-4 options and metrics, and bad input.
//
// Every K/V float a test writes is a function of (salt, tokens[:t+1],
// element), so a cached row is checked against a value computed here,
// independently of the library. Prompts are random per run (the seed is
// logged); storage lives in t.TempDir().

const (
	tierPage    = 4
	tierLayers  = 2
	tierKVHeads = 1
	tierHeadDim = 4
	tierRow     = tierKVHeads * tierHeadDim // floats per token per layer, K or V
)

// tierRand is a generator with a fresh seed, logged for a rerun.
func tierRand(t *testing.T) *rand.Rand {
	t.Helper()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	return rand.New(rand.NewSource(seed))
}

func randomPrompt(r *rand.Rand, n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(r.Intn(50000))
	}
	return p
}

// tierReference is the value of float element of token t's K/V (all layers,
// K then V): FNV-1a over the salt and prompt[:t+1], mixed with the element.
func tierReference(salt string, prompt []int32, t, element int) float32 {
	h := uint64(0xcbf29ce484222325)
	for i := 0; i < len(salt); i++ {
		h = (h ^ uint64(salt[i])) * 0x100000001b3
	}
	for _, token := range prompt[:t+1] {
		h = (h ^ uint64(uint32(token))) * 0x100000001b3
	}
	h ^= uint64(element) * 0x9E3779B97F4A7C15
	h ^= h >> 31
	return float32(h % 65536)
}

// tierElement is the index of float e of a token's row in layer, K (half 0) or V (1).
func tierElement(layer, half, e int) int { return (layer*2+half)*tierRow + e }

// tierOptions: small f32 pages on the host, a host tier and maybe storage,
// the write-through policy (a page's first hit gives it its host copy), and
// admissions that wait for every page storage has.
func tierOptions(t *testing.T, numPages, hostPages int32, storageURL string) EngineOptions {
	t.Helper()
	opts, err := DefaultEngineOptions()
	must(t, err)
	opts.NumPages, opts.PageSize = numPages, tierPage
	opts.NumLayers, opts.KVHeads, opts.HeadDim = tierLayers, tierKVHeads, tierHeadDim
	opts.KVDType, opts.Memory = KVF32, MemoryHost
	opts.HostPages = hostPages
	opts.WritePolicy = WriteThrough
	opts.StorageURL = storageURL
	opts.PrefetchPolicy = PrefetchWaitComplete
	opts.ModelID = "go-test-model"
	return opts
}

func tierEngine(t *testing.T, numPages, hostPages int32, storageURL string) *Engine {
	t.Helper()
	e, err := NewEngine(tierOptions(t, numPages, hostPages, storageURL))
	if err != nil {
		t.Fatalf("NewEngine: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func metricsOf(t *testing.T, e *Engine) Metrics {
	t.Helper()
	m, err := e.Metrics()
	must(t, err)
	return m
}

// served is what one admission found.
type served struct{ cached, host, storage int }

// serve admits prompt under salt, checks every float of the cached part
// against tierReference (read back with GatherPages and decoded with the
// engine's KVLayout), writes the reference K/V of the rest at the sequence's
// slots with WriteKV, and finishes.
func serve(t *testing.T, e *Engine, salt string, prompt []int32) served {
	t.Helper()
	layout, err := e.KVLayout()
	must(t, err)
	if layout.KVDType != KVF32 || layout.PageSize != tierPage {
		t.Fatalf("layout %+v", layout)
	}
	s, err := e.Admit(prompt, &AdmitOptions{CacheSalt: salt})
	must(t, err)
	defer s.Close()
	var got served
	for _, f := range []struct {
		get func() (int32, error)
		to  *int
	}{{s.CachedTokens, &got.cached}, {s.HostTokens, &got.host}, {s.StorageTokens, &got.storage}} {
		n, err := f.get()
		must(t, err)
		*f.to = int(n)
	}
	if got.storage > got.host || got.host > got.cached {
		t.Fatalf("admission %+v", got)
	}

	// The cached rows, as the pool holds them.
	pages, err := s.PageTable()
	must(t, err)
	cachedPages := (got.cached + tierPage - 1) / tierPage
	buf, err := e.GatherPages(pages[:cachedPages])
	must(t, err)
	wrong := 0
	if len(buf) > 0 {
		// The pool's floats, native-endian, as GatherPages copied them.
		floats := unsafe.Slice((*float32)(unsafe.Pointer(&buf[0])), len(buf)/4)
		for tok := 0; tok < got.cached; tok++ {
			for layer := 0; layer < tierLayers; layer++ {
				for half := 0; half < 2; half++ {
					rows := (uint64(tok/tierPage)*layout.PageBytes + uint64(layer)*layout.LayerBytes +
						uint64(half)*layout.LayerBytes/2) / 4
					for el := 0; el < tierRow; el++ {
						have := floats[rows+uint64((tok%tierPage)*tierRow+el)]
						want := tierReference(salt, prompt, tok, tierElement(layer, half, el))
						if have != want {
							if wrong == 0 {
								t.Errorf("token %d layer %d half %d element %d: %v, want %v", tok, layer, half, el,
									have, want)
							}
							wrong++
						}
					}
				}
			}
		}
	}
	if wrong > 0 {
		t.Fatalf("%d cached floats differ from the reference", wrong)
	}

	// The new rows: prompt[cached:].
	slots, err := s.Slots()
	must(t, err)
	if len(slots) != len(prompt)-got.cached {
		t.Fatalf("%d slots for %d new tokens", len(slots), len(prompt)-got.cached)
	}
	for layer := 0; layer < tierLayers; layer++ {
		var k, v []float32
		for i := range slots {
			for el := 0; el < tierRow; el++ {
				k = append(k, tierReference(salt, prompt, got.cached+i, tierElement(layer, 0, el)))
				v = append(v, tierReference(salt, prompt, got.cached+i, tierElement(layer, 1, el)))
			}
		}
		must(t, e.WriteKV(int32(layer), slots, k, v))
	}
	must(t, s.Finish())
	return got
}

func TestTierDefaults(t *testing.T) {
	d, err := DefaultEngineOptions()
	must(t, err)
	if d.HostPages != 0 || d.WritePolicy != WriteThrough || d.StorageURL != "" ||
		d.PrefetchPolicy != PrefetchTimeout || d.PrefetchTimeoutMS != 20 || d.PrefetchTimeoutPer1KTokensMS != 10 ||
		d.StorageWorkers != 2 || d.StorageBatchPages != 32 || d.MaxQueuedFetches != 64 || d.BreakerFailures != 3 ||
		d.AdmissionDeadlineMS != 2000 || d.BreakerOpenMS != 5000 || d.ModelID != "" {
		t.Fatalf("tier defaults differ from clm.h's documentation: %+v", d)
	}
	if WriteThrough != 0 || WriteThroughSelective != 1 || WriteBack != 2 || PrefetchBestEffort != 0 ||
		PrefetchWaitComplete != 1 || PrefetchTimeout != 2 {
		t.Fatal("policy constants differ from clm.h")
	}
	d.NumPages = 8
	e, err := NewEngine(d)
	must(t, err)
	defer e.Close()
	if m := metricsOf(t, e); m.HasTiers || m.HasStorage || m.HostPagesTotal != 0 {
		t.Fatalf("an engine without tiers: %+v", m)
	}
	must(t, e.WaitForTiers()) // nothing to wait for
}

func TestHostTierLoadsEvictedPagesBackExactly(t *testing.T) {
	r := tierRand(t)
	// 16 device pages hold 64 tokens: one 41-token prompt (11 pages) at a time.
	e := tierEngine(t, 16, 64, "")
	a := randomPrompt(r, 41)
	if got := serve(t, e, "t", a); got.cached != 0 {
		t.Fatalf("first admission %+v", got)
	}
	// The hit: a's pages get their host copies (write-through).
	if got := serve(t, e, "t", a); got != (served{cached: 40}) {
		t.Fatalf("second admission %+v", got)
	}
	must(t, e.WaitForTiers())
	for i := 0; i < 4; i++ {
		serve(t, e, "t", randomPrompt(r, 41)) // evicts a from the device
	}
	again := serve(t, e, "t", a) // checks every cached float
	if again.cached != 40 || again.host == 0 || again.storage != 0 {
		t.Fatalf("after eviction: %+v, want 40 cached, some from the host tier", again)
	}
	must(t, e.WaitForTiers())

	m := metricsOf(t, e)
	if !m.HasTiers || m.HasStorage {
		t.Fatalf("HasTiers %v, HasStorage %v", m.HasTiers, m.HasStorage)
	}
	if m.HostHitTokens != uint64(again.host) || m.LoadedPages*tierPage != m.HostHitTokens || m.LoadBacks != 1 {
		t.Fatalf("host hits %d (sequence: %d), loaded pages %d, load-backs %d", m.HostHitTokens, again.host,
			m.LoadedPages, m.LoadBacks)
	}
	if m.StorageHitTokens != 0 || m.StoredPages != 0 || m.FetchedPages != 0 {
		t.Fatalf("storage counters without storage: %+v", m)
	}
	if m.BackedUpPages < 10 || m.HostPagesTotal != 64 || m.HostPagesUsed == 0 ||
		m.HostCachedTokens != m.HostPagesUsed*tierPage {
		t.Fatalf("host tier: backed up %d, pages %d/%d, tokens %d", m.BackedUpPages, m.HostPagesUsed,
			m.HostPagesTotal, m.HostCachedTokens)
	}

	// Another tenant shares nothing, at any tier.
	if got := serve(t, e, "u", a); got != (served{}) {
		t.Fatalf("another salt: %+v", got)
	}
	// Without a storage tier there is nothing to prefetch from.
	wantCode(t, e.Prefetch(a, &AdmitOptions{CacheSalt: "t"}), FailedPrecondition)
}

func TestStorageDirectorySharedByEnginesInTurn(t *testing.T) {
	r := tierRand(t)
	dir := t.TempDir()
	url := "file://" + dir
	p := randomPrompt(r, 57) // 14 whole pages: 56 tokens can come from storage
	const whole = 56
	func() {
		first := tierEngine(t, 64, 64, url)
		defer first.Close()
		serve(t, first, "acme", p)
		serve(t, first, "acme", p) // the hit: host copies, then stored copies
		must(t, first.WaitForTiers())
		if m := metricsOf(t, first); !m.HasTiers || !m.HasStorage || m.StoredPages != whole/tierPage {
			t.Fatalf("first engine: tiers %v, storage %v, stored pages %d", m.HasTiers, m.HasStorage, m.StoredPages)
		}
	}()
	if entries, err := os.ReadDir(dir); err != nil || len(entries) == 0 {
		t.Fatalf("nothing was written to %s (%v)", url, err)
	}

	// A queued request: prefetched into the host tier before its admission.
	func() {
		second := tierEngine(t, 64, 64, url)
		defer second.Close()
		must(t, second.Prefetch(p, &AdmitOptions{CacheSalt: "acme"}))
		must(t, second.WaitForTiers())
		if m := metricsOf(t, second); m.FetchedPages != whole/tierPage {
			t.Fatalf("prefetch fetched %d pages, want %d", m.FetchedPages, whole/tierPage)
		}
		// Checks every cached float; the prefetch had fetched them all already.
		if got := serve(t, second, "acme", p); got != (served{cached: whole, host: whole}) {
			t.Fatalf("after the prefetch: %+v", got)
		}
		m := metricsOf(t, second)
		if m.FetchedPages != whole/tierPage || m.HostHitTokens != whole || m.StorageCorruptPages != 0 ||
			m.StorageErrors != 0 {
			t.Fatalf("second engine: %+v", m)
		}
		// The salt is in every page's key.
		must(t, second.Prefetch(p, &AdmitOptions{CacheSalt: "acme-2"}))
		must(t, second.WaitForTiers())
		if got := serve(t, second, "acme-2", p); got.cached != 0 {
			t.Fatalf("another salt: %+v", got)
		}
		if m := metricsOf(t, second); m.FetchedPages != whole/tierPage {
			t.Fatalf("another salt fetched pages: %d", m.FetchedPages-whole/tierPage)
		}
	}()

	// No prefetch: the admission fetches from storage itself and waits.
	third := tierEngine(t, 64, 64, url)
	if got := serve(t, third, "acme", p); got != (served{cached: whole, host: whole, storage: whole}) {
		t.Fatalf("fetched at admission: %+v", got)
	}
	if m := metricsOf(t, third); m.StorageHitTokens != whole || m.FetchedPages != whole/tierPage {
		t.Fatalf("third engine: storage hits %d, fetched pages %d", m.StorageHitTokens, m.FetchedPages)
	}
	if got := serve(t, third, "other", p); got.cached != 0 {
		t.Fatalf("another salt: %+v", got)
	}
	// Another model (the same layout, salt and prompt) is served none of these pages.
	other := tierOptions(t, 64, 64, url)
	other.ModelID = "another-model"
	fourth, err := NewEngine(other)
	must(t, err)
	defer fourth.Close()
	if got := serve(t, fourth, "acme", p); got.cached != 0 || got.storage != 0 {
		t.Fatalf("another model: %+v", got)
	}
}

func TestBadTierOptionsAndCalls(t *testing.T) {
	dir := t.TempDir()
	url := "file://" + dir
	for name, mutate := range map[string]func(*EngineOptions){
		"unknown URL scheme":          func(o *EngineOptions) { o.StorageURL = "s3://x" },
		"URL that does not parse":     func(o *EngineOptions) { o.StorageURL = "redis://[::1" },
		"storage without a host tier": func(o *EngineOptions) { o.HostPages, o.StorageURL = 0, url },
		"negative HostPages":          func(o *EngineOptions) { o.HostPages = -1 },
		"URL with a NUL byte":         func(o *EngineOptions) { o.StorageURL = url + "\x00x" },
		"StorageWorkers 0":            func(o *EngineOptions) { o.StorageURL, o.StorageWorkers = url, 0 },
		"write policy 3":              func(o *EngineOptions) { o.WritePolicy = 3 },
		"prefetch policy -1":          func(o *EngineOptions) { o.PrefetchPolicy = -1 },
		"storage without a model id":  func(o *EngineOptions) { o.StorageURL, o.ModelID = url, "" },
		"model id with a NUL byte":    func(o *EngineOptions) { o.StorageURL, o.ModelID = url, "m\x00x" },
		"secret from file and env": func(o *EngineOptions) {
			o.StorageURL, o.PageSecretFile, o.PageSecretEnv = url, dir+"/page.key", "HOME"
		},
	} {
		o := tierOptions(t, 8, 8, "")
		mutate(&o)
		e, err := NewEngine(o)
		if e != nil {
			e.Close()
			t.Errorf("%s: NewEngine succeeded", name)
			continue
		}
		got := wantCode(t, err, InvalidArgument)
		if got.Op() != "clm_engine_create" {
			t.Errorf("%s: op %q", name, got.Op())
		}
		t.Logf("%s: %v", name, err)
	}

	// Prefetch needs a storage tier.
	plain := newEngine(t, 8, 4)
	hostOnly := tierEngine(t, 8, 8, "")
	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	for _, e := range []*Engine{plain, hostOnly} {
		wantCode(t, e.Prefetch(prompt, nil), FailedPrecondition)
		must(t, e.WaitForTiers())
	}
	s := admit(t, plain, prompt, nil)
	for _, get := range []func() (int32, error){s.HostTokens, s.StorageTokens} {
		if n, err := get(); n != 0 || err != nil {
			t.Fatalf("without tiers: %d, %v", n, err)
		}
	}

	// Bad prompts, with a storage tier.
	stored := tierEngine(t, 8, 8, url)
	wantCode(t, stored.Prefetch([]int32{1, -5, 3}, nil), InvalidArgument)
	wantCode(t, stored.Prefetch(nil, nil), InvalidArgument)
	must(t, stored.Prefetch(prompt, &AdmitOptions{CacheSalt: "t"})) // nothing stored yet: no error
	must(t, stored.WaitForTiers())
	if m := metricsOf(t, stored); m.FetchedPages != 0 {
		t.Fatalf("fetched %d pages from an empty directory", m.FetchedPages)
	}

	// Closed handles.
	must(t, s.Close())
	for _, get := range []func() (int32, error){s.HostTokens, s.StorageTokens} {
		if _, err := get(); !errors.Is(err, ErrClosed) {
			t.Fatalf("a closed Seq: %v", err)
		}
	}
	stored.Close()
	for _, err := range []error{stored.Prefetch(prompt, nil), stored.WaitForTiers()} {
		if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "closed") {
			t.Fatalf("a closed Engine: %v", err)
		}
	}
}

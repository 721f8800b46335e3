package clm

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math/rand"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// KV events through the real library, as a Go host that publishes on a bus of
// its own sees them: the callback's batches, numbered without gaps and never
// delivered two at a time, rebuild a set of block hashes per medium from the
// Go values alone (a parent known before its child, a removed block present,
// every page's tokens a page of a prompt that tenant and adapter admitted)
// that equals KVEventBlocks after a random workload with evictions and the
// host tier; Close delivers what is left and releases the callback. Then the
// ZeroMQ endpoints as bound, the defaults, and the input that is refused.
// Prompts are random per run (the seed is logged).

const eventsPage = 4

// eventsOptions: a pool small enough to evict, a host tier, events on.
func eventsOptions(t *testing.T) EngineOptions {
	t.Helper()
	opts, err := DefaultEngineOptions()
	must(t, err)
	opts.NumPages, opts.PageSize = 48, eventsPage
	opts.NumLayers, opts.KVHeads, opts.HeadDim = 1, 1, 4
	opts.KVDType, opts.Memory = KVF32, MemoryHost
	opts.HostPages = 96
	opts.ModelID = "go-events-model"
	opts.KVEvents = true
	opts.KVEventsEndpoint = "tcp://127.0.0.1:*"
	opts.KVEventsBatchIntervalMS = 2
	opts.KVEventsMaxBatchEvents = 16
	return opts
}

// subscriber keeps the callback's batches, and whether two calls overlapped.
type subscriber struct {
	mu         sync.Mutex
	batches    []KVEventBatch
	inFlight   atomic.Int32
	overlapped atomic.Bool
}

func (s *subscriber) callback(b KVEventBatch) {
	if s.inFlight.Add(1) != 1 {
		s.overlapped.Store(true)
	}
	s.mu.Lock()
	s.batches = append(s.batches, b)
	s.mu.Unlock()
	s.inFlight.Add(-1)
}

func (s *subscriber) snapshot() []KVEventBatch {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]KVEventBatch(nil), s.batches...)
}

// eventTenant is what a BlockStored event says of who cached its pages.
type eventTenant struct {
	extraKey string
	loraID   int32
}

// saltKey is the extra key a salt's pages carry (docs/fleet.md): "salt:" and
// the first 32 hex digits of SHA-256(salt); "" for no salt.
func saltKey(salt string) string {
	if salt == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(salt))
	return "salt:" + hex.EncodeToString(sum[:])[:32]
}

// eventsWorkload admits and finishes requests over a few shared system
// prompts, three tenants and two adapters; some prompts come back, so the
// host tier loads. It returns the prompts each tenant admitted.
func eventsWorkload(t *testing.T, e *Engine, r *rand.Rand, requests int) map[eventTenant][][]int32 {
	t.Helper()
	systems := make([][]int32, 4)
	for i := range systems {
		systems[i] = randomPrompt(r, 12+r.Intn(12))
	}
	salts := []string{"", "tenant-a", "tenant-b"}
	admitted := map[eventTenant][][]int32{}
	var seen [][]int32
	for i := 0; i < requests; i++ {
		var prompt []int32
		if len(seen) > 0 && r.Intn(4) == 0 {
			prompt = seen[r.Intn(len(seen))]
		} else {
			prompt = append(append([]int32(nil), systems[r.Intn(len(systems))]...), randomPrompt(r, 4+r.Intn(24))...)
			seen = append(seen, prompt)
		}
		opts := &AdmitOptions{CacheSalt: salts[len(prompt)%3]}
		if r.Intn(2) == 1 {
			opts.AdapterID = 7
		}
		s, err := e.Admit(prompt, opts)
		if CodeOf(err) == OutOfMemory {
			continue
		}
		must(t, err)
		must(t, s.Finish())
		s.Close()
		tenant := eventTenant{saltKey(opts.CacheSalt), opts.AdapterID}
		admitted[tenant] = append(admitted[tenant], prompt)
		if i%16 == 0 {
			must(t, e.WaitForTiers())
		}
	}
	must(t, e.WaitForTiers())
	return admitted
}

// picture is what a subscriber holds, rebuilt from the batches alone.
type picture struct {
	gpu, cpu  map[uint64]bool
	events    uint64
	extraKeys map[string]bool
	loraIDs   map[int32]bool
}

// rebuild applies batches in order, checking each against the stream's rules
// and the prompts admitted (nil: the tokens are not checked).
func rebuild(t *testing.T, batches []KVEventBatch, tokenIDs bool, admitted map[eventTenant][][]int32) picture {
	t.Helper()
	p := picture{gpu: map[uint64]bool{}, cpu: map[uint64]bool{}, extraKeys: map[string]bool{},
		loraIDs: map[int32]bool{}}
	now := float64(time.Now().Add(time.Minute).UnixNano()) / 1e9
	for i, b := range batches {
		if b.Sequence != uint64(i) {
			t.Fatalf("batch %d has sequence %d: a gap or a batch out of order", i, b.Sequence)
		}
		if b.DataParallelRank != 3 || b.TS < 1.7e9 || b.TS > now || len(b.Events) == 0 {
			t.Fatalf("batch %d: rank %d, ts %v, %d events", i, b.DataParallelRank, b.TS, len(b.Events))
		}
		if i == 0 && b.Events[0].Kind != KVEventAllBlocksCleared {
			t.Fatalf("the first event is %v, want AllBlocksCleared", b.Events[0].Kind)
		}
		for j, ev := range b.Events {
			p.events++
			var tier map[uint64]bool
			switch ev.Medium {
			case KVMediumGPU:
				tier = p.gpu
			case KVMediumCPU:
				tier = p.cpu
			default:
				if ev.Kind != KVEventAllBlocksCleared {
					t.Fatalf("batch %d event %d: medium %v", i, j, ev.Medium)
				}
			}
			switch ev.Kind {
			case KVEventAllBlocksCleared:
				p.gpu, p.cpu = map[uint64]bool{}, map[uint64]bool{}
			case KVEventBlockStored:
				n := len(ev.BlockHashes)
				want := 0
				if tokenIDs {
					want = n * eventsPage
				}
				if n == 0 || ev.BlockSize != eventsPage || len(ev.TokenIDs) != want {
					t.Fatalf("batch %d event %d: %d hashes, block size %d, %d token ids", i, j, n, ev.BlockSize,
						len(ev.TokenIDs))
				}
				if ev.HasParent && !tier[ev.ParentBlockHash] {
					t.Fatalf("batch %d event %d: parent %#x is not on %v", i, j, ev.ParentBlockHash, ev.Medium)
				}
				if !ev.HasParent && ev.ParentBlockHash != 0 {
					t.Fatalf("batch %d event %d: no parent, but parent hash %#x", i, j, ev.ParentBlockHash)
				}
				for _, h := range ev.BlockHashes {
					if tier[h] {
						t.Fatalf("batch %d event %d: %#x stored twice on %v", i, j, h, ev.Medium)
					}
					tier[h] = true
				}
				p.extraKeys[ev.ExtraKey] = true
				p.loraIDs[ev.LoraID] = true
				if admitted != nil && tokenIDs {
					tenant := eventTenant{ev.ExtraKey, ev.LoraID}
					if !admittedPages(admitted[tenant], ev.TokenIDs) {
						t.Fatalf("batch %d event %d: tokens %v are no pages that %+v admitted", i, j, ev.TokenIDs,
							tenant)
					}
				}
			case KVEventBlockRemoved:
				if len(ev.BlockHashes) == 0 {
					t.Fatalf("batch %d event %d: removes nothing", i, j)
				}
				for _, h := range ev.BlockHashes {
					if !tier[h] {
						t.Fatalf("batch %d event %d: %#x removed from %v, where it is not", i, j, h, ev.Medium)
					}
					delete(tier, h)
				}
			default:
				t.Fatalf("batch %d event %d: unknown kind %v", i, j, ev.Kind)
			}
		}
	}
	return p
}

// admittedPages says whether tokens are whole pages, in a row, of one of the prompts.
func admittedPages(prompts [][]int32, tokens []int32) bool {
	for _, prompt := range prompts {
		for at := 0; at+len(tokens) <= len(prompt); at += eventsPage {
			match := true
			for k, tok := range tokens {
				if prompt[at+k] != tok {
					match = false
					break
				}
			}
			if match {
				return true
			}
		}
	}
	return false
}

// engineBlocks is KVEventBlocks(medium) as a set, with no hash twice.
func engineBlocks(t *testing.T, e *Engine, medium KVMedium) map[uint64]bool {
	t.Helper()
	hashes, err := e.KVEventBlocks(medium)
	must(t, err)
	set := make(map[uint64]bool, len(hashes))
	for _, h := range hashes {
		if set[h] {
			t.Fatalf("KVEventBlocks(%v) lists %#x twice", medium, h)
		}
		set[h] = true
	}
	return set
}

func sameBlocks(t *testing.T, what string, rebuilt, engine map[uint64]bool) {
	t.Helper()
	var missing, extra []uint64
	for h := range engine {
		if !rebuilt[h] {
			missing = append(missing, h)
		}
	}
	for h := range rebuilt {
		if !engine[h] {
			extra = append(extra, h)
		}
	}
	if len(missing)+len(extra) > 0 {
		t.Fatalf("%s: the events give %d blocks, the engine %d: %d missing, %d extra (%x, %x)", what,
			len(rebuilt), len(engine), len(missing), len(extra), missing, extra)
	}
}

func TestKVEventsCallbackRebuildsTheEnginesBlocks(t *testing.T) {
	r := tierRand(t)
	before := kvEventCallbacks.Load()
	sub := &subscriber{}
	opts := eventsOptions(t)
	opts.KVEventsCallback = sub.callback
	opts.KVEventsDataParallelRank = 3
	opts.KVEventsEndpoint = "tcp://no-host-anyone-binds:1" // unused with a callback
	e, err := NewEngine(opts)
	must(t, err)
	t.Cleanup(func() { e.Close() })
	if got := kvEventCallbacks.Load(); got != before+1 {
		t.Fatalf("%d callbacks registered, want %d", got, before+1)
	}

	admitted := eventsWorkload(t, e, r, 300)
	must(t, e.FlushKVEvents(10*time.Second))
	batches := sub.snapshot()
	if len(batches) == 0 {
		t.Fatal("no batch arrived")
	}
	p := rebuild(t, batches, true, admitted)
	gpu, cpu := engineBlocks(t, e, KVMediumGPU), engineBlocks(t, e, KVMediumCPU)
	sameBlocks(t, "GPU", p.gpu, gpu)
	sameBlocks(t, "CPU", p.cpu, cpu)
	if len(gpu) == 0 || len(cpu) == 0 {
		t.Fatalf("%d blocks on the GPU, %d on the CPU: the workload should fill both", len(gpu), len(cpu))
	}
	// Tenants' salts arrive as digests only; adapters as lora ids.
	if len(p.extraKeys) != 3 || !p.extraKeys[""] || !p.extraKeys[saltKey("tenant-a")] ||
		!p.extraKeys[saltKey("tenant-b")] {
		t.Fatalf("extra keys %v", p.extraKeys)
	}
	if len(p.loraIDs) != 2 || !p.loraIDs[0] || !p.loraIDs[7] {
		t.Fatalf("lora ids %v", p.loraIDs)
	}
	if sub.overlapped.Load() {
		t.Fatal("two batches were delivered at once")
	}

	m := metricsOf(t, e)
	if !m.HasKVEvents || m.KVEventsPublished != p.events || m.KVEventsRecorded != p.events ||
		m.KVEventsPublishedBatches != uint64(len(batches)) || m.KVEventsNextSequence != uint64(len(batches)) {
		t.Fatalf("metrics %+v; the callback saw %d events in %d batches", m, p.events, len(batches))
	}
	if m.KVEventsDropped != 0 || m.KVEventsQueued != 0 || m.KVEventsResyncPending || m.KVEventsResyncs != 0 ||
		m.KVEventsSendFailures != 0 {
		t.Fatalf("drops, resyncs or failures: %+v", m)
	}
	if m.Evictions == 0 || m.BackedUpPages == 0 {
		t.Fatalf("the workload did not evict (%d) or back up pages (%d)", m.Evictions, m.BackedUpPages)
	}
	t.Logf("%d events in %d batches; %d blocks on the GPU, %d on the CPU; %d evictions", p.events, len(batches),
		len(gpu), len(cpu), m.Evictions)
	// With a callback there are no sockets.
	for _, f := range []func() (string, error){e.KVEventsEndpoint, e.KVEventsReplayEndpoint} {
		if s, err := f(); err != nil || s != "" {
			t.Fatalf("an endpoint with a callback: %q, %v", s, err)
		}
	}

	// More work, not flushed: Close delivers it before it returns, then
	// releases the callback, which is never called again.
	more := eventsWorkload(t, e, r, 40)
	for tenant, prompts := range more {
		admitted[tenant] = append(admitted[tenant], prompts...)
	}
	gpu, cpu = engineBlocks(t, e, KVMediumGPU), engineBlocks(t, e, KVMediumCPU)
	must(t, e.Close())
	if got := kvEventCallbacks.Load(); got != before {
		t.Fatalf("%d callbacks registered after Close, want %d", got, before)
	}
	batches = sub.snapshot()
	p = rebuild(t, batches, true, admitted)
	sameBlocks(t, "GPU at Close", p.gpu, gpu)
	sameBlocks(t, "CPU at Close", p.cpu, cpu)
	time.Sleep(50 * time.Millisecond)
	if n := len(sub.snapshot()); n != len(batches) {
		t.Fatalf("%d batches after Close returned, %d when it did", n, len(batches))
	}
	for _, err := range []error{e.FlushKVEvents(time.Second), second64(e.KVEventBlocks(KVMediumGPU)),
		secondString(e.KVEventsEndpoint())} {
		wantCode(t, err, FailedPrecondition)
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("%v does not wrap ErrClosed", err)
		}
	}
}

func second64(_ []uint64, err error) error   { return err }
func secondString(_ string, err error) error { return err }

// Close with events still queued (a batch interval longer than the test): they
// are delivered before Close returns.
func TestKVEventsCloseDeliversWhatIsQueued(t *testing.T) {
	r := tierRand(t)
	sub := &subscriber{}
	opts := eventsOptions(t)
	opts.KVEventsCallback = sub.callback
	opts.KVEventsDataParallelRank = 3
	opts.KVEventsBatchIntervalMS = 60000
	opts.KVEventsMaxBatchEvents = 65536
	e, err := NewEngine(opts)
	must(t, err)
	admitted := eventsWorkload(t, e, r, 100)
	if m := metricsOf(t, e); m.KVEventsQueued == 0 {
		t.Fatalf("nothing queued before Close: %+v", m)
	}
	gpu, cpu := engineBlocks(t, e, KVMediumGPU), engineBlocks(t, e, KVMediumCPU)
	must(t, e.Close())
	p := rebuild(t, sub.snapshot(), true, admitted)
	sameBlocks(t, "GPU at Close", p.gpu, gpu)
	sameBlocks(t, "CPU at Close", p.cpu, cpu)
}

func TestKVEventsWithoutTokenIDs(t *testing.T) {
	r := tierRand(t)
	sub := &subscriber{}
	opts := eventsOptions(t)
	opts.KVEventsCallback = sub.callback
	opts.KVEventsDataParallelRank = 3
	opts.KVEventsTokenIDs = false
	e, err := NewEngine(opts)
	must(t, err)
	defer e.Close()
	eventsWorkload(t, e, r, 100)
	must(t, e.FlushKVEvents(10*time.Second))
	p := rebuild(t, sub.snapshot(), false, nil)
	if p.events < 2 {
		t.Fatalf("%d events", p.events)
	}
	sameBlocks(t, "GPU", p.gpu, engineBlocks(t, e, KVMediumGPU))
	sameBlocks(t, "CPU", p.cpu, engineBlocks(t, e, KVMediumCPU))
}

func TestKVEventsSocketEndpoints(t *testing.T) {
	r := tierRand(t)
	opts := eventsOptions(t)
	opts.KVEventsReplayEndpoint = "tcp://127.0.0.1:*"
	opts.KVEventsTopic = "kv@pod-1@go-events-model"
	e, err := NewEngine(opts)
	must(t, err)
	defer e.Close()
	pub, err := e.KVEventsEndpoint()
	must(t, err)
	replay, err := e.KVEventsReplayEndpoint()
	must(t, err)
	for _, s := range []string{pub, replay} {
		if !strings.HasPrefix(s, "tcp://127.0.0.1:") || s == "tcp://127.0.0.1:*" ||
			len(s) == len("tcp://127.0.0.1:") {
			t.Fatalf("endpoints %q and %q: want the ports the wildcards picked", pub, replay)
		}
	}
	if pub == replay {
		t.Fatalf("both sockets on %q", pub)
	}
	eventsWorkload(t, e, r, 50)
	must(t, e.FlushKVEvents(10*time.Second))
	m := metricsOf(t, e)
	if !m.HasKVEvents || m.KVEventsPublishedBatches == 0 || m.KVEventsPublished != m.KVEventsRecorded ||
		m.KVEventsSendFailures != 0 || m.KVEventsNextSequence != m.KVEventsPublishedBatches {
		t.Fatalf("metrics %+v", m)
	}
	if len(engineBlocks(t, e, KVMediumGPU)) == 0 {
		t.Fatal("no blocks on the GPU")
	}
	text, err := e.MetricsText()
	must(t, err)
	if !strings.Contains(text, "clm_kv_events_published_total") {
		t.Fatal("no KV-event metrics in the Prometheus text")
	}

	// The other layouts and a forced bind open too.
	for _, layout := range []KVEventsLayout{KVEventsLayoutLegacy, KVEventsLayoutMap} {
		o := eventsOptions(t)
		o.KVEventsLayout = layout
		o.KVEventsBind = KVEventsBind
		other, err := NewEngine(o)
		must(t, err)
		ep, err := other.KVEventsEndpoint()
		must(t, err)
		if !strings.HasPrefix(ep, "tcp://127.0.0.1:") || ep == pub {
			t.Fatalf("layout %d: endpoint %q", layout, ep)
		}
		other.Close()
	}
}

func TestKVEventsDefaults(t *testing.T) {
	d, err := DefaultEngineOptions()
	must(t, err)
	if d.KVEvents || d.KVEventsBind != KVEventsBindAuto || d.KVEventsEndpoint != "" ||
		d.KVEventsReplayEndpoint != "" || d.KVEventsTopic != "" || d.KVEventsCallback != nil ||
		d.KVEventsLayout != KVEventsLayoutArray || d.KVEventsBatchIntervalMS != 10 ||
		d.KVEventsMaxBatchEvents != 1024 || d.KVEventsQueueEvents != 131072 || d.KVEventsBufferBatches != 10000 ||
		d.KVEventsSendHWM != 100000 || d.KVEventsDataParallelRank != 0 || !d.KVEventsTokenIDs {
		t.Fatalf("KV-event defaults differ from clm.h's documentation: %+v", d)
	}
	if KVEventsBindAuto != 0 || KVEventsBind != 1 || KVEventsConnect != 2 || KVEventsLayoutArray != 0 ||
		KVEventsLayoutLegacy != 1 || KVEventsLayoutMap != 2 || KVEventBlockStored != 0 ||
		KVEventBlockRemoved != 1 || KVEventAllBlocksCleared != 2 || KVMediumGPU != 0 || KVMediumCPU != 1 {
		t.Fatal("clm.h's KV-event constants changed: they are ABI")
	}
	if KVEventBlockStored.String() != "BlockStored" || KVMediumCPU.String() != "CPU" ||
		KVMedium(5).String() != "KVMedium(5)" {
		t.Fatal("String")
	}
	d.NumPages = 8
	e, err := NewEngine(d)
	must(t, err)
	defer e.Close()
	if m := metricsOf(t, e); m.HasKVEvents || m.KVEventsRecorded != 0 || m.KVEventsNextSequence != 0 {
		t.Fatalf("an engine without events: %+v", m)
	}
}

func TestKVEventsBadInput(t *testing.T) {
	before := kvEventCallbacks.Load()
	callback := func(KVEventBatch) {}
	for _, c := range []struct {
		name string
		edit func(*EngineOptions)
	}{
		{"unknown bind", func(o *EngineOptions) { o.KVEventsBind = 3 }},
		{"negative bind", func(o *EngineOptions) { o.KVEventsBind = -1 }},
		{"unknown layout", func(o *EngineOptions) { o.KVEventsLayout = 3 }},
		{"negative layout", func(o *EngineOptions) { o.KVEventsLayout = -1 }},
		{"no model id", func(o *EngineOptions) { o.ModelID = "" }},
		{"no model id, a callback", func(o *EngineOptions) { o.ModelID = ""; o.KVEventsCallback = callback }},
		{"a callback and a replay endpoint", func(o *EngineOptions) {
			o.KVEventsCallback = callback
			o.KVEventsReplayEndpoint = "tcp://127.0.0.1:*"
		}},
		{"a topic over 256 bytes", func(o *EngineOptions) { o.KVEventsTopic = strings.Repeat("t", 300) }},
		{"an endpoint over 4096 bytes", func(o *EngineOptions) {
			o.KVEventsEndpoint = "tcp://127.0.0.1:" + strings.Repeat("9", 5000)
		}},
		{"a NUL in the endpoint", func(o *EngineOptions) { o.KVEventsEndpoint = "tcp://127.0.0.1:*\x00x" }},
		{"a NUL in the topic, a callback", func(o *EngineOptions) {
			o.KVEventsTopic = "a\x00b"
			o.KVEventsCallback = callback
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := eventsOptions(t)
			c.edit(&o)
			e, err := NewEngine(o)
			if e != nil {
				e.Close()
			}
			wantCode(t, err, InvalidArgument)
		})
	}
	if got := kvEventCallbacks.Load(); got != before {
		t.Fatalf("%d callbacks registered after failed creations, want %d", got, before)
	}

	// An engine without events: every call is FailedPrecondition.
	o := eventsOptions(t)
	o.KVEvents = false
	plain, err := NewEngine(o)
	must(t, err)
	defer plain.Close()
	wantCode(t, plain.FlushKVEvents(time.Second), FailedPrecondition)
	wantCode(t, second64(plain.KVEventBlocks(KVMediumGPU)), FailedPrecondition)
	wantCode(t, second64(plain.KVEventBlocks(KVMediumCPU)), FailedPrecondition)
	wantCode(t, secondString(plain.KVEventsEndpoint()), FailedPrecondition)
	wantCode(t, secondString(plain.KVEventsReplayEndpoint()), FailedPrecondition)

	// An engine with them: an unknown medium, a negative timeout.
	with, err := NewEngine(eventsOptions(t))
	must(t, err)
	defer with.Close()
	wantCode(t, second64(with.KVEventBlocks(2)), InvalidArgument)
	wantCode(t, second64(with.KVEventBlocks(-1)), InvalidArgument)
	wantCode(t, with.FlushKVEvents(-time.Millisecond), InvalidArgument)
	must(t, with.FlushKVEvents(10*time.Second))
	hashes, err := with.KVEventBlocks(KVMediumGPU)
	must(t, err)
	if len(hashes) != 0 {
		t.Fatalf("a new engine holds %d blocks", len(hashes))
	}
}

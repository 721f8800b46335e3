package clm

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"
)

// ---- helpers -----------------------------------------------------------------

func newEngine(t *testing.T, numPages, pageSize int32) *Engine {
	t.Helper()
	opts, err := DefaultEngineOptions()
	if err != nil {
		t.Fatalf("DefaultEngineOptions: %v", err)
	}
	opts.NumPages = numPages
	opts.PageSize = pageSize
	opts.HeadDim = 8 // keep the host pool small
	e, err := NewEngine(opts)
	if err != nil {
		t.Fatalf("NewEngine: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func admit(t *testing.T, e *Engine, tokens []int32, opts *AdmitOptions) *Seq {
	t.Helper()
	s, err := e.Admit(tokens, opts)
	if err != nil {
		t.Fatalf("Admit(%d tokens): %v", len(tokens), err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func cached(t *testing.T, s *Seq) int {
	t.Helper()
	n, err := s.CachedTokens()
	must(t, err)
	return int(n)
}

// span is the tokens [from, from+n): distinct prompts come from distinct ranges.
func span(from, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(from + i)
	}
	return out
}

func concat(parts ...[]int32) []int32 {
	var out []int32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func alignDown(n, pageSize int) int { return n / pageSize * pageSize }

// expectedCached is the prefix-reuse rule computed independently of the
// library: the longest stored prefix, in whole pages, and never the whole
// prompt (at most len-1 tokens, page-aligned).
func expectedCached(stored, promptLen, pageSize int) int {
	c := alignDown(stored, pageSize)
	if m := alignDown(promptLen-1, pageSize); m < c {
		c = m
	}
	return c
}

// wantCode checks that err is an *Error with the given code and a message.
func wantCode(t *testing.T, err error, code Code) *Error {
	t.Helper()
	if err == nil {
		t.Fatalf("got nil error, want %v", code)
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not a *clm.Error", err, err)
	}
	if e.Code() != code || CodeOf(err) != code || !errors.Is(err, code) {
		t.Fatalf("error %v: code %v, want %v", err, e.Code(), code)
	}
	if strings.TrimSpace(e.Message()) == "" {
		t.Fatalf("error %v has an empty message", err)
	}
	return e
}

// ---- tests -------------------------------------------------------------------

func TestVersionAndCodes(t *testing.T) {
	if Version() != HeaderVersion {
		t.Fatalf("library version %d, header %d", Version(), HeaderVersion)
	}
	v := Version()
	if want := fmt.Sprintf("%d.%d.%d", v/10000, v/100%100, v%100); VersionString() != want {
		t.Fatalf("VersionString %q, want %q", VersionString(), want)
	}
	names := map[Code]string{
		OK: "ok", InvalidArgument: "invalid_argument", OutOfMemory: "out_of_memory", NotFound: "not_found",
		FailedPrecondition: "failed_precondition", Unsupported: "unsupported", Internal: "internal", IO: "io_error",
		Code(-100): "unknown", Code(3): "unknown",
	}
	for c, name := range names {
		if c.String() != name {
			t.Errorf("Code(%d).String() = %q, want %q", int32(c), c.String(), name)
		}
	}
	if CodeOf(nil) != OK || CodeOf(errors.New("x")) != Internal || CodeOf(fmt.Errorf("w: %w", NotFound)) != NotFound {
		t.Fatal("CodeOf")
	}
}

func TestDefaults(t *testing.T) {
	opts, err := DefaultEngineOptions()
	must(t, err)
	if opts.NumPages != 0 || opts.PageSize != 16 || opts.NumLayers != 1 || opts.KVHeads != 1 || opts.HeadDim != 128 ||
		opts.KVDType != KVF16 || opts.Memory != MemoryHost || opts.EvictionPolicy != EvictLRU ||
		opts.SLRUProtectedFraction != 0.2 {
		t.Fatalf("defaults differ from clm.h's documentation: %+v", opts)
	}
	a, err := DefaultAdmitOptions()
	must(t, err)
	if a != (AdmitOptions{}) {
		t.Fatalf("admit defaults: %+v", a)
	}
}

func TestBadOptions(t *testing.T) {
	opts, err := DefaultEngineOptions()
	must(t, err)
	e, err := NewEngine(opts) // num_pages 0
	if e != nil {
		t.Fatal("NewEngine with num_pages 0 returned an engine")
	}
	got := wantCode(t, err, InvalidArgument)
	if got.Op() != "clm_engine_create" || !strings.Contains(err.Error(), "invalid_argument") {
		t.Fatalf("error %q (op %q)", err, got.Op())
	}
	t.Logf("num_pages 0: %v", err)

	for name, mutate := range map[string]func(*EngineOptions){
		"negative num_pages": func(o *EngineOptions) { o.NumPages = -1 },
		"page_size 0":        func(o *EngineOptions) { o.NumPages = 8; o.PageSize = 0 },
		"kv_dtype 9":         func(o *EngineOptions) { o.NumPages = 8; o.KVDType = 9 },
		"memory 7":           func(o *EngineOptions) { o.NumPages = 8; o.Memory = 7 },
		"eviction policy 9":  func(o *EngineOptions) { o.NumPages = 8; o.EvictionPolicy = 9 },
		"slru fraction 2":    func(o *EngineOptions) { o.NumPages = 8; o.SLRUProtectedFraction = 2 },
		"slru fraction NaN":  func(o *EngineOptions) { o.NumPages = 8; o.SLRUProtectedFraction = math.NaN() },
	} {
		o := opts
		mutate(&o)
		e, err := NewEngine(o)
		if e != nil {
			e.Close()
			t.Errorf("%s: NewEngine succeeded", name)
			continue
		}
		wantCode(t, err, InvalidArgument)
	}
}

// A conversation admitted at priority 1, then at 0: raised, its first turn
// outlives a newer prompt; set, it drops to 0 and goes first (as
// tests/capi/test_capi_engine.cpp's priority_update case, in pages of 16).
func TestPriorityUpdate(t *testing.T) {
	for _, update := range []PriorityUpdate{PriorityRaise, PrioritySet} {
		opts, err := DefaultEngineOptions()
		must(t, err)
		opts.NumPages, opts.PageSize, opts.HeadDim = 8, 16, 8
		opts.EvictionPolicy = EvictPriority
		e, err := NewEngine(opts)
		must(t, err)
		run := func(prompt []int32, priority int32) {
			s := admit(t, e, prompt, &AdmitOptions{Priority: priority, PriorityUpdate: update})
			must(t, s.Finish())
		}
		cached := func(prompt []int32) int32 {
			plan, err := e.PlanAdmission(append(append([]int32{}, prompt...), 9999), nil)
			must(t, err)
			return plan.CachedTokens
		}
		firstTurn := span(0, 32)
		secondTurn := append(span(0, 32), span(500, 32)...)
		older, newer := span(1000, 32), span(2000, 32)
		run(firstTurn, 1)
		run(older, 0)
		run(secondTurn, 0)
		run(newer, 0)
		probe := admit(t, e, span(3000, 96), nil) // evicts three 2-page leaves
		wantFirst, wantNewer := int32(32), int32(0)
		if update == PrioritySet {
			wantFirst, wantNewer = 0, 32
		}
		if got := [3]int32{cached(older), cached(firstTurn), cached(newer)}; got != [3]int32{0, wantFirst, wantNewer} {
			t.Fatalf("update %d: cached older, first turn, newer = %v, want [0 %d %d]", update, got, wantFirst,
				wantNewer)
		}
		must(t, probe.Abort())
		must(t, probe.Close())
		e.Close()
	}
}

func TestBadRequests(t *testing.T) {
	e := newEngine(t, 64, 16)
	_, err := e.Admit(nil, nil)
	wantCode(t, err, InvalidArgument)
	_, err = e.Admit([]int32{1, 2, -3}, nil)
	wantCode(t, err, InvalidArgument)
	_, err = e.Admit(span(0, 4), &AdmitOptions{Priority: 101})
	wantCode(t, err, InvalidArgument)
	_, err = e.Admit(span(0, 4), &AdmitOptions{Priority: 1, PriorityUpdate: 2})
	wantCode(t, err, InvalidArgument)

	s := admit(t, e, span(0, 4), nil)
	wantCode(t, s.Extend([]int32{7, -1}), InvalidArgument)
	must(t, s.Extend(nil)) // nothing to add is fine
	slots, err := s.Slots()
	must(t, err)
	if len(slots) != 0 {
		t.Fatalf("slots after an empty extend: %v", slots)
	}

	// Out of pages: 4 pages of 16 cannot hold 100 tokens.
	small := newEngine(t, 4, 16)
	_, err = small.Admit(span(0, 100), nil)
	wantCode(t, err, OutOfMemory)
	m, err := small.Metrics()
	must(t, err)
	if m.Rejected != 1 || m.Admitted != 0 || m.PagesFree != 4 {
		t.Fatalf("after a rejected admission: %+v", m)
	}
}

func TestClosedHandles(t *testing.T) {
	e := newEngine(t, 64, 16)
	s, err := e.Admit(span(0, 20), nil)
	must(t, err)
	other, err := e.Admit(span(100, 20), nil)
	must(t, err)

	// A Seq closed on its own.
	must(t, s.Close())
	must(t, s.Close())
	closedSeqCalls := map[string]error{
		"Extend": s.Extend([]int32{1}),
		"Finish": s.Finish(),
		"Abort":  s.Abort(),
	}
	_, closedSeqCalls["CachedTokens"] = s.CachedTokens()
	_, closedSeqCalls["PageTable"] = s.PageTable()
	_, closedSeqCalls["Slots"] = s.Slots()
	_, closedSeqCalls["BatchPageTable"] = e.BatchPageTable([]*Seq{other, s})
	for name, err := range closedSeqCalls {
		wantCode(t, err, FailedPrecondition)
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s on a closed Seq: %v does not wrap ErrClosed", name, err)
		}
	}

	// The engine closed under a running sequence: the C library reports it.
	must(t, e.Close())
	must(t, e.Close())
	err = other.Finish()
	wantCode(t, err, FailedPrecondition)
	if errors.Is(err, ErrClosed) {
		t.Errorf("Finish after the engine was freed should come from the C library: %v", err)
	}
	wantCode(t, other.Extend([]int32{1}), FailedPrecondition)
	wantCode(t, other.Abort(), FailedPrecondition)
	_, err = other.PageTable()
	wantCode(t, err, FailedPrecondition)
	if n, err := other.CachedTokens(); err != nil || n != 0 {
		t.Fatalf("CachedTokens after engine close: %d, %v", n, err)
	}
	must(t, other.Close())
	must(t, other.Close())

	closedEngineCalls := map[string]error{}
	_, closedEngineCalls["Admit"] = e.Admit(span(0, 20), nil)
	_, closedEngineCalls["Metrics"] = e.Metrics()
	_, closedEngineCalls["KVLayout"] = e.KVLayout()
	_, closedEngineCalls["BatchPageTable"] = e.BatchPageTable(nil)
	for name, err := range closedEngineCalls {
		wantCode(t, err, FailedPrecondition)
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s on a closed Engine: %v does not wrap ErrClosed", name, err)
		}
	}

	// Nil handles never crash.
	var ne *Engine
	_, err = ne.Admit(span(0, 3), nil)
	wantCode(t, err, FailedPrecondition)
	var ns *Seq
	wantCode(t, ns.Finish(), FailedPrecondition)
	_, err = e.BatchPageTable([]*Seq{nil})
	wantCode(t, err, FailedPrecondition) // the engine is closed: checked first
	e2 := newEngine(t, 8, 16)
	_, err = e2.BatchPageTable([]*Seq{nil})
	wantCode(t, err, InvalidArgument)
}

func TestMultiTurnConversation(t *testing.T) {
	const pageSize = 16
	e := newEngine(t, 256, pageSize)

	// Turn 1: a fresh prompt, then 20 decode steps of one token each.
	prompt1 := span(1000, 37)
	s1 := admit(t, e, prompt1, nil)
	if got := cached(t, s1); got != 0 {
		t.Fatalf("turn 1: %d cached tokens on an empty cache", got)
	}
	output1 := span(5000, 20)
	for _, tok := range output1 {
		must(t, s1.Extend([]int32{tok}))
	}
	must(t, s1.Finish())
	must(t, s1.Close())

	// Turn 2: the whole conversation so far plus the user's next message.
	prompt2 := concat(prompt1, output1, span(9000, 10))
	s2 := admit(t, e, prompt2, nil)
	want := expectedCached(len(prompt1)+len(output1), len(prompt2), pageSize) // 57 stored -> 48
	if want != 48 {
		t.Fatalf("test arithmetic: %d", want)
	}
	if got := cached(t, s2); got != want {
		t.Fatalf("turn 2: %d cached tokens, want %d", got, want)
	}
	slots, err := s2.Slots()
	must(t, err)
	if len(slots) != len(prompt2)-want {
		t.Fatalf("turn 2: %d slots for %d uncached tokens", len(slots), len(prompt2)-want)
	}
	output2 := span(6000, 5)
	must(t, s2.Extend(output2))
	must(t, s2.Finish())

	// Turn 3 reuses turn 2's prompt and output.
	prompt3 := concat(prompt2, output2, span(9500, 3))
	s3 := admit(t, e, prompt3, nil)
	if got, want := cached(t, s3), expectedCached(len(prompt2)+len(output2), len(prompt3), pageSize); got != want {
		t.Fatalf("turn 3: %d cached tokens, want %d", got, want)
	}

	// A prompt that is exactly the stored conversation still leaves its last
	// token to compute.
	s4 := admit(t, e, concat(prompt1, output1[:11]), nil) // 48 tokens, all stored
	if got, want := cached(t, s4), expectedCached(48, 48, pageSize); got != want || got != 32 {
		t.Fatalf("exact-prefix prompt: %d cached tokens, want %d", got, want)
	}
}

func TestSaltsIsolateTenants(t *testing.T) {
	e := newEngine(t, 256, 16)
	prompt := span(0, 64)
	tenantA := &AdmitOptions{CacheSalt: "tenant-a"}
	a := admit(t, e, prompt, tenantA)
	must(t, a.Finish())

	check := func(name string, opts *AdmitOptions, want int) {
		t.Helper()
		s := admit(t, e, prompt, opts)
		if got := cached(t, s); got != want {
			t.Errorf("%s: %d cached tokens, want %d", name, got, want)
		}
		must(t, s.Abort())
	}
	check("same tenant", &AdmitOptions{CacheSalt: "tenant-a"}, 48)
	check("other tenant", &AdmitOptions{CacheSalt: "tenant-b"}, 0)
	check("no salt", nil, 0)
	check("empty salt", &AdmitOptions{}, 0)
	check("salt with a NUL byte", &AdmitOptions{CacheSalt: "tenant-a\x00x"}, 0)
	check("salt prefix", &AdmitOptions{CacheSalt: "tenant-"}, 0)
	check("same tenant, other adapter", &AdmitOptions{CacheSalt: "tenant-a", AdapterID: 3}, 0)

	// A salt built at run time (heap memory, not a literal) works the same.
	salt := strings.Repeat("tenant-", 1) + string([]byte{'a'})
	check("same tenant, heap salt", &AdmitOptions{CacheSalt: salt}, 48)
}

func TestPinPrefix(t *testing.T) {
	const pageSize = 16
	e := newEngine(t, 32, pageSize) // a pin budget of 8 pages
	pinned, unpinned := span(0, 97), span(1000, 97)
	for _, prompt := range [][]int32{pinned, unpinned} {
		must(t, admit(t, e, prompt, nil).Finish())
	}
	if _, err := e.PinPrefix(span(5000, 40), nil, time.Minute); !errors.Is(err, NotFound) {
		t.Fatalf("pin of an uncached prefix: %v", err)
	}
	pin, err := e.PinPrefix(pinned, nil, time.Minute)
	must(t, err)
	if pin.ID == 0 || pin.PinnedTokens != 96 {
		t.Fatalf("pin %+v", pin)
	}
	if _, err := e.PinPrefix(unpinned, nil, time.Minute); !errors.Is(err, OutOfMemory) {
		t.Fatalf("a pin past the budget: %v", err)
	}
	if _, err := e.PinPrefix(pinned, nil, 0); !errors.Is(err, InvalidArgument) {
		t.Fatalf("a zero ttl: %v", err)
	}
	flood := func(from int) {
		for i := 0; i < 12; i++ {
			must(t, admit(t, e, span(from+100*i, 65), nil).Finish())
		}
	}
	cachedOf := func(prompt []int32) int32 {
		p, err := e.PlanAdmission(prompt, nil)
		must(t, err)
		return p.CachedTokens
	}
	flood(20000)
	if cachedOf(pinned) != 96 || cachedOf(unpinned) != 0 {
		t.Fatalf("after a flood: pinned %d cached, unpinned %d", cachedOf(pinned), cachedOf(unpinned))
	}
	must(t, e.Unpin(pin))
	if err := e.Unpin(pin); !errors.Is(err, NotFound) {
		t.Fatalf("unpin twice: %v", err)
	}
	flood(40000)
	if got := cachedOf(pinned); got != 0 {
		t.Fatalf("unpinned, then a flood: %d still cached", got)
	}
}

func TestHintPrefix(t *testing.T) {
	e := newEngine(t, 32, 16)
	prompt := span(0, 97)
	must(t, admit(t, e, prompt, nil).Finish())
	reached, err := e.HintPrefix("conversation-1", prompt, nil, 1, time.Minute)
	must(t, err)
	if reached != 96 {
		t.Fatalf("HintPrefix reached %d tokens, want 96", reached)
	}
	if reached, err := e.HintPrefix("conversation-2", span(5000, 40), nil, 1, time.Minute); err != nil || reached != 0 {
		t.Fatalf("an uncached prefix: %d, %v", reached, err)
	}
	for _, bad := range []struct {
		key      string
		priority int32
		ttl      time.Duration
	}{{"", 1, time.Minute}, {"k", 0, time.Minute}, {"k", 101, time.Minute}, {"k", 1, 0}} {
		if _, err := e.HintPrefix(bad.key, prompt, nil, bad.priority, bad.ttl); !errors.Is(err, InvalidArgument) {
			t.Fatalf("HintPrefix(%+v): %v", bad, err)
		}
	}
}

func TestPlanAdmission(t *testing.T) {
	const pageSize = 16
	e := newEngine(t, 8, pageSize)
	plan := func(tokens []int32, opts *AdmitOptions) AdmissionPlan {
		t.Helper()
		before, err := e.Metrics()
		must(t, err)
		p, err := e.PlanAdmission(tokens, opts)
		must(t, err)
		after, err := e.Metrics()
		must(t, err)
		if after.TokensQueried != before.TokensQueried || after.EvictableTokens != before.EvictableTokens ||
			after.PagesFree != before.PagesFree {
			t.Fatalf("PlanAdmission changed the metrics: %+v then %+v", before, after)
		}
		if int64(p.PagesFree) != int64(before.PagesFree) || p.EvictableTokens != before.EvictableTokens {
			t.Fatalf("plan %+v, metrics %+v", p, before)
		}
		return p
	}
	first := admit(t, e, span(0, 64), nil) // 4 pages, cached at finish
	must(t, first.Finish())
	// 70 tokens starting with the cached 64: 3 of its 4 pages are reused
	// (at most len-1 tokens, page-aligned: 48), 2 allocated.
	p := plan(span(0, 70), nil)
	want := expectedCached(64, 70, pageSize)
	if int(p.CachedTokens) != want || p.NewPages != int32(5-want/pageSize) || p.UnlockedPages != int32(want/pageSize) {
		t.Fatalf("plan %+v, want %d cached", p, want)
	}
	s := admit(t, e, span(0, 70), nil)
	if got := cached(t, s); got != int(p.CachedTokens) {
		t.Fatalf("admit cached %d, plan said %d", got, p.CachedTokens)
	}
	// Another tenant matches nothing; the same prompt again finds its pages locked.
	if p := plan(span(0, 70), &AdmitOptions{CacheSalt: "other"}); p.CachedTokens != 0 || p.NewPages != 5 {
		t.Fatalf("other tenant: %+v", p)
	}
	if p := plan(span(0, 70), nil); p.UnlockedPages != 0 {
		t.Fatalf("locked prefix counted as unlocked: %+v", p)
	}
	must(t, s.Abort())
	_, err := e.PlanAdmission(nil, nil)
	wantCode(t, err, InvalidArgument)
	_, err = e.PlanAdmission([]int32{1, 2, -3}, nil)
	wantCode(t, err, InvalidArgument)
	_, err = e.PlanAdmission(span(0, 4), &AdmitOptions{Priority: 101})
	wantCode(t, err, InvalidArgument)
}

func TestExtendSlotsAndPageTables(t *testing.T) {
	const pageSize = 16
	e := newEngine(t, 256, pageSize)
	seen := map[int64]bool{}
	checkSlots := func(s *Seq, first, n int) {
		t.Helper()
		slots, err := s.Slots()
		must(t, err)
		table, err := s.PageTable()
		must(t, err)
		length := first + n
		if want := (length + pageSize - 1) / pageSize; len(table) != want {
			t.Fatalf("page table of %d tokens has %d pages, want %d", length, len(table), want)
		}
		if len(slots) != n {
			t.Fatalf("%d slots, want %d", len(slots), n)
		}
		for i, slot := range slots {
			pos := first + i
			if want := int64(table[pos/pageSize])*pageSize + int64(pos%pageSize); slot != want {
				t.Fatalf("token %d: slot %d, want %d (page %d of %v)", pos, slot, want, pos/pageSize, table)
			}
			if seen[slot] {
				t.Fatalf("slot %d given twice", slot)
			}
			seen[slot] = true
		}
	}

	s := admit(t, e, span(0, 10), nil)
	checkSlots(s, 0, 10)
	length := 10
	for i := 0; i < 9; i++ { // crosses the first page boundary at token 16
		must(t, s.Extend([]int32{int32(100 + i)}))
		checkSlots(s, length, 1)
		length++
	}
	must(t, s.Extend(span(200, 40))) // several pages at once
	checkSlots(s, length, 40)
	length += 40

	// A second sequence's slots never collide with the first's.
	s2 := admit(t, e, span(1000, 33), nil)
	checkSlots(s2, 0, 33)

	// The batch view agrees with the per-sequence page tables.
	t1, err := s.PageTable()
	must(t, err)
	t2, err := s2.PageTable()
	must(t, err)
	b, err := e.BatchPageTable([]*Seq{s2, s})
	must(t, err)
	wantIndices := concat(t2, t1)
	if fmt.Sprint(b.Indices) != fmt.Sprint(wantIndices) {
		t.Fatalf("batch indices %v, want %v", b.Indices, wantIndices)
	}
	wantIndptr := []int32{0, int32(len(t2)), int32(len(t1) + len(t2))}
	if fmt.Sprint(b.Indptr) != fmt.Sprint(wantIndptr) {
		t.Fatalf("batch indptr %v, want %v", b.Indptr, wantIndptr)
	}
	lastLen := func(n int) int32 { return int32(n - (n-1)/pageSize*pageSize) }
	wantLast := []int32{lastLen(33), lastLen(length)}
	if fmt.Sprint(b.LastPageLen) != fmt.Sprint(wantLast) {
		t.Fatalf("batch last_page_len %v, want %v", b.LastPageLen, wantLast)
	}
	// A sequence listed twice is refused (its rows would be written twice).
	_, err = e.BatchPageTable([]*Seq{s, s2, s})
	wantCode(t, err, InvalidArgument)
	empty, err := e.BatchPageTable(nil)
	must(t, err)
	if len(empty.Indptr) != 1 || empty.Indptr[0] != 0 || len(empty.Indices) != 0 {
		t.Fatalf("empty batch: %+v", empty)
	}

	// More page ids than the wrapper's first guess (64 per sequence).
	long := admit(t, e, span(50000, 70*pageSize+3), nil)
	lb, err := e.BatchPageTable([]*Seq{long})
	must(t, err)
	if len(lb.Indices) != 71 || lb.LastPageLen[0] != 3 {
		t.Fatalf("long batch: %d indices, last page len %d", len(lb.Indices), lb.LastPageLen[0])
	}

	// Sequences of another engine, or that ended, are refused.
	e2 := newEngine(t, 16, pageSize)
	foreign := admit(t, e2, span(0, 5), nil)
	_, err = e.BatchPageTable([]*Seq{s, foreign})
	wantCode(t, err, InvalidArgument)
	must(t, s2.Finish())
	_, err = e.BatchPageTable([]*Seq{s, s2})
	wantCode(t, err, FailedPrecondition)
}

func TestFinishAbortStates(t *testing.T) {
	e := newEngine(t, 64, 16)
	s := admit(t, e, span(0, 20), nil)
	must(t, s.Finish())
	wantCode(t, s.Finish(), FailedPrecondition)
	// The ended sequence's pages are no longer its own: no page table or slots.
	_, err := s.PageTable()
	wantCode(t, err, FailedPrecondition)
	_, err = s.Slots()
	wantCode(t, err, FailedPrecondition)
	if n, err := s.CachedTokens(); err != nil || n != 0 {
		t.Fatalf("CachedTokens after finish: %d, %v", n, err)
	}
	wantCode(t, s.Abort(), FailedPrecondition)
	wantCode(t, s.Extend([]int32{1}), FailedPrecondition)

	a := admit(t, e, span(100, 20), nil)
	must(t, a.Abort())
	_, err = a.PageTable()
	wantCode(t, err, FailedPrecondition)
	err = a.Finish()
	got := wantCode(t, err, FailedPrecondition)
	if !strings.Contains(got.Message(), "abort") {
		t.Errorf("finish after abort: message %q does not say it was aborted", got.Message())
	}
	wantCode(t, a.Abort(), FailedPrecondition)
	must(t, a.Close())
	must(t, s.Close())
}

func TestMetricsText(t *testing.T) {
	e := newEngine(t, 16, 16)
	prompt := span(1, 32)
	for i := 0; i < 2; i++ { // the second hits 16 tokens
		s := admit(t, e, prompt, nil)
		must(t, s.Finish())
	}
	text, err := e.MetricsText()
	must(t, err)
	m, err := e.Metrics()
	must(t, err)
	if !strings.HasPrefix(text, "# HELP clm_") || !strings.HasSuffix(text, "\n") {
		t.Fatalf("not Prometheus text:\n%s", text)
	}
	for series, want := range map[string]float64{
		"clm_prefix_cache_queries_total":           float64(m.TokensQueried),
		"clm_prefix_cache_hits_total":              16,
		`clm_cached_tokens_total{source="device"}`: float64(m.TokensHit),
		"clm_sequences_finished_total":             2,
		"clm_evictable_tokens":                     float64(m.EvictableTokens),
	} {
		var got float64
		found := false
		for _, line := range strings.Split(text, "\n") {
			if strings.HasPrefix(line, series+" ") {
				_, err := fmt.Sscan(strings.TrimPrefix(line, series+" "), &got)
				must(t, err)
				found = true
			}
		}
		if !found || got != want {
			t.Errorf("%s: %v (found %v), want %v", series, got, found, want)
		}
	}
}

// MetricsText sizes its buffer with one call and fills it with the next; a
// goroutine serving meanwhile makes the text grow in between, and the retry
// loop must still return whole texts.
func TestMetricsTextWhileServing(t *testing.T) {
	e := newEngine(t, 64, 16)
	const requests = 400
	done := make(chan error, 1)
	go func() {
		for i := 0; i < requests; i++ {
			s, err := e.Admit(span(1+1000*(i%7), 1+i%50), nil)
			if err == nil {
				err = s.Finish()
				s.Close()
			}
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	last := -1.0
	check := func() {
		text, err := e.MetricsText()
		must(t, err)
		if !strings.HasPrefix(text, "# HELP clm_") || !strings.HasSuffix(text, "\n") {
			t.Fatalf("not Prometheus text:\n%s", text)
		}
		queried := -1.0
		for _, line := range strings.Split(text, "\n") {
			const series = "clm_prefix_cache_queries_total "
			if strings.HasPrefix(line, series) {
				_, err := fmt.Sscan(strings.TrimPrefix(line, series), &queried)
				must(t, err)
			}
		}
		if queried < 0 || queried < last {
			t.Fatalf("clm_prefix_cache_queries_total went from %v to %v", last, queried)
		}
		last = queried
	}
	for serving := true; serving; {
		select {
		case err := <-done:
			must(t, err)
			serving = false
		default:
		}
		check()
	}
	m, err := e.Metrics()
	must(t, err)
	if m.Finished != requests || last != float64(m.TokensQueried) {
		t.Fatalf("finished %d, want %d; last text counted %v queried tokens, want %d", m.Finished, requests, last,
			m.TokensQueried)
	}
}

func TestMetrics(t *testing.T) {
	const pageSize, numPages = 16, 64
	e := newEngine(t, numPages, pageSize)
	m0, err := e.Metrics()
	must(t, err)
	if m0 != (Metrics{PagesFree: numPages, MetadataBytes: m0.MetadataBytes, SRCThreshold: m0.SRCThreshold}) {
		t.Fatalf("fresh engine: %+v", m0)
	}
	if math.Abs(m0.SRCThreshold-0.8) > 1e-6 { // the default: 10000 requests/day
		t.Fatalf("fresh engine: SRC threshold %v, want 0.8", m0.SRCThreshold)
	}

	// A: 40 prompt + 8 output tokens, finished: stores 48 tokens (3 pages).
	promptA := span(0, 40)
	a := admit(t, e, promptA, nil)
	outA := span(700, 8)
	must(t, a.Extend(outA))
	must(t, a.Finish())
	// B continues A's conversation and stays running, holding the prefix.
	promptB := concat(promptA, outA, span(800, 22)) // 70 tokens
	b := admit(t, e, promptB, nil)
	hitB := expectedCached(48, len(promptB), pageSize)
	if cached(t, b) != hitB {
		t.Fatalf("B: %d cached, want %d", cached(t, b), hitB)
	}
	// C is aborted.
	c := admit(t, e, span(900, 20), nil)
	must(t, c.Abort())

	pagesB := (len(promptB) + pageSize - 1) / pageSize
	m, err := e.Metrics()
	must(t, err)
	queried := uint64(len(promptA) + len(promptB) + 20)
	// Where the three lookups stopped matching: A and C at 0, B at hitB; none
	// split off a longer cached path.
	var depths [19]uint64
	depths[0] = 2
	depths[depthBucket(hitB)]++
	want := Metrics{
		TokensQueried:   queried,
		TokensHit:       uint64(hitB),
		HitRate:         float64(hitB) / float64(queried),
		CachedTokens:    48,
		EvictableTokens: 0,             // B holds the whole stored prefix locked
		ProtectedTokens: 48,            // (locked tokens)
		PagesUsed:       int32(pagesB), // 3 of them the tree's, 2 B's own
		PagesFree:       int32(numPages - pagesB),
		InsertedTokens:  48,
		Admitted:        3,
		Finished:        1,
		Aborted:         1,
		ActiveSequences: 1,
		MetadataBytes:   m.MetadataBytes,
		SRCThreshold:    m0.SRCThreshold, // no SRC step ran: the SRC counters stay zero

		MatchDepthCounts:    depths,
		MatchDepthSumTokens: uint64(hitB),
	}
	if m != want {
		t.Fatalf("metrics\n got %+v\nwant %+v", m, want)
	}
	if m.MetadataBytes == 0 {
		t.Fatal("no metadata bytes")
	}

	must(t, b.Finish())
	m, err = e.Metrics()
	must(t, err)
	stored := alignDown(len(promptB), pageSize)
	if m.Finished != 2 || m.ActiveSequences != 0 || m.CachedTokens != int64(stored) ||
		m.InsertedTokens != uint64(stored) || m.EvictableTokens != int64(stored) || m.ProtectedTokens != 0 ||
		m.PagesUsed != int32(stored/pageSize) || m.PagesUsed+m.PagesFree != numPages {
		t.Fatalf("after B finished: %+v", m)
	}
}

func TestKVLayout(t *testing.T) {
	opts, err := DefaultEngineOptions()
	must(t, err)
	opts.NumPages, opts.PageSize, opts.NumLayers, opts.KVHeads, opts.HeadDim = 8, 4, 3, 2, 16
	e, err := NewEngine(opts)
	must(t, err)
	defer e.Close()
	l, err := e.KVLayout()
	must(t, err)
	layer := uint64(2 * 4 * 2 * 16 * 2) // K and V, page_size x kv_heads x head_dim, f16
	if l.Base == nil || l.LayerBytes != layer || l.PageBytes != 3*layer || l.NumPages != 8 || l.PageSize != 4 ||
		l.NumLayers != 3 || l.KVHeads != 2 || l.HeadDim != 16 || l.KVDType != KVF16 || l.Memory != MemoryHost {
		t.Fatalf("layout %+v", l)
	}
	// The host writes a token's K row at its slot.
	s, err := e.Admit(span(0, 5), nil)
	must(t, err)
	defer s.Close()
	slots, err := s.Slots()
	must(t, err)
	pool := unsafe.Slice((*byte)(l.Base), int(l.PageBytes)*int(l.NumPages))
	slot := slots[4]
	page, row := uint64(slot)/uint64(l.PageSize), uint64(slot)%uint64(l.PageSize)
	rowBytes := uint64(l.KVHeads) * uint64(l.HeadDim) * 2
	off := page*l.PageBytes + 2*l.LayerBytes + row*rowBytes // layer 2, K
	for i := uint64(0); i < rowBytes; i++ {
		pool[off+i] = 0x5a
	}

	opts.Memory = MemoryNone
	e2, err := NewEngine(opts)
	must(t, err)
	defer e2.Close()
	l2, err := e2.KVLayout()
	must(t, err)
	if l2.Base != nil || l2.Memory != MemoryNone {
		t.Fatalf("MemoryNone layout %+v", l2)
	}
}

func TestFinalizerFreesForgottenSeq(t *testing.T) {
	e := newEngine(t, 64, 16)
	func() {
		s, err := e.Admit(span(0, 20), nil)
		must(t, err)
		_ = s // dropped without Close
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		m, err := e.Metrics()
		must(t, err)
		if m.ActiveSequences == 0 {
			if m.Aborted != 1 || m.PagesFree != 64 {
				t.Fatalf("after the finalizer: %+v", m)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the Seq finalizer never freed the sequence")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// An engine dropped without Close is freed too (nothing to observe but no crash).
	func() {
		opts, _ := DefaultEngineOptions()
		opts.NumPages = 4
		e2, err := NewEngine(opts)
		must(t, err)
		_, err = e2.Admit(span(0, 3), nil)
		must(t, err)
	}()
	for i := 0; i < 3; i++ {
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
	}
}

// Several goroutines admit, extend, finish and abort on one engine, and make
// calls that fail: each failure must carry its own call's message (the
// thread-local clm_last_error read on the right OS thread).
func TestConcurrentSequences(t *testing.T) {
	const pageSize, numPages, workers, rounds = 16, 4096, 8, 1000
	e := newEngine(t, numPages, pageSize)
	system := span(0, 64) // a shared system prompt
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	var finished, aborted [workers]int
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			fail := func(format string, args ...any) {
				errs <- fmt.Errorf("worker %d: "+format, append([]any{w}, args...)...)
			}
			for r := 0; r < rounds; r++ {
				prompt := concat(system, span(1000000*(w+1)+r*50, 10+r%30))
				s, err := e.Admit(prompt, &AdmitOptions{Priority: int32(r % 100)})
				if err != nil {
					fail("admit: %v", err)
					return
				}
				c, err := s.CachedTokens()
				if err != nil || int(c)%pageSize != 0 || int(c) > len(prompt)-1 {
					fail("cached %d of %d: %v", c, len(prompt), err)
					return
				}
				if err := s.Extend(span(200, 1+r%20)); err != nil {
					fail("extend: %v", err)
					return
				}
				switch r % 5 {
				case 0:
					// A bad token id unique to this call: the message must name it.
					bad := int32(-(w*1000 + r + 1))
					err := s.Extend([]int32{bad})
					var ce *Error
					if !errors.As(err, &ce) || ce.Code() != InvalidArgument ||
						!strings.Contains(ce.Message(), fmt.Sprint(bad)) {
						fail("extend(%d): %v", bad, err)
						return
					}
				case 1:
					// A bad priority unique to this call.
					p := int32(1000 + w*1000 + r)
					_, err := e.Admit(prompt, &AdmitOptions{Priority: p})
					if CodeOf(err) != InvalidArgument || !strings.Contains(err.Error(), fmt.Sprint(p)) {
						fail("admit(priority %d): %v", p, err)
						return
					}
				}
				if r%3 == 0 {
					err = s.Abort()
					aborted[w]++
				} else {
					err = s.Finish()
					finished[w]++
				}
				if err != nil {
					fail("end: %v", err)
					return
				}
				if r%4 == 0 {
					err := s.Finish()
					if CodeOf(err) != FailedPrecondition || !strings.Contains(err.Error(), "already") {
						fail("second finish: %v", err)
						return
					}
				}
				s.Close()
				if r%10 == 0 {
					if _, err := e.Metrics(); err != nil {
						fail("metrics: %v", err)
						return
					}
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	m, err := e.Metrics()
	must(t, err)
	var nf, na int
	for w := 0; w < workers; w++ {
		nf += finished[w]
		na += aborted[w]
	}
	if m.Admitted != workers*rounds || m.Finished != uint64(nf) || m.Aborted != uint64(na) ||
		m.ActiveSequences != 0 || m.PagesUsed+m.PagesFree != numPages ||
		int64(m.PagesUsed)*pageSize != m.CachedTokens || m.TokensHit == 0 {
		t.Fatalf("after %d sequences (%d finished, %d aborted): %+v", workers*rounds, nf, na, m)
	}
	t.Logf("%d sequences: %d hit of %d queried tokens, %d evictions", workers*rounds, m.TokensHit, m.TokensQueried,
		m.Evictions)
}

// Close racing with calls from other goroutines must not crash: every call
// either completes or reports the closed handle.
func TestCloseRacesWithCalls(t *testing.T) {
	opts, err := DefaultEngineOptions()
	must(t, err)
	opts.NumPages, opts.HeadDim = 1024, 8
	for round := 0; round < 20; round++ {
		e, err := NewEngine(opts)
		must(t, err)
		var wg sync.WaitGroup
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for i := 0; i < 50; i++ {
					s, err := e.Admit(span(w*1000+i, 20), nil)
					if err != nil {
						if !errors.Is(err, ErrClosed) {
							t.Errorf("admit: %v", err)
						}
						return
					}
					if err := s.Finish(); err != nil && CodeOf(err) != FailedPrecondition {
						t.Errorf("finish: %v", err)
					}
					s.Close()
				}
			}(w)
		}
		time.Sleep(time.Duration(round%5) * time.Millisecond)
		e.Close()
		wg.Wait()
	}
}

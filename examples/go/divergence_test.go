package clm

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// Divergence hot spots through the real library (docs/observability.md), on
// fresh random prompts each run (the seed is logged): a timestamp planted at a
// random depth of one named tenant's system prompt is the report's first
// point, within a page of that depth, with no hits, a split for every request
// after the first, and the tokens either side as the requests and the cached
// path had them; another tenant's conversations make one ordinary point whose
// branches and hits are worked out here exactly. The match-depth histogram
// equals one built from each admission's cached tokens, and the diverged
// lookups are the splits. A tenant admitted without a name is "salt:" and the
// first 32 hex digits of its salt's SHA-256 (saltKey, events_test.go), never
// its salt; a report for an unknown tenant is empty. Switched off, the report
// is FailedPrecondition and the counters stay 0. Then defaults and bad input.

const divPage = 16

func divOptions(t *testing.T, edit func(*EngineOptions)) *Engine {
	t.Helper()
	opts, err := DefaultEngineOptions()
	must(t, err)
	opts.NumPages, opts.PageSize, opts.Memory = 4096, divPage, MemoryNone
	if edit != nil {
		edit(&opts)
	}
	e, err := NewEngine(opts)
	must(t, err)
	t.Cleanup(func() { e.Close() })
	return e
}

// depthBucket is the bucket of Metrics.MatchDepthCounts a lookup that matched
// depth tokens falls in, from clm.h's words: upper bounds 0, 16, 32, ...,
// 2^20 (buckets 0..17), then above (18).
func depthBucket(depth int) int {
	bound := 0
	for bucket := 0; bucket < 18; bucket++ {
		if depth <= bound {
			return bucket
		}
		if bound == 0 {
			bound = 16
		} else {
			bound *= 2
		}
	}
	return 18
}

// depths is what the engine's match-depth counters must say: a histogram of
// each admission's cached tokens (no host tier: a lookup's match is its
// cached prefix).
type depths struct {
	counts [19]uint64
	sum    uint64
	n      int
}

// request runs one request to its end: admit, one decoded token, finish.
func (d *depths) request(t *testing.T, e *Engine, prompt []int32, opts *AdmitOptions) {
	t.Helper()
	s, err := e.Admit(prompt, opts)
	must(t, err)
	defer s.Close()
	c := cached(t, s)
	d.counts[depthBucket(c)]++
	d.sum += uint64(c)
	d.n++
	must(t, s.Extend([]int32{7}))
	must(t, s.Finish())
}

func (d *depths) check(t *testing.T, m Metrics) {
	t.Helper()
	var total uint64
	for _, c := range m.MatchDepthCounts {
		total += c
	}
	if total != uint64(d.n) {
		t.Fatalf("the match-depth counts add up to %d, want %d admissions", total, d.n)
	}
	if m.MatchDepthCounts != d.counts || m.MatchDepthSumTokens != d.sum {
		t.Fatalf("match depths %v (sum %d), want %v (sum %d)", m.MatchDepthCounts, m.MatchDepthSumTokens, d.counts,
			d.sum)
	}
}

func report(t *testing.T, e *Engine, top int, minBranches uint64, tenant string) *DivergenceReport {
	t.Helper()
	r, err := e.DivergenceReport(top, minBranches, tenant)
	must(t, err)
	return r
}

// somePromptHas says whether a prompt has before just before token depth and
// after from it.
func somePromptHas(prompts [][]int32, depth int, before, after []int32) bool {
	for _, p := range prompts {
		if depth >= len(before) && len(p) >= depth+len(after) &&
			reflect.DeepEqual(p[depth-len(before):depth], before) && reflect.DeepEqual(p[depth:depth+len(after)], after) {
			return true
		}
	}
	return false
}

func TestDivergenceTimestampAndChat(t *testing.T) {
	r := tierRand(t)
	context := divPage + r.Intn(divPage+1) // >= a page: the split's difference is in After
	windowMS := int32(600000 + r.Intn(7200000))
	e := divOptions(t, func(o *EngineOptions) {
		o.DivergenceContextTokens = int32(context)
		o.DivergenceWindowMS = windowMS
	})
	planted := 64 + r.Intn(237) // [64, 300]
	system := make([]int32, 400)
	for i := range system {
		system[i] = int32(100 + r.Intn(49900))
	}
	t.Logf("timestamp at token %d, context %d", planted, context)
	var d depths

	// acme: every request carries the time (a second a request, two digit
	// tokens) at token planted, then a question of its own.
	acme := &AdmitOptions{CacheSalt: "secret-salt-acme", Tenant: "acme"}
	var acmePrompts [][]int32
	// globex: conversations under one system prompt, each growing turn by
	// turn (a turn's prompt is the last one, its decoded token, and more).
	globex := &AdmitOptions{CacheSalt: "secret-salt-globex", Tenant: "globex", AdapterID: 5}
	globexSystem := 48 + r.Intn(150)
	conversations := 2 + r.Intn(3)
	turns := 60 / conversations
	chats := make([][]int32, conversations)
	for c := range chats {
		chats[c] = append([]int32(nil), system[:globexSystem]...)
	}
	var firstTurns [][]int32
	for i := 0; i < 60; i++ {
		prompt := append([]int32(nil), system...)
		prompt[planted], prompt[planted+1] = int32(i/10), int32(i%10)
		for k := 0; k < 20; k++ {
			prompt = append(prompt, int32(60000+20*i+k))
		}
		d.request(t, e, prompt, acme)
		acmePrompts = append(acmePrompts, prompt)
		if i >= turns {
			continue
		}
		for c := range chats {
			if i > 0 {
				chats[c] = append(chats[c], 7)
			}
			words := 64
			if i > 0 {
				words = 1 + r.Intn(30)
			}
			for k := 0; k < words; k++ {
				chats[c] = append(chats[c], int32(100000*(c+1)+r.Intn(50000)))
			}
			d.request(t, e, chats[c], globex)
			if i == 0 {
				firstTurns = append(firstTurns, append([]int32(nil), chats[c]...))
			}
		}
	}

	rep := report(t, e, 3, 2, "")
	if rep.WindowMS != int64(windowMS) {
		t.Fatalf("window %d ms, want %d", rep.WindowMS, windowMS)
	}
	if len(rep.Points) == 0 {
		t.Fatal("an empty report")
	}
	top := rep.Points[0]
	depth := int(top.Depth)
	if top.Tenant != "acme" || depth-planted > divPage || planted-depth > divPage || depth%divPage != 0 ||
		top.Branches < 50 || top.Hits != 0 || top.Overcount != 0 || top.AdapterID != 0 || top.Unreused() != top.Branches {
		t.Fatalf("first point %+v, want acme's within a page of %d, >= 50 branches, no hits", top, planted)
	}
	if len(top.Before) != context || len(top.After) != context || len(top.CachedAfter) != context {
		t.Fatalf("context %d/%d/%d tokens, want %d", len(top.Before), len(top.After), len(top.CachedAfter), context)
	}
	if !somePromptHas(acmePrompts[1:], depth, top.Before, top.After) ||
		!somePromptHas(acmePrompts, depth, top.Before, top.CachedAfter) ||
		reflect.DeepEqual(top.After, top.CachedAfter) {
		t.Fatalf("the context of %+v is not a request's and the cached path's", top)
	}
	for _, p := range rep.Points {
		if (p.Tenant != "acme" && p.Tenant != "globex") || strings.Contains(p.Tenant, "secret") {
			t.Fatalf("a point of tenant %q", p.Tenant)
		}
	}
	// Every acme request after the first split off, at one point or two
	// (when the time's two digits straddle a page).
	all := report(t, e, 10, 1, "acme")
	var branches uint64
	for _, p := range all.Points {
		if p.Tenant != "acme" {
			t.Fatalf("acme's report has a point of %q", p.Tenant)
		}
		branches += p.Branches
	}
	if branches != 59 || !reflect.DeepEqual(all.Points[0], top) {
		t.Fatalf("acme's points %+v: %d branches, want 59, the first %+v", all.Points, branches, top)
	}

	// globex: one point, where its conversations part at the end of the
	// system prompt: split off by every conversation but the first, passed
	// by every later turn.
	at := globexSystem / divPage * divPage
	want := BranchPoint{
		Tenant:      "globex",
		AdapterID:   5,
		Depth:       int32(at),
		Branches:    uint64(conversations - 1),
		Hits:        uint64(conversations * (turns - 1)),
		Before:      firstTurns[1][at-context : at],
		After:       firstTurns[1][at : at+context],
		CachedAfter: firstTurns[0][at : at+context],
	}
	if got := report(t, e, 5, 1, "globex").Points; len(got) != 1 || !reflect.DeepEqual(got[0], want) {
		t.Fatalf("globex (%d conversations): %+v, want %+v", conversations, got, want)
	}
	var second *BranchPoint
	for i := range rep.Points {
		if rep.Points[i].Tenant == "globex" {
			second = &rep.Points[i]
		}
	}
	if (want.Branches >= 2) != (second != nil) || (second != nil && !reflect.DeepEqual(*second, want)) {
		t.Fatalf("globex in the report of >= 2 branches: %+v, want %+v", second, want)
	}

	m := metricsOf(t, e)
	d.check(t, m)
	if m.DivergedLookups != uint64(59+conversations-1) || m.Admitted != uint64(d.n) {
		t.Fatalf("%d diverged lookups, %d admitted; want %d, %d", m.DivergedLookups, m.Admitted, 59+conversations-1, d.n)
	}
	for i, b := range MatchDepthBounds {
		if depthBucket(int(b)) != i {
			t.Fatalf("MatchDepthBounds[%d] = %d is in bucket %d", i, b, depthBucket(int(b)))
		}
	}
	// Nobody by that name; never by a salt.
	for _, unknown := range []string{"nobody", "secret-salt-acme", "ACME"} {
		if got := report(t, e, 5, 1, unknown); len(got.Points) != 0 {
			t.Fatalf("a report for %q: %+v", unknown, got.Points)
		}
	}
}

func TestDivergenceUnnamedTenantIsItsSaltsDigest(t *testing.T) {
	r := tierRand(t)
	e := divOptions(t, nil)
	salt := fmt.Sprintf("salt-%016x", r.Uint64())
	digest := saltKey(salt)
	shared := randomPrompt(r, 2*divPage)
	splits := 3 + r.Intn(5)
	var d depths
	// Each request shares two pages with the first, then goes its own way:
	// every one after the first splits off at token 32.
	for _, tenant := range []struct {
		opts   *AdmitOptions
		offset int
	}{{&AdmitOptions{CacheSalt: salt}, 0}, {nil, 1000000}} {
		for q := 0; q <= splits; q++ {
			prompt := append([]int32(nil), shared...)
			for k := 0; k < divPage+5; k++ {
				prompt = append(prompt, int32(tenant.offset+1000*(q+1)+k))
			}
			d.request(t, e, prompt, tenant.opts)
		}
	}
	rep := report(t, e, 5, 1, "")
	names := map[string]bool{}
	for _, p := range rep.Points {
		names[p.Tenant] = true
		if strings.Contains(p.Tenant, salt) || p.Depth != 2*divPage || p.Branches != uint64(splits) || p.Hits != 0 ||
			!reflect.DeepEqual(p.Before, shared[2*divPage-8:]) {
			t.Fatalf("point %+v, want %d branches at %d", p, splits, 2*divPage)
		}
	}
	if len(rep.Points) != 2 || !names[digest] || !names[""] {
		t.Fatalf("tenants %v, want %q and \"\"", names, digest)
	}
	if only := report(t, e, 5, 1, digest); len(only.Points) != 1 || only.Points[0].Tenant != digest {
		t.Fatalf("the digest's report: %+v", only.Points)
	}
	for _, unknown := range []string{salt, "salt:00000000000000000000000000000000", "nobody"} {
		if got := report(t, e, 5, 1, unknown); len(got.Points) != 0 {
			t.Fatalf("a report for %q: %+v", unknown, got.Points)
		}
	}
	if got := report(t, e, 5, uint64(splits)+1, ""); len(got.Points) != 0 {
		t.Fatalf("min branches above every count: %+v", got.Points)
	}
	m := metricsOf(t, e)
	d.check(t, m)
	if m.DivergedLookups != uint64(2*splits) {
		t.Fatalf("%d diverged lookups, want %d", m.DivergedLookups, 2*splits)
	}
}

func TestDivergenceOff(t *testing.T) {
	prompt := span(1, 40)
	traffic := func(e *Engine) {
		for q := 0; q < 3; q++ {
			p := append([]int32(nil), prompt...)
			p[20] = int32(1000 + q)
			s := admit(t, e, p, nil)
			must(t, s.Finish())
		}
	}
	off := divOptions(t, func(o *EngineOptions) { o.Divergence = false })
	traffic(off)
	_, err := off.DivergenceReport(3, 1, "")
	wantCode(t, err, FailedPrecondition)
	m := metricsOf(t, off)
	if m.DivergedLookups != 0 || m.MatchDepthCounts != [19]uint64{} || m.MatchDepthSumTokens != 0 || m.Admitted != 3 {
		t.Fatalf("counters with divergence off: %+v", m)
	}
	// On, the same traffic is counted.
	on := divOptions(t, nil)
	traffic(on)
	m = metricsOf(t, on)
	var lookups uint64
	for _, c := range m.MatchDepthCounts {
		lookups += c
	}
	if m.DivergedLookups != 2 || lookups != 3 || len(report(t, on, 3, 1, "").Points) != 1 {
		t.Fatalf("counters with divergence on: %+v", m)
	}
}

func TestDivergenceDefaultsAndBadInput(t *testing.T) {
	d, err := DefaultEngineOptions()
	must(t, err)
	if !d.Divergence || d.DivergenceBranchPoints != 256 || d.DivergenceWindowMS != 3600000 ||
		d.DivergenceContextTokens != 8 {
		t.Fatalf("divergence defaults differ from clm.h's documentation: %+v", d)
	}
	for name, c := range map[string]struct {
		edit  func(*EngineOptions)
		field string
	}{
		"branch points 15":     {func(o *EngineOptions) { o.DivergenceBranchPoints = 15 }, "branch_points"},
		"branch points 2^16+1": {func(o *EngineOptions) { o.DivergenceBranchPoints = 65537 }, "branch_points"},
		"window 1 ms":          {func(o *EngineOptions) { o.DivergenceWindowMS = 1 }, "window_ms"},
		"context -1":           {func(o *EngineOptions) { o.DivergenceContextTokens = -1 }, "context_tokens"},
		"context 65":           {func(o *EngineOptions) { o.DivergenceContextTokens = 65 }, "context_tokens"},
	} {
		opts := d
		opts.NumPages = 64
		c.edit(&opts)
		_, err := NewEngine(opts)
		if e := wantCode(t, err, InvalidArgument); !strings.Contains(e.Message(), c.field) {
			t.Fatalf("%s: %v does not name %s", name, err, c.field)
		}
	}
	e := divOptions(t, nil)
	if got := report(t, e, 1, 0, ""); len(got.Points) != 0 || got.WindowMS != 3600000 {
		t.Fatalf("a fresh engine's report: %+v", got)
	}
	for _, top := range []int{0, -1, -1 << 40} {
		_, err := e.DivergenceReport(top, 1, "")
		wantCode(t, err, InvalidArgument)
	}
	_, err = e.DivergenceReport(1, 1, strings.Repeat("t", 1<<16+1))
	wantCode(t, err, InvalidArgument)
	// A name is carried whole, bytes and all.
	named := &AdmitOptions{Tenant: "tenant ü/7\x00x"}
	prompt := span(1, 40)
	s := admit(t, e, prompt, named)
	must(t, s.Finish())
	other := append([]int32(nil), prompt...)
	other[20] = 999
	s = admit(t, e, other, named)
	must(t, s.Finish())
	if got := report(t, e, 1, 1, named.Tenant); len(got.Points) != 1 || got.Points[0].Tenant != named.Tenant ||
		got.Points[0].Depth != divPage {
		t.Fatalf("a named tenant's report: %+v", got.Points)
	}
	e.Close()
	_, err = e.DivergenceReport(1, 1, "")
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("a report on a closed engine: %v", err)
	}
}

package clm

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// CLM anomalies through the real library (docs/observability.md), against a
// naive model written here from clm.h's words: it keeps every sighting's
// score (one per sequence and key, however often the sequence looks the key
// up), takes exact lower medians, and says which keys are low-SRC (at least
// ClmWatchMinSightings sightings, median below ClmWatchLowSrc) and when each
// turned low-SRC. Sequences get their scores from a constant SRC head (W1,
// W2 zero, B2 = logit(score): sigmoid(B2) whatever the rows), as
// tests/store/test_clm_watch.cpp does, on fresh random draws each run (the
// seed is logged). Then the store's events (a first and a distant second
// version, an administrator's blacklist with its reason, its lifting, a
// blacklist of a tenant never seen), each line of OnClmWatchLine parsed
// with encoding/json and equal to the report's event JSON, names never the
// salt, and metrics that agree with the report. Then the newest-events cap,
// the switch, no store, defaults, bad options, and a callback that panics.

const watchDim, watchHidden = 8, 8

// lineLog keeps the lines OnClmWatchLine got.
type lineLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *lineLog) add(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, line)
}

func (l *lineLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// watchEngine is an engine with a small in-memory store whose every SRC step
// looks up (threshold 0), its lines going to the returned log.
func watchEngine(t *testing.T, edit func(*EngineOptions)) (*Engine, *lineLog) {
	t.Helper()
	opts, err := DefaultEngineOptions()
	must(t, err)
	opts.NumPages, opts.PageSize, opts.Memory = 4096, 4, MemoryNone
	opts.SnapshotStorePath = ":memory:"
	opts.SnapshotStoreShards = 2
	opts.SnapshotDim = watchDim
	opts.SnapshotMinUsage = 1
	opts.SnapshotLookupTimeoutUS = 2_000_000
	opts.SRCThreshold = 0
	log := &lineLog{}
	opts.OnClmWatchLine = log.add
	if edit != nil {
		edit(&opts)
	}
	e, err := NewEngine(opts)
	must(t, err)
	t.Cleanup(func() { e.Close() })
	return e, log
}

// constantHead scores every sequence sigmoid(B2) = score.
func constantHead(score float32) SRCHeadWeights {
	inner := watchHidden / 4
	return SRCHeadWeights{Hidden: watchHidden, W1: make([]float32, inner*watchHidden), B1: make([]float32, inner),
		W2: make([]float32, inner), B2: float32(math.Log(float64(score) / (1 - float64(score))))}
}

// watchSequence admits a sequence with opts, scores it once with a head of
// score, looks key up `lookups` times and finishes it. It returns the score
// the engine gave it.
func watchSequence(t *testing.T, e *Engine, opts *AdmitOptions, score float32, key string, lookups int) float32 {
	t.Helper()
	s, err := e.Admit(span(11, 5), opts)
	must(t, err)
	defer s.Close()
	must(t, e.SetSRCHead(constantHead(score), GeluTanh))
	rows := make([]float32, watchHidden)
	for i := range rows {
		rows[i] = 0.5
	}
	d, err := e.SRCStep([]*Seq{s}, F32Rows(rows), watchHidden, []int32{42}, []int32{0, 1})
	must(t, err)
	if len(d) != 1 || !d[0].Scored || math.Abs(float64(d[0].Score-score)) > 1e-5 {
		t.Fatalf("a head of %g scored %+v", score, d)
	}
	for i := 0; i < lookups; i++ {
		_, err := e.LookupSnapshots([]*Seq{s}, []Suffix{KeySuffix(key, "g")}, nil)
		must(t, err)
	}
	must(t, s.Finish())
	return d[0].Score
}

// watchKey is a watched key as the naive model names it (each tenant of these
// tests has one salt and one adapter).
type watchKey struct {
	tenant  string
	adapter int32
	key     string
}

type naiveLow struct {
	watchKey
	sightings int
	median    float32
}

// naiveWatch is the model: every sighting's score, exact lower medians.
type naiveWatch struct {
	minSightings int
	lowSrc       float32
	scores       map[watchKey][]float32
	flagged      map[watchKey]bool // low-SRC as of the key's last sighting
	turns        []naiveLow        // each time a key turned low-SRC, in order
	sightings    int
}

func newNaiveWatch(minSightings int, lowSrc float32) *naiveWatch {
	return &naiveWatch{minSightings: minSightings, lowSrc: lowSrc, scores: map[watchKey][]float32{},
		flagged: map[watchKey]bool{}}
}

func (n *naiveWatch) stats(k watchKey) (int, float32) {
	s := append([]float32(nil), n.scores[k]...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return len(s), s[(len(s)+1)/2-1]
}

func (n *naiveWatch) sight(k watchKey, score float32) {
	n.sightings++
	n.scores[k] = append(n.scores[k], score)
	count, median := n.stats(k)
	low := count >= n.minSightings && median < n.lowSrc
	if low && !n.flagged[k] {
		n.turns = append(n.turns, naiveLow{k, count, median})
	}
	n.flagged[k] = low
}

// low is the keys low-SRC now, the most seen first, then by tenant and key.
func (n *naiveWatch) low() []naiveLow {
	var out []naiveLow
	for k := range n.scores {
		if count, median := n.stats(k); count >= n.minSightings && median < n.lowSrc {
			out = append(out, naiveLow{k, count, median})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.sightings != b.sightings {
			return a.sightings > b.sightings
		}
		if a.tenant != b.tenant {
			return a.tenant < b.tenant
		}
		return a.key < b.key
	})
	return out
}

// medianClose: the report's median is its bin's middle, within 0.0125.
func medianClose(got, want float32) bool { return math.Abs(float64(got-want)) <= 0.0125+1e-6 }

var saltName = regexp.MustCompile(`^salt:[0-9a-f]{32}$`)

// checkLines checks that the callback got exactly the report's events as
// JSON lines, and that each line says what its event says.
func checkLines(t *testing.T, lines []string, events []ClmEvent) {
	t.Helper()
	if len(lines) != len(events) {
		t.Fatalf("%d lines, %d events", len(lines), len(events))
	}
	for i, ev := range events {
		line := lines[i]
		if line != ev.JSON || strings.ContainsAny(line, "\n\x00") {
			t.Fatalf("line %d %q, the report's event JSON %q", i, line, ev.JSON)
		}
		dec := json.NewDecoder(strings.NewReader(line))
		dec.UseNumber()
		var j map[string]interface{}
		if err := dec.Decode(&j); err != nil || dec.More() {
			t.Fatalf("line %d %q does not parse as one JSON object: %v", i, line, err)
		}
		num := func(field string) json.Number {
			n, ok := j[field].(json.Number)
			if !ok {
				t.Fatalf("line %d %q: %s is not a number", i, line, field)
			}
			return n
		}
		integer := func(field string) int64 {
			v, err := num(field).Int64()
			if err != nil {
				t.Fatalf("line %d %q: %s: %v", i, line, field, err)
			}
			return v
		}
		fields := []string{"time_ms", "event", "tenant", "adapter_id", "key"}
		if j["event"] != ev.Kind.String() || j["tenant"] != ev.Tenant || j["key"] != ev.Key ||
			integer("time_ms") != ev.TimeMS || integer("adapter_id") != int64(ev.AdapterID) {
			t.Fatalf("line %d %q says otherwise than event %+v", i, line, ev)
		}
		switch ev.Kind {
		case ClmEventBlacklisted:
			by := "administrator"
			if ev.ByBreaker {
				by = "breaker"
			}
			if j["reason"] != ev.Reason || integer("until_ms") != ev.UntilMS || j["by"] != by {
				t.Fatalf("line %d %q, event %+v", i, line, ev)
			}
			fields = append(fields, "reason", "until_ms", "by")
		case ClmEventVersionCreated, ClmEventDrift:
			if integer("version") != int64(ev.Version) {
				t.Fatalf("line %d %q, event %+v", i, line, ev)
			}
			fields = append(fields, "version")
		case ClmEventLowSrc:
			median, err := num("median_src").Float64()
			if err != nil || integer("sightings") != int64(ev.Sightings) || float32(median) != ev.MedianSrc {
				t.Fatalf("line %d %q, event %+v", i, line, ev)
			}
			fields = append(fields, "sightings", "median_src")
		}
		if len(j) != len(fields) {
			t.Fatalf("line %d %q has %d fields, want %v", i, line, len(j), fields)
		}
	}
}

func TestClmAnomaliesLowSrcKeysAndStoreEvents(t *testing.T) {
	r := tierRand(t)
	minSightings := 4 + r.Intn(5)
	startMS := time.Now().UnixMilli()
	e, log := watchEngine(t, func(o *EngineOptions) { o.ClmWatchMinSightings = int64(minSightings) })
	model := newNaiveWatch(minSightings, 0.2) // the default threshold
	t.Logf("min sightings %d", minSightings)

	acme := &AdmitOptions{CacheSalt: "secret-salt-acme", Tenant: "acme"}
	globex := &AdmitOptions{CacheSalt: "secret-salt-globex", Tenant: "globex", AdapterID: 4}
	unnamedSalt := fmt.Sprintf("secret-salt-unnamed-%016x", r.Uint64())
	unnamed := &AdmitOptions{CacheSalt: unnamedSalt, AdapterID: 2}
	low := func() float32 { return 0.01 + 0.14*r.Float32() }
	high := func() float32 { return 0.3 + 0.6*r.Float32() } // below the breaker's 0.95
	mixed := func() float32 {
		if r.Intn(2) == 0 {
			return low()
		}
		return high()
	}
	type plan struct {
		opts  *AdmitOptions
		name  string
		key   string
		score func() float32
	}
	var sequences []plan
	add := func(n int, p plan) {
		for i := 0; i < n; i++ {
			sequences = append(sequences, p)
		}
	}
	add(minSightings+r.Intn(4), plan{acme, "acme", "REFUND-ORDER", low})
	add(minSightings-1, plan{acme, "acme", "RARE-KEY", low})          // too few
	add(minSightings+3, plan{acme, "acme", "SHIP-ORDER", high})       // scored high
	add(minSightings+2, plan{globex, "globex", "REFUND-ORDER", high}) // another tenant's
	add(minSightings+r.Intn(3), plan{unnamed, saltKey(unnamedSalt), "UNNAMED-KEY", low})
	add(2*minSightings, plan{acme, "acme", "MIXED-KEY", mixed})
	r.Shuffle(len(sequences), func(i, j int) { sequences[i], sequences[j] = sequences[j], sequences[i] })
	lookups := 0
	for _, p := range sequences {
		n := 1 + r.Intn(3) // one sighting however many lookups
		lookups += n
		score := watchSequence(t, e, p.opts, p.score(), p.key, n)
		model.sight(watchKey{p.name, p.opts.AdapterID, p.key}, score)
	}
	wantLow := model.low()
	if len(wantLow) < 2 || lookups <= model.sightings {
		t.Fatalf("the workload is too weak: %d low-SRC keys, %d lookups for %d sightings", len(wantLow), lookups,
			model.sightings)
	}

	rep, err := e.ClmAnomalies()
	must(t, err)
	if rep.WindowMS != 3600000 || rep.MinSightings != int64(minSightings) || rep.LowSrc != 0.2 {
		t.Fatalf("report settings %d ms, %d, %g", rep.WindowMS, rep.MinSightings, rep.LowSrc)
	}
	if len(rep.LowSrcKeys) != len(wantLow) {
		t.Fatalf("low-SRC keys %+v, want %+v", rep.LowSrcKeys, wantLow)
	}
	for i, k := range rep.LowSrcKeys {
		w := wantLow[i]
		if k.Tenant != w.tenant || k.AdapterID != w.adapter || k.Key != w.key || k.Sightings != uint64(w.sightings) ||
			!medianClose(k.MedianSrc, w.median) {
			t.Fatalf("low-SRC key %d: %+v, want %+v", i, k, w)
		}
		if strings.Contains(k.Tenant, "secret") || (k.Tenant != "acme" && !saltName.MatchString(k.Tenant)) {
			t.Fatalf("a low-SRC key of tenant %q", k.Tenant)
		}
	}
	if len(rep.Events) != len(model.turns) {
		t.Fatalf("events %+v, want the turns %+v", rep.Events, model.turns)
	}
	for i, ev := range rep.Events {
		w := model.turns[i]
		if ev.Kind != ClmEventLowSrc || ev.Tenant != w.tenant || ev.AdapterID != w.adapter || ev.Key != w.key ||
			ev.Sightings != uint64(w.sightings) || !medianClose(ev.MedianSrc, w.median) || ev.Reason != "" ||
			ev.UntilMS != 0 || ev.Version != 0 || ev.ByBreaker {
			t.Fatalf("event %d: %+v, want %+v", i, ev, w)
		}
	}
	checkLines(t, log.all(), rep.Events)
	m := metricsOf(t, e)
	flagged := 0
	for _, f := range model.flagged {
		if f {
			flagged++
		}
	}
	if m.ClmWatchSightings != uint64(model.sightings) || m.StoreLookups != uint64(lookups) ||
		m.ClmWatchLowSrcTurns != uint64(len(model.turns)) || m.ClmWatchWatchedKeys != int64(len(model.scores)) ||
		m.ClmWatchLowSrcKeys != int64(flagged) || m.ClmWatchLowSrcKeys != int64(len(rep.LowSrcKeys)) ||
		m.ClmWatchKeyEvents != [4]uint64{} {
		t.Fatalf("metrics %+v; want %d sightings of %d lookups, %d turns, %d keys, %d low-SRC", m, model.sightings,
			lookups, len(model.turns), len(model.scores), flagged)
	}

	// The store's events: a first version, a distant second, an
	// administrator's blacklist and its lifting, and a blacklist for a
	// tenant no lookup named.
	s := admit(t, e, span(21, 5), acme)
	refund := KeySuffix("REFUND-ORDER", "g")
	v1, v2 := make([]float32, watchDim), make([]float32, watchDim)
	v1[0], v2[1] = 1, 1
	if rec, err := e.RecordSnapshot(s, refund, v1); err != nil || rec.Result != RecordAdmitted || rec.Version != 1 {
		t.Fatalf("first record: %+v, %v", rec, err)
	}
	if rec, err := e.RecordSnapshot(s, refund, v2); err != nil || rec.Result != RecordNewVersion || rec.Version != 2 {
		t.Fatalf("second record: %+v, %v", rec, err)
	}
	until := time.Now().Add(time.Hour).UnixMilli()
	reason := "wrong answers reported by support \"tier 2\" ü"
	ship := KeySuffix("SHIP-ORDER", "g")
	must(t, e.BlacklistSnapshotKey(acme.CacheSalt, 0, ship, reason, until))
	must(t, e.UnblacklistSnapshotKey(acme.CacheSalt, 0, ship))
	quietSalt := "secret-salt-quiet"
	must(t, e.BlacklistSnapshotKey(quietSalt, 7, KeySuffix("QUIET-KEY", "g"), "never looked up", until+1))
	must(t, s.Finish())
	endMS := time.Now().UnixMilli()

	rep2, err := e.ClmAnomalies()
	must(t, err)
	if !reflect.DeepEqual(rep2.LowSrcKeys, rep.LowSrcKeys) {
		t.Fatalf("records and blacklists changed the low-SRC keys: %+v", rep2.LowSrcKeys)
	}
	want := append([]ClmEvent(nil), rep.Events...)
	want = append(want,
		ClmEvent{Kind: ClmEventVersionCreated, Tenant: "acme", Key: "REFUND-ORDER", Version: 1},
		ClmEvent{Kind: ClmEventVersionCreated, Tenant: "acme", Key: "REFUND-ORDER", Version: 2},
		ClmEvent{Kind: ClmEventBlacklisted, Tenant: "acme", Key: "SHIP-ORDER", Reason: reason, UntilMS: until},
		ClmEvent{Kind: ClmEventUnblacklisted, Tenant: "acme", Key: "SHIP-ORDER"},
		ClmEvent{Kind: ClmEventBlacklisted, Tenant: saltKey(quietSalt), AdapterID: 7, Key: "QUIET-KEY",
			Reason: "never looked up", UntilMS: until + 1})
	if len(rep2.Events) != len(want) {
		t.Fatalf("%d events %+v, want %d", len(rep2.Events), rep2.Events, len(want))
	}
	last := startMS
	for i, ev := range rep2.Events {
		if ev.TimeMS < last || ev.TimeMS > endMS {
			t.Fatalf("event %d at %d ms, after %d and by %d", i, ev.TimeMS, last, endMS)
		}
		last = ev.TimeMS
		if strings.Contains(ev.Tenant, "secret") || strings.Contains(ev.JSON, "secret") {
			t.Fatalf("event %d names a salt: %+v", i, ev)
		}
		if i < len(rep.Events) {
			if ev != rep.Events[i] {
				t.Fatalf("event %d changed: %+v, was %+v", i, ev, rep.Events[i])
			}
			continue
		}
		got := ev
		got.TimeMS, got.JSON = 0, ""
		if got != want[i] {
			t.Fatalf("event %d: %+v, want %+v", i, ev, want[i])
		}
	}
	checkLines(t, log.all(), rep2.Events)
	m = metricsOf(t, e)
	var keyEvents [4]uint64
	keyEvents[ClmEventBlacklisted], keyEvents[ClmEventUnblacklisted], keyEvents[ClmEventVersionCreated] = 2, 1, 2
	if m.ClmWatchKeyEvents != keyEvents || m.ClmWatchSightings != uint64(model.sightings) ||
		m.ClmWatchLowSrcTurns != uint64(len(model.turns)) || m.StoreVersions != 1 || m.StoreAdmissions != 1 ||
		m.StoreBlacklistedKeys != 1 {
		t.Fatalf("metrics after the store's events: %+v, want key events %v", m, keyEvents)
	}
	if ClmEventKind(9).String() != "ClmEventKind(9)" {
		t.Fatalf("an unknown kind: %q", ClmEventKind(9).String())
	}
}

func TestClmWatchMaxEventsKeepsTheNewest(t *testing.T) {
	for _, maxEvents := range []int32{0, 2} {
		t.Run(fmt.Sprint(maxEvents), func(t *testing.T) {
			e, log := watchEngine(t, func(o *EngineOptions) { o.ClmWatchMaxEvents = maxEvents })
			// No salt, no name: tenant "". Five orthogonal records: versions 1..5.
			s := admit(t, e, span(1, 5), nil)
			for v := 0; v < 5; v++ {
				snap := make([]float32, watchDim)
				snap[v] = 1
				rec, err := e.RecordSnapshot(s, KeySuffix("K", ""), snap)
				if err != nil || rec.Version != int32(v+1) {
					t.Fatalf("record %d: %+v, %v", v, rec, err)
				}
			}
			lines := log.all()
			rep, err := e.ClmAnomalies()
			must(t, err)
			if len(lines) != 5 || len(rep.Events) != int(maxEvents) {
				t.Fatalf("%d lines, %d events; want 5, %d", len(lines), len(rep.Events), maxEvents)
			}
			checkLines(t, lines[5-maxEvents:], rep.Events)
			for i, ev := range rep.Events {
				if ev.Kind != ClmEventVersionCreated || ev.Version != int32(5-int(maxEvents)+i+1) || ev.Tenant != "" {
					t.Fatalf("event %d: %+v", i, ev)
				}
			}
			if m := metricsOf(t, e); m.ClmWatchKeyEvents[ClmEventVersionCreated] != 5 {
				t.Fatalf("metrics count %d versions", m.ClmWatchKeyEvents[ClmEventVersionCreated])
			}
		})
	}
}

func TestClmWatchOffAndWithoutStore(t *testing.T) {
	// No store: no CLM, nothing to watch.
	plain, log := watchEngine(t, func(o *EngineOptions) { o.SnapshotStorePath = "" })
	_, err := plain.ClmAnomalies()
	wantCode(t, err, FailedPrecondition)
	if m := metricsOf(t, plain); m.ClmWatchSightings != 0 || m.ClmWatchKeyEvents != [4]uint64{} ||
		m.ClmWatchWatchedKeys != 0 || m.HasSnapshotStore {
		t.Fatalf("metrics without a store: %+v", m)
	}

	// Off: the same traffic as a watched engine's is not counted.
	traffic := func(e *Engine) {
		for i := 0; i < 3; i++ {
			watchSequence(t, e, &AdmitOptions{Tenant: "acme"}, 0.05, "REFUND-ORDER", 2)
		}
		s := admit(t, e, span(1, 5), nil)
		if rec, err := e.RecordSnapshot(s, KeySuffix("REFUND-ORDER", "g"), []float32{1, 0, 0, 0, 0, 0, 0, 0}); err != nil ||
			rec.Result != RecordAdmitted {
			t.Fatalf("record: %+v, %v", rec, err)
		}
	}
	off, offLog := watchEngine(t, func(o *EngineOptions) { o.ClmWatch = false; o.ClmWatchMinSightings = 3 })
	traffic(off)
	_, err = off.ClmAnomalies()
	wantCode(t, err, FailedPrecondition)
	m := metricsOf(t, off)
	if m.ClmWatchSightings != 0 || m.ClmWatchLowSrcTurns != 0 || m.ClmWatchKeyEvents != [4]uint64{} ||
		m.ClmWatchWatchedKeys != 0 || m.ClmWatchLowSrcKeys != 0 || m.StoreLookups != 6 || m.StoreAdmissions != 1 {
		t.Fatalf("metrics with the watch off: %+v", m)
	}
	if lines := append(log.all(), offLog.all()...); len(lines) != 0 {
		t.Fatalf("lines without a watch: %q", lines)
	}
	// On, it is.
	on, onLog := watchEngine(t, func(o *EngineOptions) { o.ClmWatchMinSightings = 3 })
	traffic(on)
	m = metricsOf(t, on)
	if m.ClmWatchSightings != 3 || m.ClmWatchLowSrcTurns != 1 || m.ClmWatchKeyEvents[ClmEventVersionCreated] != 1 ||
		len(onLog.all()) != 2 {
		t.Fatalf("metrics with the watch on: %+v, lines %q", m, onLog.all())
	}
}

func TestClmWatchDefaultsAndBadInput(t *testing.T) {
	d, err := DefaultEngineOptions()
	must(t, err)
	if !d.ClmWatch || d.ClmWatchMaxKeys != 4096 || d.ClmWatchWindowMS != 3600000 || d.ClmWatchMinSightings != 20 ||
		d.ClmWatchLowSrc != 0.2 || d.ClmWatchMaxEvents != 1024 || d.OnClmWatchLine != nil {
		t.Fatalf("CLM watch defaults differ from clm.h's documentation: %+v", d)
	}
	// The defaults reach the engine.
	e, _ := watchEngine(t, func(o *EngineOptions) { o.OnClmWatchLine = nil })
	rep, err := e.ClmAnomalies()
	must(t, err)
	if rep.WindowMS != 3600000 || rep.MinSightings != 20 || rep.LowSrc != 0.2 || rep.LowSrcKeys != nil ||
		rep.Events != nil {
		t.Fatalf("a fresh engine's report: %+v", rep)
	}

	before := clmWatchCallbacks.Load()
	for name, c := range map[string]struct {
		edit  func(*EngineOptions)
		field string
	}{
		"window 1 ms":          {func(o *EngineOptions) { o.ClmWatchWindowMS = 1 }, "window_ms"},
		"window -5 ms":         {func(o *EngineOptions) { o.ClmWatchWindowMS = -5 }, "window_ms"},
		"min sightings 0":      {func(o *EngineOptions) { o.ClmWatchMinSightings = 0 }, "min_sightings"},
		"low src 0":            {func(o *EngineOptions) { o.ClmWatchLowSrc = 0 }, "low_src"},
		"low src 1.5":          {func(o *EngineOptions) { o.ClmWatchLowSrc = 1.5 }, "low_src"},
		"low src NaN":          {func(o *EngineOptions) { o.ClmWatchLowSrc = float32(math.NaN()) }, "low_src"},
		"max keys 0":           {func(o *EngineOptions) { o.ClmWatchMaxKeys = 0 }, "max_keys"},
		"max keys 2^20+1":      {func(o *EngineOptions) { o.ClmWatchMaxKeys = 1<<20 + 1 }, "max_keys"},
		"max events -1":        {func(o *EngineOptions) { o.ClmWatchMaxEvents = -1 }, "max_events"},
		"max events 2^20+1":    {func(o *EngineOptions) { o.ClmWatchMaxEvents = 1<<20 + 1 }, "max_events"},
		"max keys 0, no store": {func(o *EngineOptions) { o.ClmWatchMaxKeys = 0; o.SnapshotStorePath = "" }, "max_keys"},
		"window 1 ms, off":     {func(o *EngineOptions) { o.ClmWatchWindowMS = 1; o.ClmWatch = false }, "window_ms"},
	} {
		opts := d
		opts.NumPages = 64
		opts.SnapshotStorePath, opts.SnapshotDim = ":memory:", watchDim
		opts.OnClmWatchLine = func(string) {}
		c.edit(&opts)
		e, err := NewEngine(opts)
		if e != nil {
			e.Close()
		}
		if got := wantCode(t, err, InvalidArgument); !strings.Contains(got.Message(), c.field) {
			t.Fatalf("%s: %v does not name %s", name, err, c.field)
		}
	}
	if got := clmWatchCallbacks.Load(); got != before {
		t.Fatalf("%d callbacks registered after failed creations, want %d", got, before)
	}

	// A callback stays registered while its engine lives.
	with, _ := watchEngine(t, nil)
	if got := clmWatchCallbacks.Load(); got != before+1 {
		t.Fatalf("%d callbacks registered with an engine, want %d", got, before+1)
	}
	with.Close()
	with.Close()
	if got := clmWatchCallbacks.Load(); got != before {
		t.Fatalf("%d callbacks registered after Close, want %d", got, before)
	}
	_, err = with.ClmAnomalies()
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("a report on a closed engine: %v", err)
	}
}

func TestClmWatchCallbackPanicIsRecovered(t *testing.T) {
	panics := clmWatchPanics.Load()
	var log lineLog
	e, _ := watchEngine(t, func(o *EngineOptions) {
		o.ClmWatchMinSightings = 2
		o.OnClmWatchLine = func(line string) {
			log.add(line)
			if len(log.all())%2 == 1 { // the first, third, ... line
				panic("a host's bug: " + line)
			}
		}
	})
	done := make(chan struct{})
	var events []ClmEvent
	var failure error
	go func() { // a lock left held by a panic through C would hang here
		defer close(done)
		failure = func() error {
			s, err := e.Admit(span(1, 5), &AdmitOptions{Tenant: "acme"})
			if err != nil {
				return err
			}
			defer s.Close()
			for v := 0; v < 3; v++ {
				snap := make([]float32, watchDim)
				snap[v] = 1
				if rec, err := e.RecordSnapshot(s, KeySuffix("K", ""), snap); err != nil || rec.Version != int32(v+1) {
					return fmt.Errorf("record %d: %+v, %v", v, rec, err)
				}
			}
			rep, err := e.ClmAnomalies()
			if err != nil {
				return err
			}
			events = rep.Events
			return s.Finish()
		}()
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the engine hangs after a callback panicked")
	}
	must(t, failure)
	if got := clmWatchPanics.Load() - panics; got != 2 {
		t.Fatalf("%d panics recovered, want 2", got)
	}
	checkLines(t, log.all(), events)
	for i, ev := range events {
		if ev.Kind != ClmEventVersionCreated || ev.Version != int32(i+1) {
			t.Fatalf("event %d: %+v", i, ev)
		}
	}
	e.Close()
}

package clm

/*
#include <stdlib.h>
#include <clm.h>
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// CLM's semantic snapshot store (clm.h, "the snapshot store"). An engine
// created with EngineOptions.SnapshotStorePath keeps the snapshots a host
// records of repeated suffixes and finds them again for a reuse decision, at
// three levels: the suffix's own key, a near snapshot of the same group, a
// greeting's generic fallback. A sequence's tenant is its cache salt and
// adapter id; no tenant sees another's snapshots. Every method checks its
// slice lengths before the C call (InvalidArgument); every call on an engine
// without a store is FailedPrecondition.

// SuffixKind says how a Suffix names its suffix (CLM_SUFFIX_*).
type SuffixKind int32

const (
	// SuffixText is the user's text: the engine's keyer makes the key, so
	// paraphrases share one.
	SuffixText SuffixKind = C.CLM_SUFFIX_TEXT
	// SuffixKey is a key of the host's own (1..256 printable ASCII bytes)
	// with the group level 2 must agree on ("" = the key itself).
	SuffixKey SuffixKind = C.CLM_SUFFIX_KEY
)

// Suffix is one suffix of a lookup or a record: TextSuffix or KeySuffix.
type Suffix struct {
	Kind  SuffixKind
	Text  string // the text, or the host's key
	Group string // SuffixKey only
}

// TextSuffix is the user's text.
func TextSuffix(text string) Suffix { return Suffix{Kind: SuffixText, Text: text} }

// KeySuffix is a host key and its group ("" = the key itself).
func KeySuffix(key, group string) Suffix { return Suffix{Kind: SuffixKey, Text: key, Group: group} }

// SnapshotLevel is where a lookup found its snapshot (CLM_SNAPSHOT_*).
type SnapshotLevel int32

const (
	SnapshotMiss     SnapshotLevel = C.CLM_SNAPSHOT_MISS     // nothing: zeros, apply false
	SnapshotExact    SnapshotLevel = C.CLM_SNAPSHOT_EXACT    // level 1: the key's newest stable version
	SnapshotANN      SnapshotLevel = C.CLM_SNAPSHOT_ANN      // level 2: the nearest of the same group
	SnapshotFallback SnapshotLevel = C.CLM_SNAPSHOT_FALLBACK // level 3: a greeting's generic snapshot
)

// RecordResult is what recording a snapshot did (CLM_RECORD_*).
type RecordResult int32

const (
	RecordCounted    RecordResult = C.CLM_RECORD_COUNTED     // seen fewer than SnapshotMinUsage times
	RecordAdmitted   RecordResult = C.CLM_RECORD_ADMITTED    // stored as version 1
	RecordConfirmed  RecordResult = C.CLM_RECORD_CONFIRMED   // agrees with the newest version
	RecordNewVersion RecordResult = C.CLM_RECORD_NEW_VERSION // disagrees: stored as a new version
	RecordDrifted    RecordResult = C.CLM_RECORD_DRIFTED     // the key's records drifted: a new version
	RecordAbstained  RecordResult = C.CLM_RECORD_ABSTAINED   // the key abstained (low information): not stored
)

// SnapshotHit is one sequence's lookup result (clm_snapshot_hit).
type SnapshotHit struct {
	Level      SnapshotLevel
	Similarity float32 // cosine of the query and the snapshot (level 1 without a query: 1; level 3: 0)
	Version    int32   // the served version (levels 1 and 2; else 0)
	Stable     bool    // level 1: the version is stable
	// Fingerprint is FNV-1a 64 of the served key (0 on a miss).
	Fingerprint uint64
	// Key is the served key: the suffix's own at level 1, a neighbour's at
	// level 2, the fallback's name at level 3, "" on a miss; its first bytes
	// only when KeyTruncated.
	Key          string
	KeyLen       int // the served key's full length in bytes
	KeyTruncated bool
}

// SnapshotLookup is what LookupSnapshots gives: one hit per sequence, their
// snapshots [n][SnapshotDim] (zeros on a miss) and the apply flags, as
// InjectSnapshots takes them.
type SnapshotLookup struct {
	Hits      []SnapshotHit
	Snapshots []float32
	Apply     []bool
}

// RecordOutcome is what RecordSnapshot did.
type RecordOutcome struct {
	Result  RecordResult
	Version int32 // the key's newest version afterwards (0 while counted)
}

// SnapshotDim is the store's snapshot size; 0 without a store.
func (e *Engine) SnapshotDim() int { return e.snapshotDim }

// checkSnapshotLen checks a snapshot's length when there is a store (without
// one the library answers FailedPrecondition).
func (e *Engine) checkSnapshotLen(op, name string, n int) error {
	if e.snapshotDim == 0 {
		return nil
	}
	return expectLen(op, name, n, e.snapshotDim, "SnapshotDim")
}

// cStrings copies strs into C memory, for the const char *const * arrays that
// cgo does not let Go memory carry (an array of Go pointers): one buffer,
// one pointer and one length per string. free releases all three.
func cStrings(strs []string) (**C.char, *C.size_t, func()) {
	n := len(strs)
	if n == 0 {
		return nil, nil, func() {}
	}
	total := 0
	for _, s := range strs {
		total += len(s)
	}
	buf := C.malloc(C.size_t(total + 1))
	ptrs := (**C.char)(C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof((*C.char)(nil)))))
	lens := (*C.size_t)(C.malloc(C.size_t(n) * C.size_t(unsafe.Sizeof(C.size_t(0)))))
	bytes := unsafe.Slice((*byte)(buf), total+1)
	ps := unsafe.Slice(ptrs, n)
	ls := unsafe.Slice(lens, n)
	off := 0
	for i, s := range strs {
		copy(bytes[off:], s)
		ps[i] = (*C.char)(unsafe.Pointer(&bytes[off]))
		ls[i] = C.size_t(len(s))
		off += len(s)
	}
	return ptrs, lens, func() {
		C.free(buf)
		C.free(unsafe.Pointer(ptrs))
		C.free(unsafe.Pointer(lens))
	}
}

func hitFromC(h *C.clm_snapshot_hit) SnapshotHit {
	key := C.GoString(&h.key[0])
	return SnapshotHit{Level: SnapshotLevel(h.level), Similarity: float32(h.similarity), Version: int32(h.version),
		Stable: h.stable != 0, Fingerprint: uint64(h.fingerprint), Key: key, KeyLen: int(h.key_len),
		KeyTruncated: h.key_truncated != 0}
}

// SuffixKey is the key the engine's keyer makes of text (clm_suffix_key) and
// its FNV-1a 64 fingerprint: paraphrases share one ("Please check the status
// of order 789" and "What's the status of order #789?" both give
// "QUERY-ORDER-789-STATUS"; "Don't check order 789" gives another,
// "NOT-QUERY-ORDER-789"). Text the keyer cannot pin down (a greeting, an
// action with no object or entity, a word its lexicons lack) still gets a
// key ("GREETING", ...), but it is low-information: never stored, never
// served at levels 1 and 2, only by a fallback (SetFallbackSnapshot). Text
// with no content or invalid UTF-8 is InvalidArgument.
func (e *Engine) SuffixKey(text string) (string, uint64, error) {
	const op = "clm_suffix_key"
	ep, err := e.acquire(op)
	if err != nil {
		return "", 0, err
	}
	defer e.release()
	buf := make([]byte, 64)
	for attempt := 0; ; attempt++ {
		var n C.size_t
		var fp C.uint64_t
		err := call(op, func() C.clm_status {
			return C.clm_suffix_key((*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), &n, &fp, ep,
				stringPtr(text), C.size_t(len(text)))
		})
		runtime.KeepAlive(text)
		if err == nil {
			return string(buf[:n]), uint64(fp), nil
		}
		// Too small a buffer is reported as InvalidArgument with the size needed.
		if attempt == 0 && CodeOf(err) == InvalidArgument && int(n) >= len(buf) {
			buf = make([]byte, int(n)+1)
			continue
		}
		return "", 0, err
	}
}

// LookupSnapshots looks up a snapshot for each running sequence seqs[i]
// under its tenant (clm_engine_lookup_snapshots): suffixes[i] names its
// suffix (all of one kind), queries [len(seqs)][SnapshotDim] its query
// snapshots (nil: level 2 is skipped). Each lookup is also reported to the
// SRC breaker (found = hit): don't ReportRetrieval it again. Nothing changes
// on error.
func (e *Engine) LookupSnapshots(seqs []*Seq, suffixes []Suffix, queries []float32) (SnapshotLookup, error) {
	const op = "clm_engine_lookup_snapshots"
	n := len(seqs)
	if err := expectLen(op, "suffixes", len(suffixes), n, "one per sequence"); err != nil {
		return SnapshotLookup{}, err
	}
	kind := SuffixText
	if n > 0 {
		kind = suffixes[0].Kind
	}
	texts := make([]string, n)
	groups := make([]string, n)
	// Groups go to C with keys, and with any suffix that has one (the
	// library refuses a group with text rather than ignore it).
	withGroups := kind == SuffixKey
	for i, s := range suffixes {
		if s.Kind != kind {
			return SnapshotLookup{}, invalid(op, "suffixes mix kinds (suffixes[%d]); one call takes one kind", i)
		}
		texts[i], groups[i] = s.Text, s.Group
		withGroups = withGroups || s.Group != ""
	}
	if queries != nil && e.snapshotDim > 0 {
		if err := expectLen(op, "queries", len(queries), n*e.snapshotDim, "[len(seqs)][SnapshotDim]"); err != nil {
			return SnapshotLookup{}, err
		}
	}
	textPtrs, textLens, freeTexts := cStrings(texts)
	defer freeTexts()
	var groupPtrs **C.char
	var groupLens *C.size_t
	if withGroups {
		var freeGroups func()
		groupPtrs, groupLens, freeGroups = cStrings(groups)
		defer freeGroups()
	}
	raw := make([]C.clm_snapshot_hit, n)
	var rawPtr *C.clm_snapshot_hit
	if n > 0 {
		rawPtr = &raw[0]
	}
	out := SnapshotLookup{Snapshots: make([]float32, n*e.snapshotDim)}
	apply := make([]C.uint8_t, n)
	queriesLen := len(queries)
	err := e.withSeqs(op, seqs, func(ep *C.clm_engine, cseqs []*C.clm_seq) error {
		return call(op, func() C.clm_status {
			return C.clm_engine_lookup_snapshots(rawPtr, floatsPtr(out.Snapshots), C.size_t(len(out.Snapshots)),
				flagsPtr(apply), ep, seqsPtr(cseqs), C.size_t(len(cseqs)), textPtrs, textLens, groupPtrs, groupLens,
				C.int32_t(kind), floatsPtr(queries), C.size_t(queriesLen))
		})
	})
	runtime.KeepAlive(queries)
	if err != nil {
		return SnapshotLookup{}, err
	}
	out.Hits = make([]SnapshotHit, n)
	out.Apply = make([]bool, n)
	for i := range raw {
		out.Hits[i] = hitFromC(&raw[i])
		out.Apply[i] = apply[i] != 0
	}
	return out, nil
}

// RecordSnapshot records snapshot [SnapshotDim] of a running sequence's
// suffix under its tenant (clm_engine_record_snapshot): counts the suffix
// and, once it has been seen SnapshotMinUsage times, stores it (as a new
// version when it disagrees with the newest). A NaN/Inf or zero snapshot is
// InvalidArgument; nothing is stored on error.
func (e *Engine) RecordSnapshot(seq *Seq, suffix Suffix, snapshot []float32) (RecordOutcome, error) {
	const op = "clm_engine_record_snapshot"
	if err := e.checkSnapshotLen(op, "snapshot", len(snapshot)); err != nil {
		return RecordOutcome{}, err
	}
	var result, version C.int32_t
	text, group := suffix.Text, suffix.Group
	err := e.withSeqs(op, []*Seq{seq}, func(ep *C.clm_engine, cseqs []*C.clm_seq) error {
		return call(op, func() C.clm_status {
			return C.clm_engine_record_snapshot(&result, &version, ep, cseqs[0], stringPtr(text), C.size_t(len(text)),
				stringPtr(group), C.size_t(len(group)), C.int32_t(suffix.Kind), floatsPtr(snapshot),
				C.size_t(len(snapshot)))
		})
	})
	runtime.KeepAlive(text)
	runtime.KeepAlive(group)
	runtime.KeepAlive(snapshot)
	if err != nil {
		return RecordOutcome{}, err
	}
	return RecordOutcome{Result: RecordResult(result), Version: int32(version)}, nil
}

// ReportSnapshotOutcome says whether the snapshot the last lookup served
// each sequence was right (clm_engine_report_snapshot_outcome), counted per
// (key looked up, key served): a key whose accuracy falls for itself is
// blacklisted for its tenant; one served wrongly for another key is refused
// to that key only. A sequence served nothing is FailedPrecondition.
func (e *Engine) ReportSnapshotOutcome(seqs []*Seq, correct []bool) error {
	return e.reportPerSeq("clm_engine_report_snapshot_outcome", "correct", seqs, correct,
		func(ep *C.clm_engine, cseqs **C.clm_seq, n C.size_t, cflags *C.uint8_t) C.clm_status {
			return C.clm_engine_report_snapshot_outcome(ep, cseqs, n, cflags)
		})
}

// SetFallbackSnapshot sets level 3's generic snapshot [SnapshotDim] for the
// tenant of the sequences admitted with cache salt salt ("" for none) and
// adapterID (clm_engine_set_fallback_snapshot): name is a greeting's key
// ("GREETING", "THANKS", as SuffixKey gives them) or "*" for all of them.
// Persisted.
func (e *Engine) SetFallbackSnapshot(salt string, adapterID int32, name string, snapshot []float32) error {
	const op = "clm_engine_set_fallback_snapshot"
	if err := e.checkSnapshotLen(op, "snapshot", len(snapshot)); err != nil {
		return err
	}
	ep, err := e.acquire(op)
	if err != nil {
		return err
	}
	defer e.release()
	err = call(op, func() C.clm_status {
		return C.clm_engine_set_fallback_snapshot(ep, stringPtr(salt), C.size_t(len(salt)), C.int32_t(adapterID),
			stringPtr(name), C.size_t(len(name)), floatsPtr(snapshot), C.size_t(len(snapshot)))
	})
	runtime.KeepAlive(salt)
	runtime.KeepAlive(name)
	runtime.KeepAlive(snapshot)
	return err
}

// FlushSnapshotStore writes pending usage counts and saves every index file
// (clm_engine_flush_snapshot_store).
func (e *Engine) FlushSnapshotStore() error {
	const op = "clm_engine_flush_snapshot_store"
	ep, err := e.acquire(op)
	if err != nil {
		return err
	}
	defer e.release()
	return call(op, func() C.clm_status { return C.clm_engine_flush_snapshot_store(ep) })
}

// EvictSnapshots deletes the snapshots unused for 30 days and used fewer than
// 5 times (clm_engine_evict_snapshots); it returns how many.
func (e *Engine) EvictSnapshots() (int64, error) {
	const op = "clm_engine_evict_snapshots"
	ep, err := e.acquire(op)
	if err != nil {
		return 0, err
	}
	defer e.release()
	var deleted C.int64_t
	err = call(op, func() C.clm_status { return C.clm_engine_evict_snapshots(&deleted, ep) })
	return int64(deleted), err
}

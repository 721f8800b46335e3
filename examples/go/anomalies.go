package clm

/*
#include <stdint.h>
#include <clm.h>
*/
import "C"

import (
	"runtime/cgo"
	"strconv"
	"sync/atomic"
	"unsafe"
)

// CLM anomalies (clm.h "CLM anomalies", docs/observability.md): what an
// operator watches of CLM suffix reuse on an engine with a snapshot store.
// Suffix keys looked up often while the SRC head keeps scoring their
// sequences low are *low-SRC* (a sign of a bad keyer rule or a bad head);
// the store's key events say what it did to keys (blacklisted or let go and
// why, versions created, drift). Each LookupSnapshots records its sequence's
// last SRC score with the key, once per sequence and key.
//
//	opts.OnClmWatchLine = func(line string) { log.Println(line) } // each event as a JSON line
//	...
//	report, err := engine.ClmAnomalies()
//	for _, k := range report.LowSrcKeys {
//		fmt.Printf("%s %s: seen %d times, median SRC %.3f\n", k.Tenant, k.Key, k.Sightings, k.MedianSrc)
//	}
//
// This file's cgo preamble holds declarations only, as //export requires; the
// C shim that calls clmgoClmWatchLine is clmgo_clm_watch_line in clm.go.

// ClmEventKind is what a ClmEvent says happened (CLM_WATCH_EVENT_*).
type ClmEventKind int32

const (
	// ClmEventBlacklisted: the key was blacklisted, by the outcome breaker or
	// an administrator (ClmEvent.Reason, UntilMS, ByBreaker).
	ClmEventBlacklisted ClmEventKind = C.CLM_WATCH_EVENT_BLACKLISTED
	// ClmEventUnblacklisted: an administrator let the key go.
	ClmEventUnblacklisted ClmEventKind = C.CLM_WATCH_EVENT_UNBLACKLISTED
	// ClmEventVersionCreated: a record stored the key's first or a new
	// version (ClmEvent.Version).
	ClmEventVersionCreated ClmEventKind = C.CLM_WATCH_EVENT_VERSION_CREATED
	// ClmEventDrift: a version started because the key's records drifted
	// (ClmEvent.Version).
	ClmEventDrift ClmEventKind = C.CLM_WATCH_EVENT_DRIFT
	// ClmEventLowSrc: the key turned low-SRC (ClmEvent.Sightings, MedianSrc).
	ClmEventLowSrc ClmEventKind = C.CLM_WATCH_EVENT_LOW_SRC
)

// String is the kind's name as the JSON lines give it ("event").
func (k ClmEventKind) String() string {
	switch k {
	case ClmEventBlacklisted:
		return "blacklisted"
	case ClmEventUnblacklisted:
		return "unblacklisted"
	case ClmEventVersionCreated:
		return "version_created"
	case ClmEventDrift:
		return "drift"
	case ClmEventLowSrc:
		return "low_src"
	}
	return "ClmEventKind(" + strconv.Itoa(int(k)) + ")"
}

// LowSrcKey is one low-SRC key of a ClmAnomalyReport (clm_low_src_key),
// copied into Go memory.
type LowSrcKey struct {
	// Tenant is the tenant's name as admitted (AdmitOptions.Tenant), else
	// "salt:" and 32 hex digits of its salt's SHA-256 (never the salt), ""
	// for no salt.
	Tenant    string
	AdapterID int32
	Key       string // the suffix key
	// Sightings counts the sequences that looked the key up in the window.
	Sightings uint64
	// MedianSrc is the middle of the 0.025-wide bin that holds their median
	// SRC score: within 0.0125 of it.
	MedianSrc float32
}

// ClmEvent is one event of a ClmAnomalyReport (clm_watch_event), copied
// into Go memory. The fields after Key are those of its Kind; the others are
// zero.
type ClmEvent struct {
	Kind      ClmEventKind
	TimeMS    int64  // when, in milliseconds since the Unix epoch
	Tenant    string // as LowSrcKey.Tenant
	AdapterID int32
	Key       string
	// Reason (ClmEventBlacklisted) is why: the breaker's figures, or the
	// administrator's words (BlacklistSnapshotKey).
	Reason string
	// UntilMS (ClmEventBlacklisted) is when the blacklist ends, in
	// milliseconds since the Unix epoch.
	UntilMS int64
	// ByBreaker (ClmEventBlacklisted): true for the outcome breaker, false
	// for an administrator.
	ByBreaker bool
	// Version (ClmEventVersionCreated, ClmEventDrift) is the version created.
	Version int32
	// Sightings and MedianSrc (ClmEventLowSrc) are the key's as it turned
	// low-SRC (see LowSrcKey).
	Sightings uint64
	MedianSrc float32
	// JSON is the event as the one JSON line (no newline) that
	// EngineOptions.OnClmWatchLine got for it
	// (clm_anomaly_report_event_json).
	JSON string
}

// ClmAnomalyReport is Engine.ClmAnomalies' answer.
type ClmAnomalyReport struct {
	// LowSrcKeys are the keys low-SRC over the window ending now, the most
	// seen first (then by tenant and key).
	LowSrcKeys []LowSrcKey
	// Events are the newest EngineOptions.ClmWatchMaxEvents events, oldest
	// first.
	Events []ClmEvent
	// The settings the report was made with: EngineOptions.ClmWatchWindowMS,
	// ClmWatchMinSightings, ClmWatchLowSrc.
	WindowMS     int64
	MinSightings int64
	LowSrc       float32
}

// ClmAnomalies takes the CLM anomalies as of now
// (clm_engine_clm_anomalies): the low-SRC keys and the newest events, as Go
// copies; the library's report is freed before it returns.
// FailedPrecondition on an engine without a snapshot store, or created with
// ClmWatch off.
func (e *Engine) ClmAnomalies() (*ClmAnomalyReport, error) {
	const op = "clm_engine_clm_anomalies"
	ep, err := e.acquire(op)
	if err != nil {
		return nil, err
	}
	defer e.release()
	var report *C.clm_anomaly_report
	if err := call(op, func() C.clm_status { return C.clm_engine_clm_anomalies(&report, ep) }); err != nil {
		return nil, err
	}
	defer C.clm_anomaly_report_free(report)
	out := &ClmAnomalyReport{
		WindowMS:     int64(C.clm_anomaly_report_window_ms(report)),
		MinSightings: int64(C.clm_anomaly_report_min_sightings(report)),
		LowSrc:       float32(C.clm_anomaly_report_low_src(report)),
	}
	if n := int(C.clm_anomaly_report_low_src_count(report)); n > 0 {
		out.LowSrcKeys = make([]LowSrcKey, n)
	}
	for i := range out.LowSrcKeys {
		var k C.clm_low_src_key
		k.struct_size = C.uint32_t(C.sizeof_clm_low_src_key)
		err := call("clm_anomaly_report_low_src_key", func() C.clm_status {
			return C.clm_anomaly_report_low_src_key(&k, report, C.size_t(i))
		})
		if err != nil {
			return nil, err
		}
		out.LowSrcKeys[i] = LowSrcKey{
			Tenant:    goBytes(k.tenant, k.tenant_len),
			AdapterID: int32(k.adapter_id),
			Key:       goBytes(k.key, k.key_len),
			Sightings: uint64(k.sightings),
			MedianSrc: float32(k.median_src),
		}
	}
	if n := int(C.clm_anomaly_report_event_count(report)); n > 0 {
		out.Events = make([]ClmEvent, n)
	}
	for i := range out.Events {
		var c C.clm_watch_event
		c.struct_size = C.uint32_t(C.sizeof_clm_watch_event)
		err := call("clm_anomaly_report_event", func() C.clm_status {
			return C.clm_anomaly_report_event(&c, report, C.size_t(i))
		})
		if err != nil {
			return nil, err
		}
		line, err := sizedText("clm_anomaly_report_event_json", 0,
			func(text *C.char, capacity C.size_t, length *C.size_t) C.clm_status {
				return C.clm_anomaly_report_event_json(text, capacity, length, report, C.size_t(i))
			})
		if err != nil {
			return nil, err
		}
		out.Events[i] = ClmEvent{
			Kind:      ClmEventKind(c.kind),
			TimeMS:    int64(c.time_ms),
			Tenant:    goBytes(c.tenant, c.tenant_len),
			AdapterID: int32(c.adapter_id),
			Key:       goBytes(c.key, c.key_len),
			Reason:    goBytes(c.reason, c.reason_len),
			UntilMS:   int64(c.until_ms),
			ByBreaker: c.by_breaker != 0,
			Version:   int32(c.version),
			Sightings: uint64(c.sightings),
			MedianSrc: float32(c.median_src),
			JSON:      line,
		}
	}
	return out, nil
}

// goBytes is a Go copy of the n bytes at p ("" for none).
func goBytes(p *C.char, n C.size_t) string {
	if p == nil || n == 0 {
		return ""
	}
	return string(unsafe.Slice((*byte)(unsafe.Pointer(p)), int(n)))
}

// clmWatchCallbacks counts the OnClmWatchLine callbacks registered
// (cgo.Handle) and not yet released, and clmWatchPanics the panics recovered
// from them, so that the tests can see that Close and a failed NewEngine
// release them and that a panic stops at the callback.
var clmWatchCallbacks, clmWatchPanics atomic.Int64

// newClmWatchCallback registers fn for the C callback; 0 for nil.
func newClmWatchCallback(fn func(string)) cgo.Handle {
	if fn == nil {
		return 0
	}
	clmWatchCallbacks.Add(1)
	return cgo.NewHandle(fn)
}

// releaseClmWatchCallback forgets a handle of newClmWatchCallback: only once
// the library can no longer call it (clm_engine_free returned, or
// clm_engine_create failed).
func releaseClmWatchCallback(h cgo.Handle) {
	if h != 0 {
		h.Delete()
		clmWatchCallbacks.Add(-1)
	}
}

// clmgoClmWatchLine is the C callback (through clmgo_clm_watch_line,
// clm.go): it runs on the goroutine of the Engine call that caused the event,
// under the engine's locks, never once clm_engine_free has returned. The
// line lives only for the call, so it is copied. A panic in the host's
// function is recovered here: unwinding through the library's frames would
// skip its destructors and leave its locks held (the next call would hang).
//
//export clmgoClmWatchLine
func clmgoClmWatchLine(line *C.char, lineLen C.size_t, handle C.uintptr_t) {
	fn := cgo.Handle(handle).Value().(func(string))
	s := goBytes(line, lineLen)
	defer func() {
		if recover() != nil {
			clmWatchPanics.Add(1)
		}
	}()
	fn(s)
}

package clm

/*
#include <clm.h>
*/
import "C"

import (
	"runtime"
)

// The snapshot store by hand (clm.h, "the snapshot store by hand"): what an
// operator corrects in a running engine's store. A tenant is named by its
// cache salt and adapter id (as SetFallbackSnapshot names it), a key by a
// Suffix (as RecordSnapshot names it; a text whose key abstained names
// nothing stored: NotFound). Every call changes nothing on error; what is
// not there is NotFound.

// SnapshotVersion is one version of a key (clm_snapshot_version).
type SnapshotVersion struct {
	Version       int32
	Readable      bool  // its snapshot passes its checks (an unreadable one is never served)
	Stable        bool  // confirmed by enough later records
	Pinned        bool  // pinned by PinSnapshotVersion
	Served        bool  // the version level 1 serves now
	CreatedAt     int64 // Unix seconds
	LastUsed      int64 // Unix seconds of its latest use, once written
	UsageCount    int64
	Confirmations int64
}

// BlacklistEntry is one key refused at every level
// (clm_snapshot_blacklist_entry).
type BlacklistEntry struct {
	UntilMS     int64  // in force until (milliseconds since the Unix epoch)
	Fingerprint uint64 // FNV-1a 64 of the key
	Salt        string // the tenant's cache salt (its first bytes when Truncated) ...
	AdapterID   int32  // ... and adapter id
	Key         string
	Reason      string // what BlacklistSnapshotKey was told, or what the breaker saw
	ByHand      bool   // set by BlacklistSnapshotKey; false: the accuracy breaker
	Truncated   bool   // a field holds only the first bytes of a longer value
}

// cField is the first n bytes of a NUL-terminated char array of C (at most
// all but its NUL).
func cField(field []C.char, n C.uint32_t) string {
	m := int(n)
	if m > len(field)-1 {
		m = len(field) - 1
	}
	b := make([]byte, m)
	for i := 0; i < m; i++ {
		b[i] = byte(field[i])
	}
	return string(b)
}

// SnapshotBlacklist lists the blacklist entries in force, by tenant and key
// (clm_engine_snapshot_blacklist).
func (e *Engine) SnapshotBlacklist() ([]BlacklistEntry, error) {
	const op = "clm_engine_snapshot_blacklist"
	ep, err := e.acquire(op)
	if err != nil {
		return nil, err
	}
	defer e.release()
	var out []C.clm_snapshot_blacklist_entry
	for attempt := 0; attempt < 4; attempt++ { // entries may be added between the sizing call and the fill
		var first *C.clm_snapshot_blacklist_entry
		if len(out) > 0 {
			first = &out[0]
		}
		var count C.size_t
		err := call(op, func() C.clm_status {
			return C.clm_engine_snapshot_blacklist(first, C.size_t(len(out)), &count, ep)
		})
		if err == nil && int(count) <= len(out) {
			entries := make([]BlacklistEntry, int(count))
			for i := range entries {
				c := &out[i]
				entries[i] = BlacklistEntry{int64(c.until_ms), uint64(c.fingerprint), cField(c.salt[:], c.salt_len),
					int32(c.adapter_id), cField(c.key[:], c.key_len), cField(c.reason[:], c.reason_len), c.by_hand != 0,
					c.salt_truncated != 0 || c.key_truncated != 0 || c.reason_truncated != 0}
			}
			return entries, nil
		}
		if err != nil && (CodeOf(err) != InvalidArgument || int(count) <= len(out)) {
			return nil, err
		}
		out = make([]C.clm_snapshot_blacklist_entry, int(count))
	}
	return nil, &Error{code: Internal, op: op, msg: op + ": the blacklist kept changing"}
}

// adminCall runs f with the engine's handle and the C views of salt and the
// suffix, which stay alive until f returns.
func (e *Engine) adminCall(op, salt string, s Suffix, f func(ep *C.clm_engine, salt *C.char, suffix *C.char, group *C.char) C.clm_status) error {
	ep, err := e.acquire(op)
	if err != nil {
		return err
	}
	defer e.release()
	err = call(op, func() C.clm_status { return f(ep, stringPtr(salt), stringPtr(s.Text), stringPtr(s.Group)) })
	runtime.KeepAlive(salt)
	runtime.KeepAlive(s)
	return err
}

// SnapshotVersions lists a key's versions, newest first
// (clm_engine_snapshot_versions).
func (e *Engine) SnapshotVersions(salt string, adapterID int32, s Suffix) ([]SnapshotVersion, error) {
	const op = "clm_engine_snapshot_versions"
	var count C.size_t
	var out []C.clm_snapshot_version
	for attempt := 0; attempt < 4; attempt++ { // versions may be added between the sizing call and the fill
		var first *C.clm_snapshot_version
		if len(out) > 0 {
			first = &out[0]
		}
		err := e.adminCall(op, salt, s, func(ep *C.clm_engine, cs, suffix, group *C.char) C.clm_status {
			return C.clm_engine_snapshot_versions(first, C.size_t(len(out)), &count, ep, cs, C.size_t(len(salt)),
				C.int32_t(adapterID), suffix, C.size_t(len(s.Text)), group, C.size_t(len(s.Group)), C.int32_t(s.Kind))
		})
		if err == nil && int(count) <= len(out) {
			versions := make([]SnapshotVersion, int(count))
			for i := range versions {
				v := &out[i]
				versions[i] = SnapshotVersion{int32(v.version), v.readable != 0, v.stable != 0, v.pinned != 0,
					v.served != 0, int64(v.created_at), int64(v.last_used), int64(v.usage_count), int64(v.confirmations)}
			}
			return versions, nil
		}
		if err != nil && (CodeOf(err) != InvalidArgument || int(count) <= len(out)) {
			return nil, err
		}
		out = make([]C.clm_snapshot_version, int(count))
	}
	return nil, &Error{code: Internal, op: op, msg: op + ": the key's versions kept changing"}
}

// PinSnapshotVersion serves version of the key at levels 1 and 2 whatever is
// recorded later, until UnpinSnapshotVersion (clm_engine_pin_snapshot_version).
func (e *Engine) PinSnapshotVersion(salt string, adapterID int32, s Suffix, version int32) error {
	return e.adminCall("clm_engine_pin_snapshot_version", salt, s, func(ep *C.clm_engine, cs, suffix, group *C.char) C.clm_status {
		return C.clm_engine_pin_snapshot_version(ep, cs, C.size_t(len(salt)), C.int32_t(adapterID), suffix,
			C.size_t(len(s.Text)), group, C.size_t(len(s.Group)), C.int32_t(s.Kind), C.int32_t(version))
	})
}

// UnpinSnapshotVersion lifts a key's pin (clm_engine_unpin_snapshot_version).
func (e *Engine) UnpinSnapshotVersion(salt string, adapterID int32, s Suffix) error {
	return e.adminCall("clm_engine_unpin_snapshot_version", salt, s, func(ep *C.clm_engine, cs, suffix, group *C.char) C.clm_status {
		return C.clm_engine_unpin_snapshot_version(ep, cs, C.size_t(len(salt)), C.int32_t(adapterID), suffix,
			C.size_t(len(s.Text)), group, C.size_t(len(s.Group)), C.int32_t(s.Kind))
	})
}

// RollBackSnapshotKey deletes the key's versions newer than version and
// returns how many (clm_engine_roll_back_snapshot_key).
func (e *Engine) RollBackSnapshotKey(salt string, adapterID int32, s Suffix, version int32) (int64, error) {
	var deleted C.int64_t
	err := e.adminCall("clm_engine_roll_back_snapshot_key", salt, s, func(ep *C.clm_engine, cs, suffix, group *C.char) C.clm_status {
		return C.clm_engine_roll_back_snapshot_key(&deleted, ep, cs, C.size_t(len(salt)), C.int32_t(adapterID), suffix,
			C.size_t(len(s.Text)), group, C.size_t(len(s.Group)), C.int32_t(s.Kind), C.int32_t(version))
	})
	return int64(deleted), err
}

// DeleteSnapshotKey deletes every version of the key and returns how many
// (clm_engine_delete_snapshot_key).
func (e *Engine) DeleteSnapshotKey(salt string, adapterID int32, s Suffix) (int64, error) {
	var deleted C.int64_t
	err := e.adminCall("clm_engine_delete_snapshot_key", salt, s, func(ep *C.clm_engine, cs, suffix, group *C.char) C.clm_status {
		return C.clm_engine_delete_snapshot_key(&deleted, ep, cs, C.size_t(len(salt)), C.int32_t(adapterID), suffix,
			C.size_t(len(s.Text)), group, C.size_t(len(s.Group)), C.int32_t(s.Kind))
	})
	return int64(deleted), err
}

// DeleteSnapshotTenant deletes everything of the tenant and returns how many
// snapshot rows (clm_engine_delete_snapshot_tenant).
func (e *Engine) DeleteSnapshotTenant(salt string, adapterID int32) (int64, error) {
	var deleted C.int64_t
	err := e.adminCall("clm_engine_delete_snapshot_tenant", salt, Suffix{}, func(ep *C.clm_engine, cs, _, _ *C.char) C.clm_status {
		return C.clm_engine_delete_snapshot_tenant(&deleted, ep, cs, C.size_t(len(salt)), C.int32_t(adapterID))
	})
	return int64(deleted), err
}

// BlacklistSnapshotKey refuses the key at every level until untilMS
// (milliseconds since the Unix epoch, after now), with a reason of 1..1024
// bytes (clm_engine_blacklist_snapshot_key).
func (e *Engine) BlacklistSnapshotKey(salt string, adapterID int32, s Suffix, reason string, untilMS int64) error {
	err := e.adminCall("clm_engine_blacklist_snapshot_key", salt, s, func(ep *C.clm_engine, cs, suffix, group *C.char) C.clm_status {
		return C.clm_engine_blacklist_snapshot_key(ep, cs, C.size_t(len(salt)), C.int32_t(adapterID), suffix,
			C.size_t(len(s.Text)), group, C.size_t(len(s.Group)), C.int32_t(s.Kind), stringPtr(reason),
			C.size_t(len(reason)), C.int64_t(untilMS))
	})
	runtime.KeepAlive(reason)
	return err
}

// UnblacklistSnapshotKey lifts the key's blacklist entry
// (clm_engine_unblacklist_snapshot_key).
func (e *Engine) UnblacklistSnapshotKey(salt string, adapterID int32, s Suffix) error {
	return e.adminCall("clm_engine_unblacklist_snapshot_key", salt, s, func(ep *C.clm_engine, cs, suffix, group *C.char) C.clm_status {
		return C.clm_engine_unblacklist_snapshot_key(ep, cs, C.size_t(len(salt)), C.int32_t(adapterID), suffix,
			C.size_t(len(s.Text)), group, C.size_t(len(s.Group)), C.int32_t(s.Kind))
	})
}

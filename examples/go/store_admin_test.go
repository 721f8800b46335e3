package clm

import (
	"math/rand"
	"testing"
	"time"
)

// The snapshot store by hand through the real library: versions, a pin that
// outlives newer records, rollback, the blacklist, deletion, and what is
// refused (NotFound, InvalidArgument) leaving the store as it was.
func TestSnapshotStoreByHand(t *testing.T) {
	r := rand.New(rand.NewSource(time.Now().UnixNano()))
	e := storeEngine(t, nil)
	const salt = "tenant-admin"
	a := admit(t, e, []int32{1, 2, 3, 4, 5}, &AdmitOptions{CacheSalt: salt})
	key := KeySuffix("FAQ-7", "g")
	v1, v2 := randVec(r, storeDim, 1), randVec(r, storeDim, 1)
	for _, v := range [][]float32{v1, v1, v2} {
		_, err := e.RecordSnapshot(a, key, v)
		must(t, err)
	}
	versions, err := e.SnapshotVersions(salt, 0, key)
	must(t, err)
	if len(versions) != 2 || versions[0].Version != 2 || versions[1].Version != 1 || !versions[1].Served ||
		!versions[1].Stable || versions[0].Served || versions[1].Confirmations != 1 {
		t.Fatalf("versions: %+v", versions)
	}
	must(t, e.PinSnapshotVersion(salt, 0, key, 2))
	if got := lookupOne(t, e, a, key, nil); got.Hits[0].Version != 2 || maxError(got.Snapshots, unit64(v2)) > 1e-3 {
		t.Fatalf("after the pin: %+v", got.Hits[0])
	}
	_, err = e.RecordSnapshot(a, key, randVec(r, storeDim, 1)) // version 3 waits for the pin to lift
	must(t, err)
	if got := lookupOne(t, e, a, key, nil); got.Hits[0].Version != 2 {
		t.Fatalf("a new version displaced the pin: %+v", got.Hits[0])
	}
	must(t, e.UnpinSnapshotVersion(salt, 0, key))
	if err := e.UnpinSnapshotVersion(salt, 0, key); CodeOf(err) != NotFound {
		t.Fatalf("unpin without a pin: %v", err)
	}
	deleted, err := e.RollBackSnapshotKey(salt, 0, key, 1)
	must(t, err)
	if deleted != 2 {
		t.Fatalf("rollback to 1 deleted %d", deleted)
	}
	until := time.Now().Add(time.Hour).UnixMilli()
	must(t, e.BlacklistSnapshotKey(salt, 0, key, "wrong answer", until))
	wantMiss(t, lookupOne(t, e, a, key, nil))
	listed, err := e.SnapshotBlacklist()
	must(t, err)
	if len(listed) != 1 || listed[0].Salt != salt || listed[0].AdapterID != 0 || listed[0].Key != "FAQ-7" ||
		listed[0].Reason != "wrong answer" || listed[0].UntilMS != until || !listed[0].ByHand || listed[0].Truncated ||
		listed[0].Fingerprint != fnv1a("FAQ-7") {
		t.Fatalf("blacklist: %+v", listed)
	}
	must(t, e.UnblacklistSnapshotKey(salt, 0, key))
	if listed, err = e.SnapshotBlacklist(); err != nil || len(listed) != 0 {
		t.Fatalf("blacklist after unblacklist: %+v, %v", listed, err)
	}
	if got := lookupOne(t, e, a, key, nil); got.Hits[0].Level != SnapshotExact || got.Hits[0].Version != 1 {
		t.Fatalf("after unblacklist: %+v", got.Hits[0])
	}

	// Refused, nothing changed.
	for name, err := range map[string]error{
		"pin a missing version": e.PinSnapshotVersion(salt, 0, key, 9),
		"unblacklist":           e.UnblacklistSnapshotKey(salt, 0, key),
		"another tenant":        e.PinSnapshotVersion("nobody", 0, key, 1),
		"an abstaining text":    e.PinSnapshotVersion(salt, 0, TextSuffix("thanks"), 1),
	} {
		if CodeOf(err) != NotFound {
			t.Fatalf("%s: %v, want NotFound", name, err)
		}
	}
	if err := e.BlacklistSnapshotKey(salt, 0, key, "", until); CodeOf(err) != InvalidArgument {
		t.Fatalf("an empty reason: %v", err)
	}
	if err := e.BlacklistSnapshotKey(salt, 0, key, "late", time.Now().Add(-time.Hour).UnixMilli()); CodeOf(err) != InvalidArgument {
		t.Fatalf("an expiry in the past: %v", err)
	}
	if versions, err = e.SnapshotVersions(salt, 0, key); err != nil || len(versions) != 1 {
		t.Fatalf("versions after refused calls: %+v, %v", versions, err)
	}

	deleted, err = e.DeleteSnapshotKey(salt, 0, key)
	must(t, err)
	if deleted != 1 {
		t.Fatalf("delete-key deleted %d", deleted)
	}
	wantMiss(t, lookupOne(t, e, a, key, nil))
	if _, err := e.DeleteSnapshotTenant(salt, 0); CodeOf(err) != NotFound {
		t.Fatalf("deleting an empty tenant: %v", err)
	}
	_, err = e.RecordSnapshot(a, key, v1)
	must(t, err)
	deleted, err = e.DeleteSnapshotTenant(salt, 0)
	must(t, err)
	if deleted != 1 {
		t.Fatalf("delete-tenant deleted %d", deleted)
	}
}

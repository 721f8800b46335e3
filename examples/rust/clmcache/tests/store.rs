//! The snapshot store through the real library: record then lookup against an
//! independent float64 normalisation (the store keeps f16), suffix keys of
//! paraphrases, the three levels, tenant isolation (salt and adapter id), the
//! apply flags feeding inject_snapshots, outcome reports, the version-3
//! options and metrics, and bad input.
mod common;

use clmcache::{
    sys, ActivationsMut, AdapterOptions, AdmitOptions, Engine, EngineOptions, ErrorCode, MemoryKind, RecordResult,
    Sequence, SnapshotLevel, SnapshotLookup, Suffix,
};
use common::Rng;

const DIM: usize = 16;

fn fnv1a(s: &str) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in s.as_bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn unit64(v: &[f32]) -> Vec<f64> {
    let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    v.iter().map(|&x| x as f64 / norm).collect()
}

fn max_error(served: &[f32], want: &[f64]) -> f64 {
    served.iter().zip(want).map(|(&s, &w)| (s as f64 - w).abs()).fold(0.0, f64::max)
}

fn cosine64(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let na: f64 = a.iter().map(|&x| x as f64 * x as f64).sum();
    let nb: f64 = b.iter().map(|&x| x as f64 * x as f64).sum();
    dot / (na * nb).sqrt()
}

fn options() -> EngineOptions {
    EngineOptions {
        page_size: 4,
        memory: MemoryKind::None,
        snapshot_store_path: Some(":memory:".into()),
        snapshot_store_shards: 2,
        snapshot_dim: DIM as i32,
        snapshot_min_usage: 1,
        snapshot_similarity_floor: 0.5,
        snapshot_lookup_timeout_us: 2_000_000, // no busy misses (level 2 included) on a loaded machine
        ..EngineOptions::new(64)
    }
}

fn admit(engine: &Engine, salt: &[u8], adapter_id: i32) -> Sequence {
    let opts = AdmitOptions { cache_salt: Some(salt), adapter_id, ..AdmitOptions::default() };
    engine.admit_with(&[1, 2, 3, 4, 5], &opts).expect("admit")
}

fn one(engine: &Engine, seq: &Sequence, suffix: Suffix<'_>, query: Option<&[f32]>) -> SnapshotLookup {
    let r = engine.lookup_snapshots(&[seq], &[suffix], query).expect("lookup");
    assert_eq!((r.hits.len(), r.snapshots.len(), r.apply.len()), (1, DIM, 1));
    r
}

fn assert_miss(r: &SnapshotLookup) {
    assert_eq!(r.hits[0].level, SnapshotLevel::Miss, "{:?}", r.hits[0]);
    assert!(!r.apply[0]);
    assert_eq!((r.hits[0].key.as_str(), r.hits[0].fingerprint), ("", 0));
    assert!(r.snapshots.iter().all(|&x| x == 0.0));
}

#[test]
fn version_3_options_have_the_documented_defaults() {
    let d = EngineOptions::default();
    assert_eq!(d.snapshot_store_path, None);
    assert!(!d.has_snapshot_store());
    assert_eq!((d.snapshot_store_shards, d.snapshot_dim, d.snapshot_min_usage), (16, 256, 50));
    assert_eq!((d.snapshot_version_cosine, d.snapshot_similarity_floor), (0.95, 0.8));
    assert_eq!((d.snapshot_ann_ef_search, d.snapshot_lookup_timeout_us), (128, 2000));
    let (raw, path) = options().to_raw_with_path().unwrap();
    assert_eq!(raw.struct_size as usize, std::mem::size_of::<sys::clm_engine_options>());
    assert_eq!(path.as_ref().unwrap().to_str().unwrap(), ":memory:");
    assert_eq!(raw.snapshot_store_path, path.as_ref().unwrap().as_ptr());
    assert!(options().to_raw().unwrap().snapshot_store_path.is_null());
    // An empty path is no store, as None is.
    let engine = Engine::new(&EngineOptions { snapshot_store_path: Some("".into()), ..options() }).unwrap();
    assert_eq!(engine.snapshot_dim(), None);
    assert!(!engine.metrics().unwrap().has_snapshot_store);
}

#[test]
fn record_then_lookup_at_every_level_with_tenants_and_metrics() {
    let mut rng = Rng::new(11);
    let engine = Engine::new(&options()).unwrap();
    assert_eq!(engine.snapshot_dim(), Some(DIM));
    let a = admit(&engine, b"tenant-a", 0);
    let b = admit(&engine, b"tenant-b", 0);
    let a7 = admit(&engine, b"tenant-a", 7);

    // Level 1: a host key; the f16 round trip within 1e-3 of float64.
    let v = rng.vec(DIM, 3.0);
    let key = Suffix::Key { key: "ORDER-1", group: "g1" };
    let rec = engine.record_snapshot(&a, key, &v).unwrap();
    assert_eq!((rec.result, rec.version), (RecordResult::Admitted, 1));
    let r = one(&engine, &a, key, None);
    let hit = &r.hits[0];
    assert_eq!((hit.level, hit.version, hit.stable, hit.similarity), (SnapshotLevel::Exact, 1, false, 1.0));
    assert_eq!((hit.key.as_str(), hit.key_len, hit.key_truncated), ("ORDER-1", 7, false));
    assert_eq!(hit.fingerprint, fnv1a("ORDER-1"));
    assert!(r.apply[0]);
    assert!(max_error(&r.snapshots, &unit64(&v)) <= 1e-3);
    let half: Vec<f32> = v.iter().map(|x| x * 0.5).collect();
    assert_eq!(engine.record_snapshot(&a, key, &half).unwrap().result, RecordResult::Confirmed);
    assert!(one(&engine, &a, key, None).hits[0].stable);

    // Text: paraphrases share a key; record one, find it by the other.
    let k1 = engine.suffix_key("Please check the status of order 789").unwrap();
    let k2 = engine.suffix_key("What's the status of order #789?").unwrap();
    assert_eq!(k1.key, "QUERY-ORDER-789-STATUS");
    assert_eq!(k1, k2);
    assert_eq!(k1.fingerprint, fnv1a(&k1.key));
    assert_ne!(engine.suffix_key("Don't check order 789").unwrap().key, k1.key);
    let w = rng.vec(DIM, 1.0);
    let rec = engine.record_snapshot(&a, Suffix::Text("Please check the status of order 789"), &w).unwrap();
    assert_eq!(rec.result, RecordResult::Admitted);
    let r = one(&engine, &a, Suffix::Text("What's the status of order #789?"), None);
    assert_eq!((r.hits[0].level, r.hits[0].key.as_str()), (SnapshotLevel::Exact, "QUERY-ORDER-789-STATUS"));
    assert!(max_error(&r.snapshots, &unit64(&w)) <= 1e-3);
    // A text whose key abstains ("cancel it": cancel what?) is neither stored nor counted.
    let abstained = engine.record_snapshot(&a, Suffix::Text("cancel it"), &w).unwrap();
    assert_eq!((abstained.result, abstained.version), (RecordResult::Abstained, 0));

    // Level 2: a neighbour of the same group.
    let near = rng.vec(DIM, 1.0);
    engine.record_snapshot(&a, Suffix::Key { key: "K-NEAR", group: "grp" }, &near).unwrap();
    let query: Vec<f32> = near.iter().map(|&x| x + rng.uniform(0.02)).collect();
    let r = one(&engine, &a, Suffix::Key { key: "K-QUERY", group: "grp" }, Some(&query));
    let hit = &r.hits[0];
    assert_eq!((hit.level, hit.key.as_str(), hit.version), (SnapshotLevel::Ann, "K-NEAR", 1));
    assert_eq!(hit.fingerprint, fnv1a("K-NEAR"));
    assert!((hit.similarity as f64 - cosine64(&query, &near)).abs() <= 2e-3, "{}", hit.similarity);
    assert!(max_error(&r.snapshots, &unit64(&near)) <= 1e-3);
    assert_miss(&one(&engine, &a, Suffix::Key { key: "K-QUERY", group: "other" }, Some(&query)));
    assert_miss(&one(&engine, &a, Suffix::Key { key: "K-QUERY", group: "grp" }, None));

    // Level 3: a greeting's fallback for tenant A only.
    assert_eq!(engine.suffix_key("Hi there").unwrap().key, "GREETING");
    assert_miss(&one(&engine, &a, Suffix::Text("Hi there"), None));
    let greeting = rng.vec(DIM, 2.0);
    engine.set_fallback_snapshot(b"tenant-a", 0, "GREETING", &greeting).unwrap();
    let r = one(&engine, &a, Suffix::Text("Hi there"), None);
    assert_eq!((r.hits[0].level, r.hits[0].key.as_str()), (SnapshotLevel::Fallback, "GREETING"));
    assert!(max_error(&r.snapshots, &unit64(&greeting)) <= 1e-3);

    // Tenants: B and A-under-adapter-7 see nothing of A's at any level.
    for stranger in [&b, &a7] {
        assert_miss(&one(&engine, stranger, key, Some(&query)));
        assert_miss(&one(&engine, stranger, Suffix::Text("What's the status of order #789?"), Some(&query)));
        assert_miss(&one(&engine, stranger, Suffix::Key { key: "K-QUERY", group: "grp" }, Some(&query)));
        assert_miss(&one(&engine, stranger, Suffix::Text("Hi there"), Some(&query)));
    }
    engine.set_fallback_snapshot(b"tenant-a", 7, "*", &greeting).unwrap();
    assert_eq!(one(&engine, &a7, Suffix::Text("thanks!"), None).hits[0].level, SnapshotLevel::Fallback);
    assert_miss(&one(&engine, &b, Suffix::Text("thanks!"), None));

    // A batch: the apply flags feed inject_snapshots.
    let hidden = 8usize;
    let weight = rng.vec(hidden * DIM, 1.0);
    let bias = rng.vec(hidden, 1.0);
    let adapter = AdapterOptions { layers: vec![0], residual_scale: 0.5, ..AdapterOptions::new(1) };
    engine.set_snapshot_adapter(DIM as i32, hidden as i32, &weight, &bias, &adapter).unwrap();
    let batch = engine.lookup_snapshots(&[&a, &b], &[key, key], None).unwrap();
    assert_eq!((batch.hits[0].level, batch.hits[1].level), (SnapshotLevel::Exact, SnapshotLevel::Miss));
    assert_eq!(batch.apply, vec![true, false]);
    let mut hs = rng.vec(2 * hidden, 1.0);
    let before = hs.clone();
    engine
        .inject_snapshots(
            ActivationsMut::F32(&mut hs),
            hidden as i32,
            &[&a, &b],
            &[0, 1, 2],
            &batch.snapshots,
            DIM as i32,
            &batch.apply,
            0,
        )
        .unwrap();
    for ch in 0..hidden {
        let delta: f64 =
            bias[ch] as f64 + (0..DIM).map(|k| weight[ch * DIM + k] as f64 * batch.snapshots[k] as f64).sum::<f64>();
        let want = before[ch] as f64 + 0.5 * delta;
        assert!((hs[ch] as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()), "channel {}", ch);
        assert_eq!(hs[hidden + ch], before[hidden + ch]); // b missed
    }

    // Outcomes: a was served, b was not.
    engine.report_snapshot_outcome(&[&a], &[true]).unwrap();
    assert_eq!(engine.report_snapshot_outcome(&[&b], &[true]).unwrap_err().code(), ErrorCode::FailedPrecondition);
    engine.flush_snapshot_store().unwrap();
    assert_eq!(engine.evict_snapshots().unwrap(), 0);

    // Level 1 x4 (ORDER-1 x2, the text, the batch's a), level 2 x1, level 3 x2
    // (a's greeting, a7's "*"); misses: 3 of a's (another group, no query, the
    // greeting before its fallback), 8 of the strangers, b's "thanks!", the batch's b.
    let m = engine.metrics().unwrap();
    assert!(m.has_snapshot_store);
    assert_eq!((m.store_hits_exact, m.store_hits_ann, m.store_hits_fallback), (4, 1, 2));
    assert_eq!(m.store_misses, 3 + 8 + 1 + 1);
    assert_eq!(m.store_lookups, 4 + 1 + 2 + 13);
    assert_eq!((m.store_records, m.store_admissions, m.store_confirmations, m.store_counted), (5, 3, 1, 0)); // and the abstained "cancel it"
    assert_eq!((m.store_snapshots, m.store_outcome_reports, m.store_versions), (3, 1, 0));
    assert_eq!((m.src_retrievals_found, m.src_retrievals_failed), (7, 13));
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let mut rng = Rng::new(12);
    let engine = Engine::new(&options()).unwrap();
    let a = admit(&engine, b"a", 0);
    let b = admit(&engine, b"b", 0);
    let v = rng.vec(DIM, 1.0);
    let key = Suffix::key("K");
    engine.record_snapshot(&a, key, &v).unwrap();
    let before = engine.metrics().unwrap();
    let code = |r: clmcache::Result<SnapshotLookup>| r.unwrap_err().code();

    // Lengths, checked in Rust.
    assert_eq!(code(engine.lookup_snapshots(&[&a, &b], &[key], None)), ErrorCode::InvalidArgument);
    assert_eq!(code(engine.lookup_snapshots(&[&a], &[key], Some(&v[..DIM - 1]))), ErrorCode::InvalidArgument);
    let err = engine.lookup_snapshots(&[&a, &b], &[key, Suffix::Text("hi")], None).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.message().contains("mix"), "{}", err);
    assert_eq!(engine.record_snapshot(&a, key, &v[1..]).unwrap_err().code(), ErrorCode::InvalidArgument);
    assert_eq!(engine.report_snapshot_outcome(&[&a], &[]).unwrap_err().code(), ErrorCode::InvalidArgument);
    assert_eq!(
        engine.set_fallback_snapshot(b"a", 0, "GREETING", &v[1..]).unwrap_err().code(),
        ErrorCode::InvalidArgument
    );
    // Values, checked by the library: nothing was looked up or stored.
    let mut nan = v.clone();
    nan[3] = f32::NAN;
    let mut queries = v.clone();
    queries.extend_from_slice(&nan);
    assert_eq!(code(engine.lookup_snapshots(&[&a, &b], &[key, key], Some(&queries))), ErrorCode::InvalidArgument);
    assert_eq!(code(engine.lookup_snapshots(&[&a, &a], &[key, key], None)), ErrorCode::InvalidArgument);
    let bad_key = Suffix::key("not printable\n");
    assert_eq!(code(engine.lookup_snapshots(&[&a, &b], &[key, bad_key], None)), ErrorCode::InvalidArgument);
    assert_eq!(code(engine.lookup_snapshots(&[&a], &[Suffix::Text("")], None)), ErrorCode::InvalidArgument);
    assert_eq!(engine.record_snapshot(&a, key, &nan).unwrap_err().code(), ErrorCode::InvalidArgument);
    assert_eq!(engine.record_snapshot(&a, key, &[0.0; DIM]).unwrap_err().code(), ErrorCode::InvalidArgument);
    assert_eq!(engine.suffix_key("").unwrap_err().code(), ErrorCode::InvalidArgument);
    assert_eq!(engine.set_fallback_snapshot(b"a", 0, "", &v).unwrap_err().code(), ErrorCode::InvalidArgument);
    let after = engine.metrics().unwrap();
    assert_eq!((after.store_lookups, after.store_records), (before.store_lookups, before.store_records));
    assert_eq!(after.src_retrievals_failed + after.src_retrievals_found, 0);

    // A sequence of another engine, an ended one.
    let other = Engine::new(&options()).unwrap();
    let foreign = admit(&other, b"a", 0);
    assert_eq!(code(engine.lookup_snapshots(&[&foreign], &[key], None)), ErrorCode::InvalidArgument);
    let mut ended = admit(&engine, b"a", 0);
    ended.finish().unwrap();
    assert_eq!(code(engine.lookup_snapshots(&[&ended], &[key], None)), ErrorCode::FailedPrecondition);
    assert_eq!(engine.record_snapshot(&ended, key, &v).unwrap_err().code(), ErrorCode::FailedPrecondition);

    // Bad store options, refused at creation.
    for opts in [
        EngineOptions { snapshot_dim: 0, ..options() },
        EngineOptions { snapshot_store_shards: 300, ..options() },
        EngineOptions { snapshot_min_usage: 0, ..options() },
        EngineOptions { snapshot_version_cosine: 0.0, ..options() },
        EngineOptions { snapshot_similarity_floor: 2.0, ..options() },
        EngineOptions { snapshot_store_path: Some("bad\0path".into()), ..options() },
    ] {
        let err = Engine::new(&opts).expect_err(&format!("{:?}", opts));
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{}", err);
    }
    let err = Engine::new(&EngineOptions { snapshot_store_path: Some("/dev/null/store".into()), ..options() });
    assert_eq!(err.unwrap_err().code(), ErrorCode::Io);

    // An engine without a store.
    let plain = Engine::new(&EngineOptions { snapshot_store_path: None, ..options() }).unwrap();
    let p = admit(&plain, b"a", 0);
    let pre = ErrorCode::FailedPrecondition;
    assert_eq!(code(plain.lookup_snapshots(&[&p], &[key], Some(&v))), pre);
    assert_eq!(plain.record_snapshot(&p, key, &v).unwrap_err().code(), pre);
    assert_eq!(plain.report_snapshot_outcome(&[&p], &[true]).unwrap_err().code(), pre);
    assert_eq!(plain.suffix_key("hello").unwrap_err().code(), pre);
    assert_eq!(plain.set_fallback_snapshot(b"a", 0, "*", &v).unwrap_err().code(), pre);
    assert_eq!(plain.flush_snapshot_store().unwrap_err().code(), pre);
    assert_eq!(plain.evict_snapshots().unwrap_err().code(), pre);
    let m = plain.metrics().unwrap();
    assert!(!m.has_snapshot_store);
    assert_eq!(m.store_lookups, 0);
}

#[test]
fn a_long_key_is_sized_by_the_library() {
    // suffix_key starts with a 64-byte buffer and grows it to the size the
    // library asks for: a text with many details gives a long key.
    let engine = Engine::new(&options()).unwrap();
    let text = "Check the status and delivery date and billing address and payment method and balance and \
                fees and price and policy and reason and quantity and history of order 789";
    let k = engine.suffix_key(text).unwrap();
    assert!(k.key.starts_with("QUERY-") && k.key.contains("ORDER") && k.key.contains("-789-"), "{}", k.key);
    assert!(k.key.len() > 64, "{}", k.key);
    assert_eq!(k.fingerprint, fnv1a(&k.key));
}

#[test]
fn the_store_by_hand_versions_pin_rollback_blacklist_deletion() {
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let mut rng = Rng::new(seed);
    let engine = Engine::new(&options()).unwrap();
    let salt: &[u8] = b"tenant-admin";
    let a = admit(&engine, salt, 0);
    let key = Suffix::Key { key: "FAQ-7", group: "g" };
    let (v1, v2) = (rng.vec(DIM, 1.0), rng.vec(DIM, 1.0));
    for v in [&v1, &v1, &v2] {
        engine.record_snapshot(&a, key, v).unwrap();
    }
    let versions = engine.snapshot_versions(salt, 0, key).unwrap();
    assert_eq!(versions.iter().map(|v| v.version).collect::<Vec<_>>(), vec![2, 1], "seed {}", seed);
    assert!(versions[1].served && versions[1].stable && !versions[0].served);
    assert_eq!(versions[1].confirmations, 1);

    engine.pin_snapshot_version(salt, 0, key, 2).unwrap();
    let r = one(&engine, &a, key, None);
    assert_eq!(r.hits[0].version, 2);
    assert!(max_error(&r.snapshots, &unit64(&v2)) <= 1e-3);
    engine.unpin_snapshot_version(salt, 0, key).unwrap();
    assert_eq!(one(&engine, &a, key, None).hits[0].version, 1);
    assert_eq!(engine.unpin_snapshot_version(salt, 0, key).unwrap_err().code(), ErrorCode::NotFound);

    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    engine.blacklist_snapshot_key(salt, 0, key, "wrong answer", now_ms + 3_600_000).unwrap();
    assert_miss(&one(&engine, &a, key, None));
    let listed = engine.snapshot_blacklist().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].salt.as_slice(), listed[0].adapter_id), (salt, 0));
    assert_eq!((listed[0].key.as_str(), listed[0].reason.as_str()), ("FAQ-7", "wrong answer"));
    assert_eq!((listed[0].until_ms, listed[0].fingerprint), (now_ms + 3_600_000, fnv1a("FAQ-7")));
    assert!(listed[0].by_hand && !listed[0].truncated);
    engine.unblacklist_snapshot_key(salt, 0, key).unwrap();
    assert!(engine.snapshot_blacklist().unwrap().is_empty());
    assert_eq!(one(&engine, &a, key, None).hits[0].level, SnapshotLevel::Exact);

    assert_eq!(engine.roll_back_snapshot_key(salt, 0, key, 1).unwrap(), 1);
    // Refused, nothing changed.
    assert_eq!(engine.pin_snapshot_version(salt, 0, key, 2).unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(engine.pin_snapshot_version(b"nobody", 0, key, 1).unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(
        engine.pin_snapshot_version(salt, 0, Suffix::Text("thanks"), 1).unwrap_err().code(),
        ErrorCode::NotFound
    );
    assert_eq!(
        engine.blacklist_snapshot_key(salt, 0, key, "", now_ms + 3_600_000).unwrap_err().code(),
        ErrorCode::InvalidArgument
    );
    assert_eq!(
        engine.blacklist_snapshot_key(salt, 0, key, "late", now_ms - 3_600_000).unwrap_err().code(),
        ErrorCode::InvalidArgument
    );
    assert_eq!(engine.snapshot_versions(salt, 0, key).unwrap().len(), 1);

    assert_eq!(engine.delete_snapshot_key(salt, 0, key).unwrap(), 1);
    assert_miss(&one(&engine, &a, key, None));
    assert_eq!(engine.delete_snapshot_tenant(salt, 0).unwrap_err().code(), ErrorCode::NotFound);
    engine.record_snapshot(&a, key, &v1).unwrap();
    assert_eq!(engine.delete_snapshot_tenant(salt, 0).unwrap(), 1);
    assert_eq!(engine.metrics().unwrap().store_snapshots, 0);
}

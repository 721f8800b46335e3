//! The tiered KV cache through the real library: a host tier that loads
//! evicted pages back byte for byte, a `file://` storage tier shared by
//! engines one after another (prefetched, and fetched at admission), tenant
//! isolation by salt, the version-4 options and metrics, and bad input.
//!
//! Every K/V float a test writes is a function of (salt, tokens[..=t],
//! element), so a cached row can be checked against a value computed here,
//! independently of the library. Prompts are random per run (the seed is in
//! the failure messages); storage lives in a fresh temporary directory.
mod common;

use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use clmcache::{
    AdmitOptions, Engine, EngineOptions, ErrorCode, KvDtype, KvLayout, MemoryKind, PrefetchPolicy, WritePolicy,
};
use common::Rng;

const PAGE: usize = 4;
const LAYERS: usize = 2;
const KV_HEADS: usize = 1;
const HEAD_DIM: usize = 4;
/// Floats per token per layer and K or V.
const ROW: usize = KV_HEADS * HEAD_DIM;

/// A fresh directory under the system's temp directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(seed: u64) -> TempDir {
        let name = format!("clmcache-rust-tiers-{}-{:016x}", std::process::id(), seed);
        let path = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&path).expect("create the temporary directory");
        TempDir(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    /// The storage tier's URL of this directory.
    fn url(&self) -> String {
        format!("file://{}", self.0.display())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A seed for this run's prompts.
fn fresh_seed() -> u64 {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    nanos ^ (std::process::id() as u64).rotate_left(32)
}

fn random_prompt(rng: &mut Rng, n: usize) -> Vec<i32> {
    (0..n).map(|_| (rng.next_u64() % 50_000) as i32).collect()
}

/// The value of float `element` of token `t`'s K/V (all layers, K then V):
/// FNV-1a over the salt and tokens[..=t], mixed with the element index.
fn reference(salt: &[u8], prompt: &[i32], t: usize, element: usize) -> f32 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in salt {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    for &token in &prompt[..=t] {
        h = (h ^ token as u32 as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h ^= (element as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^= h >> 31;
    (h % 65536) as f32
}

/// Index of float `e` of a token's row in layer `layer`, K (`half` 0) or V (1).
fn element(layer: usize, half: usize, e: usize) -> usize {
    (layer * 2 + half) * ROW + e
}

/// Small f32 pages on the host, with a host tier and maybe storage; the
/// write-through policy (a page's first hit gives it its host copy) and
/// admissions that wait for every page storage has.
fn tier_options(num_pages: i32, host_pages: i32, storage_url: Option<String>) -> EngineOptions {
    EngineOptions {
        page_size: PAGE as i32,
        num_layers: LAYERS as i32,
        kv_heads: KV_HEADS as i32,
        head_dim: HEAD_DIM as i32,
        kv_dtype: KvDtype::F32,
        memory: MemoryKind::Host,
        host_pages,
        write_policy: WritePolicy::Through,
        storage_url,
        prefetch_policy: PrefetchPolicy::WaitComplete,
        model_id: Some("rust-test-model".into()),
        ..EngineOptions::new(num_pages)
    }
}

/// What one admission found.
#[derive(Debug, PartialEq, Eq)]
struct Served {
    cached: usize,
    host: usize,
    storage: usize,
}

/// Admits `prompt` under `salt`, checks every float of the cached part
/// against [`reference`] (read back with `gather_pages` and decoded with the
/// engine's KV layout), writes the reference K/V of the rest at the
/// sequence's slots with `write_kv`, and finishes.
fn serve(engine: &mut Engine, salt: &[u8], prompt: &[i32], seed: u64) -> Served {
    let layout: KvLayout = engine.kv_layout().unwrap();
    assert_eq!((layout.kv_dtype, layout.page_size as usize), (KvDtype::F32, PAGE));
    let mut seq = engine.admit_with(prompt, &AdmitOptions::salted(salt)).unwrap();
    let served = Served { cached: seq.cached_tokens(), host: seq.host_tokens(), storage: seq.storage_tokens() };
    assert!(served.storage <= served.host && served.host <= served.cached, "{:?}", served);

    // The cached rows, as the pool holds them.
    let pages = seq.page_table();
    let cached_pages = (served.cached + PAGE - 1) / PAGE;
    let bytes = engine.gather_pages(&pages[..cached_pages]).unwrap();
    let mut wrong = Vec::new();
    for t in 0..served.cached {
        for layer in 0..LAYERS {
            for half in 0..2 {
                let rows = (t / PAGE) * layout.page_bytes + layer * layout.layer_bytes + half * layout.layer_bytes / 2;
                for e in 0..ROW {
                    let at = rows + ((t % PAGE) * ROW + e) * 4;
                    let got = f32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap());
                    let want = reference(salt, prompt, t, element(layer, half, e));
                    if got != want {
                        wrong.push((t, layer, half, e, got, want));
                    }
                }
            }
        }
    }
    assert!(wrong.is_empty(), "seed {:#x}: {} cached floats differ, first {:?}", seed, wrong.len(), wrong[0]);

    // The new rows: prompt[cached..].
    let slots = seq.slots().to_vec();
    assert_eq!(slots.len(), prompt.len() - served.cached);
    for layer in 0..LAYERS {
        let rows = |half: usize| -> Vec<f32> {
            (0..slots.len())
                .flat_map(|i| (0..ROW).map(move |e| (served.cached + i, element(layer, half, e))))
                .map(|(t, el)| reference(salt, prompt, t, el))
                .collect()
        };
        engine.write_kv(layer as i32, &slots, &rows(0), &rows(1)).unwrap();
    }
    seq.finish().unwrap();
    served
}

fn assert_error(result: clmcache::Result<impl std::fmt::Debug>, code: ErrorCode, what: &str) {
    match result {
        Ok(value) => panic!("{}: succeeded ({:?}), want {}", what, value, code),
        Err(e) => {
            assert_eq!(e.code(), code, "{}: {}", what, e);
            assert!(!e.message().trim().is_empty(), "{}: no message", what);
        }
    }
}

#[test]
fn version_4_options_have_the_documented_defaults() {
    let d = EngineOptions::default();
    assert_eq!((d.host_pages, d.write_policy, d.storage_url.as_deref()), (0, WritePolicy::Through, None));
    assert_eq!(
        (d.prefetch_policy, d.prefetch_timeout_ms, d.prefetch_timeout_per_1k_tokens_ms),
        (PrefetchPolicy::Timeout, 20.0, 10.0)
    );
    assert_eq!((d.storage_workers, d.storage_batch_pages), (2, 32));
    assert_eq!((d.max_queued_fetches, d.breaker_failures), (64, 3));
    assert_eq!((d.admission_deadline_ms, d.breaker_open_ms), (2000.0, 5000.0));
    assert_eq!(d.model_id, None);
    assert!(!d.has_tiers() && !d.has_storage());
    assert_eq!(WritePolicy::from_raw(clmcache::sys::CLM_WRITE_BACK), Some(WritePolicy::Back));
    assert_eq!(PrefetchPolicy::BestEffort.raw(), clmcache::sys::CLM_PREFETCH_BEST_EFFORT);
    assert_eq!(WritePolicy::from_raw(3), None);

    // to_raw cannot own the URL's NUL-terminated copy; to_raw_owned does.
    let url = "file:///nonexistent/clm?capacity_mb=1".to_string();
    let options = tier_options(8, 8, Some(url.clone()));
    assert!(options.has_tiers() && options.has_storage());
    let raw = options.to_raw().unwrap();
    assert!(raw.storage_url.is_null());
    assert_eq!((raw.host_pages, raw.write_policy), (8, clmcache::sys::CLM_WRITE_THROUGH));
    assert_eq!(raw.prefetch_policy, clmcache::sys::CLM_PREFETCH_WAIT_COMPLETE);
    let owned = options.to_raw_owned().unwrap();
    assert!(!owned.as_raw().storage_url.is_null());
    // SAFETY: a non-NULL storage_url points to the NUL-terminated copy `owned` holds.
    let copied = unsafe { CStr::from_ptr(owned.as_raw().storage_url) };
    assert_eq!(copied.to_str().unwrap(), url);
    // An empty URL is no storage tier, as None is.
    let empty = tier_options(8, 8, Some(String::new()));
    assert!(!empty.has_storage());
    assert!(empty.to_raw_owned().unwrap().as_raw().storage_url.is_null());
}

#[test]
fn host_tier_loads_evicted_pages_back_exactly() {
    let seed = fresh_seed();
    let mut rng = Rng::new(seed);
    // 16 device pages hold 64 tokens: one 41-token prompt (11 pages) at a time.
    let mut engine = Engine::new(&tier_options(16, 64, None)).unwrap();
    let a = random_prompt(&mut rng, 41);
    assert_eq!(serve(&mut engine, b"t", &a, seed).cached, 0);
    // The hit: a's pages get their host copies (write-through).
    assert_eq!(serve(&mut engine, b"t", &a, seed), Served { cached: 40, host: 0, storage: 0 });
    engine.wait_for_tiers().unwrap();
    for _ in 0..4 {
        let other = random_prompt(&mut rng, 41);
        serve(&mut engine, b"t", &other, seed); // evicts a from the device
    }
    let again = serve(&mut engine, b"t", &a, seed); // checks every cached float
    assert_eq!(again.cached, 40, "seed {:#x}", seed);
    assert!(again.host > 0, "seed {:#x}: nothing was loaded back from the host tier: {:?}", seed, again);
    assert_eq!(again.storage, 0);
    engine.wait_for_tiers().unwrap();

    let m = engine.metrics().unwrap();
    assert!(m.has_tiers && !m.has_storage, "{:?}", m);
    assert_eq!(m.host_hit_tokens, again.host as u64);
    assert_eq!(m.loaded_pages * PAGE as u64, m.host_hit_tokens);
    assert_eq!(m.load_backs, 1);
    assert_eq!((m.storage_hit_tokens, m.stored_pages, m.fetched_pages), (0, 0, 0));
    assert!(m.backed_up_pages >= 10, "{:?}", m);
    assert_eq!(m.host_pages_total, 64);
    assert!(m.host_pages_used > 0 && m.host_cached_tokens == m.host_pages_used * PAGE as i64, "{:?}", m);

    // Another tenant shares nothing, at any tier.
    assert_eq!(serve(&mut engine, b"u", &a, seed), Served { cached: 0, host: 0, storage: 0 });
    // Without a storage tier there is nothing to prefetch from.
    assert_error(engine.prefetch(&a, &AdmitOptions::salted(b"t")), ErrorCode::FailedPrecondition, "prefetch");
}

#[test]
fn storage_directory_is_shared_by_engines_in_turn() {
    let seed = fresh_seed();
    let mut rng = Rng::new(seed);
    let dir = TempDir::new(seed);
    let p = random_prompt(&mut rng, 57); // 14 whole pages: 56 tokens can come from storage
    let whole = 56;
    {
        let mut first = Engine::new(&tier_options(64, 64, Some(dir.url()))).unwrap();
        serve(&mut first, b"acme", &p, seed);
        serve(&mut first, b"acme", &p, seed); // the hit: host copies, then stored copies
        first.wait_for_tiers().unwrap();
        let m = first.metrics().unwrap();
        assert!(m.has_tiers && m.has_storage, "{:?}", m);
        assert_eq!(m.stored_pages, (whole / PAGE) as u64, "{:?}", m);
    }
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_some(), "nothing was written to {}", dir.url());

    // A queued request: prefetched into the host tier before its admission.
    {
        let mut second = Engine::new(&tier_options(64, 64, Some(dir.url()))).unwrap();
        second.prefetch(&p, &AdmitOptions::salted(b"acme")).unwrap();
        second.wait_for_tiers().unwrap();
        assert_eq!(second.metrics().unwrap().fetched_pages, (whole / PAGE) as u64);
        // Checks every cached float; the prefetch had fetched them all already.
        let got = serve(&mut second, b"acme", &p, seed);
        assert_eq!(got, Served { cached: whole, host: whole, storage: 0 }, "seed {:#x}", seed);
        let m = second.metrics().unwrap();
        assert_eq!((m.fetched_pages, m.host_hit_tokens), ((whole / PAGE) as u64, whole as u64));
        assert_eq!((m.storage_corrupt_pages, m.storage_errors), (0, 0));
        // The salt is in every page's key.
        assert_eq!(second.prefetch(&p, &AdmitOptions::salted(b"acme-2")), Ok(()));
        second.wait_for_tiers().unwrap();
        assert_eq!(serve(&mut second, b"acme-2", &p, seed).cached, 0);
        assert_eq!(second.metrics().unwrap().fetched_pages, (whole / PAGE) as u64);
    }

    // No prefetch: the admission fetches from storage itself and waits.
    let mut third = Engine::new(&tier_options(64, 64, Some(dir.url()))).unwrap();
    let got = serve(&mut third, b"acme", &p, seed);
    assert_eq!(got, Served { cached: whole, host: whole, storage: whole }, "seed {:#x}", seed);
    let m = third.metrics().unwrap();
    assert_eq!((m.storage_hit_tokens, m.fetched_pages), (whole as u64, (whole / PAGE) as u64));
    assert_eq!(serve(&mut third, b"other", &p, seed).cached, 0);

    // Another model (the same layout, salt and prompt) is served none of these pages.
    let other_model = EngineOptions { model_id: Some("another-model".into()), ..tier_options(64, 64, Some(dir.url())) };
    let mut fourth = Engine::new(&other_model).unwrap();
    assert_eq!(serve(&mut fourth, b"acme", &p, seed), Served { cached: 0, host: 0, storage: 0 });
    assert_eq!(fourth.metrics().unwrap().fetched_pages, 0);
}

#[test]
fn bad_tier_options_and_calls_are_errors() {
    let seed = fresh_seed();
    let dir = TempDir::new(seed);
    let create = |host_pages: i32, url: Option<String>, what: &str| {
        assert_error(Engine::new(&tier_options(8, host_pages, url)), ErrorCode::InvalidArgument, what);
    };
    create(8, Some("s3://x".into()), "an unknown URL scheme");
    create(8, Some("redis://[::1".into()), "a URL that does not parse");
    create(0, Some(dir.url()), "storage without a host tier");
    create(-1, None, "negative host_pages");
    create(8, Some(format!("{}\0x", dir.url())), "a URL with a NUL byte");
    let no_workers = EngineOptions { storage_workers: 0, ..tier_options(8, 8, Some(dir.url())) };
    assert_error(Engine::new(&no_workers), ErrorCode::InvalidArgument, "storage_workers 0");
    let no_model = EngineOptions { model_id: None, ..tier_options(8, 8, Some(dir.url())) };
    assert_error(Engine::new(&no_model), ErrorCode::InvalidArgument, "storage without a model id");
    let nul_model = EngineOptions { model_id: Some("m\0x".into()), ..tier_options(8, 8, Some(dir.url())) };
    assert_error(Engine::new(&nul_model), ErrorCode::InvalidArgument, "a model id with a NUL byte");
    let both_secrets = EngineOptions {
        page_secret_file: Some(dir.path().join("page.key")),
        page_secret_env: Some("HOME".into()),
        ..tier_options(8, 8, Some(dir.url()))
    };
    assert_error(Engine::new(&both_secrets), ErrorCode::InvalidArgument, "a page secret from a file and a variable");
    // (Unknown policy values cannot be written: WritePolicy and PrefetchPolicy are enums.)

    // Prefetch needs a storage tier.
    let plain = Engine::new(&EngineOptions { memory: MemoryKind::None, ..EngineOptions::new(8) }).unwrap();
    let host_only = Engine::new(&tier_options(8, 8, Some(String::new()))).unwrap();
    assert!(host_only.metrics().unwrap().has_tiers && !host_only.metrics().unwrap().has_storage);
    let prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9];
    for (engine, what) in [(&plain, "no tiers"), (&host_only, "no storage tier")] {
        assert_error(engine.prefetch(&prompt, &AdmitOptions::default()), ErrorCode::FailedPrecondition, what);
        engine.wait_for_tiers().unwrap(); // nothing to wait for
    }
    let mut seq = plain.admit(&prompt).unwrap();
    assert_eq!((seq.cached_tokens(), seq.host_tokens(), seq.storage_tokens()), (0, 0, 0));
    seq.finish().unwrap();
    assert!(!plain.metrics().unwrap().has_tiers);

    // Bad prompts, with a storage tier.
    let stored = Engine::new(&tier_options(8, 8, Some(dir.url()))).unwrap();
    assert_error(stored.prefetch(&[1, -5, 3], &AdmitOptions::default()), ErrorCode::InvalidArgument, "a negative id");
    assert_error(stored.prefetch(&[], &AdmitOptions::default()), ErrorCode::InvalidArgument, "an empty prompt");
    stored.prefetch(&prompt, &AdmitOptions::salted(b"t")).unwrap(); // nothing stored yet: no error
    stored.wait_for_tiers().unwrap();
    assert_eq!(stored.metrics().unwrap().fetched_pages, 0);
}

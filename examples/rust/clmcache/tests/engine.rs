//! The safe wrapper against the real library: errors, the request lifecycle,
//! tenant isolation, metrics, threads and Drop.
use std::collections::HashSet;
use std::sync::Arc;
use std::thread;

use clmcache::{
    sys, AdmitOptions, Engine, EngineOptions, ErrorCode, EvictionPolicy, KvDtype, MemoryKind, PriorityUpdate, Sequence,
};

const PAGE: usize = 16;

fn options(num_pages: i32) -> EngineOptions {
    EngineOptions { page_size: PAGE as i32, memory: MemoryKind::None, ..EngineOptions::new(num_pages) }
}

fn engine(num_pages: i32) -> Engine {
    Engine::new(&options(num_pages)).expect("engine")
}

/// `n` distinct token ids starting at `first`.
fn tokens(first: i32, n: usize) -> Vec<i32> {
    (0..n as i32).map(|i| first + i).collect()
}

/// Largest multiple of the page size that is <= n.
fn page_floor(n: usize) -> usize {
    n / PAGE * PAGE
}

/// What the library must report as cached for `prompt_len` tokens when a
/// prefix of `published` tokens of it is in the cache: whole pages only, and
/// at most prompt_len - 1 (the last token is always computed).
fn expected_cached(published: usize, prompt_len: usize) -> usize {
    page_floor(published.min(prompt_len - 1))
}

/// Slots of tokens [begin, end) of a sequence with page table `pages`.
fn slots_of(pages: &[i32], begin: usize, end: usize) -> Vec<i64> {
    (begin..end).map(|t| pages[t / PAGE] as i64 * PAGE as i64 + (t % PAGE) as i64).collect()
}

fn pages_for(tokens: usize) -> usize {
    (tokens + PAGE - 1) / PAGE
}

#[test]
fn version_matches_the_header() {
    assert!(clmcache::version_matches(), "library {} vs header {}", clmcache::version(), sys::CLM_VERSION_NUMBER);
    assert_eq!(clmcache::version_string(), "0.1.0");
}

#[test]
fn handle_types_are_send_and_sync_as_documented() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Engine>();
    send::<Sequence>();
    // Sequence: !Sync is checked by a compile_fail doc test in src/lib.rs.
}

#[test]
fn defaults_come_from_the_library() {
    let mut raw = sys::clm_engine_options::default();
    // SAFETY: raw is a valid struct of the size passed.
    let status = unsafe { sys::clm_engine_options_init(&mut raw, std::mem::size_of::<sys::clm_engine_options>()) };
    assert_eq!(status, sys::CLM_OK);
    let defaults = EngineOptions::default();
    assert_eq!(defaults.num_pages, raw.num_pages);
    assert_eq!(defaults.page_size, raw.page_size);
    assert_eq!(defaults.num_layers, raw.num_layers);
    assert_eq!(defaults.kv_heads, raw.kv_heads);
    assert_eq!(defaults.head_dim, raw.head_dim);
    assert_eq!(defaults.kv_dtype.raw(), raw.kv_dtype);
    assert_eq!(defaults.memory.raw(), raw.memory);
    assert_eq!(defaults.device, raw.device);
    assert_eq!(defaults.eviction_policy.raw(), raw.eviction_policy);
    assert_eq!(defaults.slru_protected_fraction, raw.slru_protected_fraction);
    // What clm.h documents.
    assert_eq!(defaults.page_size, 16);
    assert_eq!(defaults.kv_dtype, KvDtype::F16);
    assert_eq!(defaults.memory, MemoryKind::Host);
    assert_eq!(defaults.eviction_policy, EvictionPolicy::Lru);
    assert_eq!(defaults.slru_protected_fraction, 0.2);
    assert_eq!(EngineOptions::new(7).num_pages, 7);

    let admit = AdmitOptions::default();
    assert_eq!(
        admit,
        AdmitOptions {
            cache_salt: None,
            adapter_id: 0,
            priority: 0,
            priority_update: PriorityUpdate::Raise,
            tenant: None
        }
    );
}

#[test]
fn bad_options_are_errors_with_code_and_message() {
    let cases: Vec<(&str, EngineOptions)> = vec![
        ("num_pages", options(0)),
        ("num_pages", options(-3)),
        ("page_size", EngineOptions { page_size: 0, ..options(64) }),
        ("slru_protected_fraction", EngineOptions { slru_protected_fraction: 1.5, ..options(64) }),
        ("slru_protected_fraction", EngineOptions { slru_protected_fraction: f64::NAN, ..options(64) }),
    ];
    for (what, opts) in cases {
        let err = Engine::new(&opts).expect_err(what);
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{}: {}", what, err);
        assert_eq!(err.code().raw(), sys::CLM_ERR_INVALID_ARGUMENT);
        assert!(!err.message().is_empty(), "{}: empty message", what);
        assert!(err.message().contains(what), "{}: message {:?}", what, err.message());
        assert_eq!(err.code().name(), "invalid_argument");
        assert!(err.to_string().contains(err.message()));
    }
}

#[test]
fn errors_are_read_on_the_failing_thread() {
    let err = thread::spawn(|| Engine::new(&options(0)).unwrap_err()).join().unwrap();
    assert!(err.message().contains("num_pages"));
    // clm_last_error is thread-local: the other thread's failure is not ours.
    // SAFETY: returns a valid thread-local string.
    let here = unsafe { std::ffi::CStr::from_ptr(sys::clm_last_error()) };
    assert!(!here.to_string_lossy().contains("num_pages"), "{:?}", here);
}

#[test]
fn plan_admission_says_what_admit_takes_and_changes_nothing() {
    let e = engine(8);
    let plan = |prompt: &[i32], options: Option<&AdmitOptions<'_>>| {
        let before = e.metrics().unwrap();
        let p = e.plan_admission(prompt, options).unwrap();
        let after = e.metrics().unwrap();
        assert_eq!(after.tokens_queried, before.tokens_queried);
        assert_eq!(after.evictable_tokens, before.evictable_tokens);
        assert_eq!(after.pages_free, before.pages_free);
        assert_eq!((p.pages_free, p.evictable_tokens), (before.pages_free, before.evictable_tokens));
        p
    };
    let mut first = e.admit(&tokens(0, 64)).unwrap(); // 4 pages, cached at finish
    first.finish().unwrap();
    let prompt = tokens(0, 70);
    let want = expected_cached(64, prompt.len());
    let p = plan(&prompt, None);
    assert_eq!(p.cached_tokens as usize, want);
    assert_eq!(p.new_pages as usize, pages_for(prompt.len()) - want / PAGE);
    assert_eq!(p.unlocked_pages as usize, want / PAGE);
    let mut s = e.admit(&prompt).unwrap();
    assert_eq!(s.cached_tokens() as i32, p.cached_tokens);
    // Locked by s now; another tenant matches nothing.
    assert_eq!(plan(&prompt, None).unlocked_pages, 0);
    let other = AdmitOptions::salted(b"other");
    assert_eq!(plan(&prompt, Some(&other)).cached_tokens, 0);
    s.abort().unwrap();
    for bad in [&[][..], &[1, 2, -3][..]] {
        let err = e.plan_admission(bad, None).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument);
        assert!(!err.message().is_empty());
    }
}

#[test]
fn a_pinned_prefix_outlives_a_flood_and_unpin_lets_it_go() {
    let e = engine(32); // a pin budget of 8 pages
    let pinned = tokens(0, 97); // 6 pages cached at finish
    let unpinned = tokens(1000, 97);
    for prompt in [&pinned, &unpinned] {
        let mut s = e.admit(prompt).unwrap();
        s.finish().unwrap();
    }
    let missing = e.pin_prefix(&tokens(5000, 40), None, std::time::Duration::from_secs(60)).unwrap_err();
    assert_eq!(missing.code(), ErrorCode::NotFound);
    let pin = e.pin_prefix(&pinned, None, std::time::Duration::from_secs(60)).unwrap();
    assert_ne!(pin.id, 0);
    assert_eq!(pin.pinned_tokens, 96);
    let over = e.pin_prefix(&unpinned, None, std::time::Duration::from_secs(60)).unwrap_err();
    assert_eq!(over.code(), ErrorCode::OutOfMemory);
    let zero = e.pin_prefix(&pinned, None, std::time::Duration::ZERO).unwrap_err();
    assert_eq!(zero.code(), ErrorCode::InvalidArgument);
    let flood = |from: i32| {
        for i in 0..12 {
            let mut s = e.admit(&tokens(from + 100 * i, 65)).unwrap();
            s.finish().unwrap();
        }
    };
    flood(20000);
    assert_eq!(e.plan_admission(&pinned, None).unwrap().cached_tokens, 96);
    assert_eq!(e.plan_admission(&unpinned, None).unwrap().cached_tokens, 0);
    e.unpin(&pin).unwrap();
    assert_eq!(e.unpin(&pin).unwrap_err().code(), ErrorCode::NotFound);
    flood(40000);
    assert_eq!(e.plan_admission(&pinned, None).unwrap().cached_tokens, 0);
}

#[test]
fn a_priority_hint_is_checked_and_reaches_the_cached_prefix() {
    let e = engine(32);
    let prompt = tokens(0, 97);
    let mut s = e.admit(&prompt).unwrap();
    s.finish().unwrap();
    let ttl = std::time::Duration::from_secs(60);
    assert_eq!(e.hint_prefix(b"conversation-1", &prompt, None, 1, ttl).unwrap(), 96);
    assert_eq!(e.hint_prefix(b"conversation-2", &tokens(5000, 40), None, 1, ttl).unwrap(), 0);
    for (key, priority, ttl) in
        [(&b""[..], 1, ttl), (&b"k"[..], 0, ttl), (&b"k"[..], 101, ttl), (&b"k"[..], 1, std::time::Duration::ZERO)]
    {
        let err = e.hint_prefix(key, &prompt, None, priority, ttl).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{:?}", err);
    }
}

#[test]
fn bad_tokens_are_errors() {
    let engine = engine(64);
    assert_eq!(engine.admit(&[]).unwrap_err().code(), ErrorCode::InvalidArgument);
    let err = engine.admit(&[1, 2, -5]).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.message().contains("-5"), "{}", err);

    let mut seq = engine.admit(&[1, 2, 3]).unwrap();
    let err = seq.extend(&[4, -1]).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    // A rejected extend leaves the sequence running.
    assert_eq!(seq.extend(&[4]).unwrap().len(), 1);
    seq.finish().unwrap();
}

#[test]
fn second_turn_reuses_the_first_turns_pages() {
    let engine = engine(256);

    // Turn 1: a 37-token prompt, nothing cached, then 20 decode steps.
    let prompt1 = tokens(1000, 37);
    let mut turn1 = engine.admit(&prompt1).unwrap();
    assert_eq!(turn1.cached_tokens(), 0);
    let pages = turn1.page_table();
    assert_eq!(pages.len(), pages_for(prompt1.len()));
    assert_eq!(turn1.slots(), &slots_of(&pages, 0, prompt1.len())[..]);

    let output = tokens(5000, 20);
    for (i, &token) in output.iter().enumerate() {
        let position = prompt1.len() + i;
        let slots = turn1.extend(&[token]).unwrap().to_vec();
        let pages = turn1.page_table();
        assert_eq!(pages.len(), pages_for(position + 1));
        assert_eq!(slots, slots_of(&pages, position, position + 1), "decode step {}", i);
    }
    let turn1_len = prompt1.len() + output.len(); // 57
    let turn1_pages = turn1.page_table();
    turn1.finish().unwrap();

    // Turn 2: the whole conversation so far plus the user's next message.
    let mut prompt2 = prompt1.clone();
    prompt2.extend_from_slice(&output);
    prompt2.extend(tokens(9000, 10));
    let turn2 = engine.admit(&prompt2).unwrap();
    let expected = expected_cached(turn1_len, prompt2.len());
    assert_eq!(expected, 48); // 57 tokens published -> 3 whole pages
    assert_eq!(turn2.cached_tokens(), expected);
    let pages2 = turn2.page_table();
    assert_eq!(pages2.len(), pages_for(prompt2.len()));
    assert_eq!(&pages2[..expected / PAGE], &turn1_pages[..expected / PAGE], "the cached pages are turn 1's");
    assert_eq!(turn2.slots(), &slots_of(&pages2, expected, prompt2.len())[..]);
}

#[test]
fn a_prompt_fully_in_cache_still_computes_its_last_token() {
    let engine = engine(64);
    let prompt = tokens(1, 64);
    engine.admit(&prompt).unwrap().finish().unwrap();
    let again = engine.admit(&prompt).unwrap();
    assert_eq!(again.cached_tokens(), expected_cached(64, 64));
    assert_eq!(again.cached_tokens(), 48);
    assert_eq!(again.slots().len(), 16);
}

#[test]
fn salts_and_adapters_isolate_tenants() {
    let engine = engine(256);
    let prompt = tokens(100, 64);
    let a = AdmitOptions::salted(b"tenant-a");
    let b = AdmitOptions::salted(b"tenant-b");

    engine.admit_with(&prompt, &a).unwrap().finish().unwrap();
    assert_eq!(engine.admit_with(&prompt, &b).unwrap().cached_tokens(), 0, "tenant b sees tenant a's pages");
    assert_eq!(engine.admit(&prompt).unwrap().cached_tokens(), 0, "the unsalted cache sees tenant a's pages");
    let other_adapter = AdmitOptions { adapter_id: 3, ..a };
    assert_eq!(engine.admit_with(&prompt, &other_adapter).unwrap().cached_tokens(), 0, "adapter 3 reuses adapter 0");
    // Salts are bytes, not C strings: a NUL inside one is part of it.
    let with_nul = AdmitOptions::salted(b"tenant-a\0x");
    assert_eq!(engine.admit_with(&prompt, &with_nul).unwrap().cached_tokens(), 0);

    assert_eq!(engine.admit_with(&prompt, &a).unwrap().cached_tokens(), expected_cached(64, 64));
    // An empty salt is the unsalted cache.
    engine.admit(&prompt).unwrap().finish().unwrap();
    let empty = AdmitOptions::salted(b"");
    assert_eq!(engine.admit_with(&prompt, &empty).unwrap().cached_tokens(), expected_cached(64, 64));
}

#[test]
fn extend_gives_slots_in_the_page_table() {
    let engine = engine(64);
    let prompt = tokens(1, 5);
    let mut seq = engine.admit(&prompt).unwrap();
    let decoded = tokens(50, 30);
    let slots = seq.extend(&decoded).unwrap().to_vec();
    assert_eq!(slots.len(), decoded.len());

    let pages = seq.page_table();
    assert_eq!(pages.len(), pages_for(prompt.len() + decoded.len()));
    let distinct: HashSet<i32> = pages.iter().copied().collect();
    assert_eq!(distinct.len(), pages.len(), "a page appears twice: {:?}", pages);
    assert!(pages.iter().all(|&p| (0..64).contains(&p)), "{:?}", pages);
    for (i, &slot) in slots.iter().enumerate() {
        let page = (slot / PAGE as i64) as i32;
        assert!(pages.contains(&page), "slot {} is on page {}, not in {:?}", slot, page, pages);
        let position = prompt.len() + i;
        assert_eq!(page, pages[position / PAGE]);
        assert_eq!(slot as usize % PAGE, position % PAGE);
    }
    assert_eq!(seq.slots(), &slots[..], "slots() is the last extend's");

    // An empty extend is fine and adds nothing.
    assert!(seq.extend(&[]).unwrap().is_empty());
    assert_eq!(seq.page_table(), pages);
    seq.finish().unwrap();
}

#[test]
fn batch_page_table_matches_each_sequence() {
    let engine = engine(256);
    let seqs = [
        engine.admit(&tokens(1, 3)).unwrap(),
        engine.admit(&tokens(1000, 500)).unwrap(), // more pages than the first guess
        engine.admit(&tokens(2000, 32)).unwrap(),
    ];
    let lengths = [3usize, 500, 32];
    let refs: Vec<&Sequence> = seqs.iter().collect();
    let batch = engine.batch_page_table(&refs).unwrap();
    assert_eq!(batch.indptr.len(), seqs.len() + 1);
    assert_eq!(batch.indptr[0], 0);
    for (i, seq) in seqs.iter().enumerate() {
        let range = batch.indptr[i] as usize..batch.indptr[i + 1] as usize;
        assert_eq!(&batch.indices[range], &seq.page_table()[..]);
        assert_eq!(batch.last_page_len[i] as usize, lengths[i] - (pages_for(lengths[i]) - 1) * PAGE);
    }
    assert_eq!(batch.indices.len(), *batch.indptr.last().unwrap() as usize);
    assert_eq!(engine.batch_page_table(&[]).unwrap().indptr, vec![0]);

    let other = self::engine(16);
    let foreign = other.admit(&tokens(1, 3)).unwrap();
    let err = engine.batch_page_table(&[&seqs[0], &foreign]).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.message().contains("another engine"), "{}", err);
}

#[test]
fn finishing_twice_or_after_abort_is_a_failed_precondition() {
    let engine = engine(64);

    let mut seq = engine.admit(&tokens(1, 20)).unwrap();
    seq.finish().unwrap();
    let err = seq.finish().unwrap_err();
    assert_eq!(err.code(), ErrorCode::FailedPrecondition);
    assert!(err.message().contains("finished"), "{}", err);
    assert_eq!(seq.abort().unwrap_err().code(), ErrorCode::FailedPrecondition);
    assert_eq!(seq.extend(&[1]).unwrap_err().code(), ErrorCode::FailedPrecondition);

    let mut seq = engine.admit(&tokens(100, 20)).unwrap();
    seq.abort().unwrap();
    let err = seq.finish().unwrap_err();
    assert_eq!(err.code(), ErrorCode::FailedPrecondition);
    assert!(err.message().contains("aborted"), "{}", err);
    assert_eq!(seq.abort().unwrap_err().code(), ErrorCode::FailedPrecondition);
}

#[test]
fn an_ended_sequence_has_no_pages_or_slots() {
    // clm.h: an ended sequence's pages belong to the cache or to other
    // sequences, so its page table and slots are empty.
    let engine = engine(64);
    let mut finished = engine.admit(&tokens(1, 20)).unwrap();
    finished.extend(&[7; 20]).unwrap();
    assert_eq!(finished.page_table().len(), pages_for(40));
    finished.finish().unwrap();
    assert!(finished.page_table().is_empty());
    assert!(finished.slots().is_empty());

    let mut aborted = engine.admit(&tokens(100, 20)).unwrap();
    aborted.abort().unwrap();
    assert!(aborted.page_table().is_empty());
    assert!(aborted.slots().is_empty());
    let other = engine.admit(&tokens(100, 20)).unwrap();
    let refs = [&other, &aborted];
    assert_eq!(engine.batch_page_table(&refs).unwrap_err().code(), ErrorCode::FailedPrecondition);
}

#[test]
fn metrics_count_what_happened() {
    const PAGES: i32 = 16;
    let engine = engine(PAGES);
    let m = engine.metrics().unwrap();
    assert_eq!(
        m,
        clmcache::Metrics {
            pages_free: PAGES,
            metadata_bytes: m.metadata_bytes,
            src_threshold: m.src_threshold,
            ..Default::default()
        }
    );
    assert!((m.src_threshold - 0.8).abs() < 1e-6, "the default threshold: {}", m.src_threshold);

    let shared = tokens(1, 32);
    engine.admit(&shared).unwrap().finish().unwrap(); // A: published, 2 pages
    engine.admit(&shared).unwrap().abort().unwrap(); // B: hits 16, aborted
    let running = engine.admit(&tokens(500, 20)).unwrap(); // C: 2 pages, running
    let too_big = tokens(1000, PAGES as usize * PAGE * 2);
    let err = engine.admit(&too_big).unwrap_err(); // D: rejected
    assert_eq!(err.code(), ErrorCode::OutOfMemory);
    assert!(!err.message().is_empty());

    let m = engine.metrics().unwrap();
    assert_eq!(m.admitted, 3);
    assert_eq!(m.finished, 1);
    assert_eq!(m.aborted, 1);
    assert_eq!(m.rejected, 1);
    assert_eq!(m.active_sequences, 1);
    let queried = (32 + 32 + 20 + too_big.len()) as u64;
    assert_eq!(m.tokens_queried, queried);
    assert_eq!(m.tokens_hit, expected_cached(32, 32) as u64);
    assert!((m.hit_rate - 16.0 / queried as f64).abs() < 1e-12);
    assert_eq!(m.inserted_tokens, 32);
    assert_eq!(m.cached_tokens, 32);
    assert_eq!(m.evictable_tokens + m.protected_tokens, m.cached_tokens);
    assert_eq!(m.pages_used, 4); // A's 2 in the cache + C's 2
    assert_eq!(m.pages_used + m.pages_free, PAGES);
    assert_eq!(m.evictions, 0);

    drop(running); // dropping a running sequence aborts it
    let m = engine.metrics().unwrap();
    assert_eq!(m.aborted, 2);
    assert_eq!(m.active_sequences, 0);
    assert_eq!(m.pages_used, 2);
}

#[test]
fn metrics_text_shows_the_metrics_in_prometheus_text() {
    let engine = engine(16);
    let shared = tokens(1, 32);
    engine.admit(&shared).unwrap().finish().unwrap();
    engine.admit(&shared).unwrap().finish().unwrap(); // hits 16
    let text = engine.metrics_text().unwrap();
    let m = engine.metrics().unwrap();
    assert!(text.starts_with("# HELP clm_"), "{}", text);
    assert!(text.ends_with('\n'));
    let value = |series: &str| -> f64 {
        let line = text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')).expect(series);
        line.parse().expect(series)
    };
    assert_eq!(value("clm_prefix_cache_queries_total"), m.tokens_queried as f64);
    assert_eq!(value("clm_prefix_cache_hits_total"), 16.0);
    assert_eq!(value("clm_cached_tokens_total{source=\"device\"}"), m.tokens_hit as f64);
    assert_eq!(value("clm_sequences_finished_total"), 2.0);
    assert_eq!(value("clm_evictable_tokens"), m.evictable_tokens as f64);
}

#[test]
fn metrics_text_sizing_call_exact_fit_and_one_byte_short() {
    let engine = engine(16);
    engine.admit(&tokens(1, 20)).unwrap().finish().unwrap();
    let whole = engine.metrics_text().unwrap();
    // The sizing call: an error that gives the length.
    let mut length = 0usize;
    // SAFETY: NULL with capacity 0; the engine is live.
    let status = unsafe { sys::clm_engine_metrics_text(std::ptr::null_mut(), 0, &mut length, engine.as_raw()) };
    assert_eq!(status, sys::CLM_ERR_INVALID_ARGUMENT);
    assert_eq!(length, whole.len());
    // One byte short (no room for the NUL): an error, and nothing written.
    let mut buffer = vec![0x7fu8; whole.len() + 1];
    length = 0;
    // SAFETY: buffer is writable for whole.len() bytes; the engine is live.
    let status = unsafe {
        sys::clm_engine_metrics_text(buffer.as_mut_ptr() as *mut _, whole.len(), &mut length, engine.as_raw())
    };
    assert_eq!(status, sys::CLM_ERR_INVALID_ARGUMENT);
    assert_eq!(length, whole.len());
    assert!(buffer.iter().all(|&b| b == 0x7f));
    // Exactly enough: the text and its NUL.
    // SAFETY: buffer is writable for its length; the engine is live.
    let status = unsafe {
        sys::clm_engine_metrics_text(buffer.as_mut_ptr() as *mut _, buffer.len(), &mut length, engine.as_raw())
    };
    assert_eq!(status, sys::CLM_OK);
    assert_eq!(&buffer[..length], whole.as_bytes());
    assert_eq!(buffer[length], 0);
}

#[test]
fn metrics_text_while_another_thread_serves() {
    // The counters grow between metrics_text's sizing call and the next: its
    // retry loop must still return whole texts.
    let engine = Arc::new(engine(64));
    let server = {
        let engine = Arc::clone(&engine);
        thread::spawn(move || {
            for i in 0..400 {
                engine.admit(&tokens(1 + 1000 * (i % 7), 1 + i as usize % 50)).unwrap().finish().unwrap();
            }
        })
    };
    let mut last = 0.0f64;
    loop {
        let served = server.is_finished(); // then this text is the last one
        let text = engine.metrics_text().unwrap();
        assert!(text.starts_with("# HELP clm_") && text.ends_with('\n'), "{}", text);
        let queried: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("clm_prefix_cache_queries_total "))
            .expect("clm_prefix_cache_queries_total")
            .parse()
            .unwrap();
        assert!(queried >= last);
        last = queried;
        if served {
            break;
        }
    }
    server.join().unwrap();
    let m = engine.metrics().unwrap();
    assert_eq!(m.finished, 400);
    assert_eq!(last, m.tokens_queried as f64);
}

#[test]
fn kv_layout_describes_the_pool() {
    let engine = Engine::new(&EngineOptions {
        num_layers: 2,
        kv_heads: 4,
        head_dim: 8,
        kv_dtype: KvDtype::F32,
        memory: MemoryKind::Host,
        page_size: PAGE as i32,
        ..EngineOptions::new(10)
    })
    .unwrap();
    let layout = engine.kv_layout().unwrap();
    assert!(!layout.base.is_null());
    let layer_bytes = 2 * PAGE * 4 * 8 * 4; // K and V, [page_size][heads][dim] of f32
    assert_eq!(layout.layer_bytes, layer_bytes);
    assert_eq!(layout.page_bytes, 2 * layer_bytes);
    assert_eq!((layout.num_pages, layout.page_size, layout.num_layers), (10, PAGE as i32, 2));
    assert_eq!((layout.kv_heads, layout.head_dim), (4, 8));
    assert_eq!((layout.kv_dtype, layout.memory), (KvDtype::F32, MemoryKind::Host));

    // The host writes a token's K through the layout and the slot.
    let mut seq = engine.admit(&[1, 2, 3]).unwrap();
    let slot = seq.extend(&[4]).unwrap()[0] as usize;
    let (page, row) = (slot / PAGE, slot % PAGE);
    let row_bytes = 4 * 8 * 4;
    // SAFETY: the page belongs to `seq`, the offset lies inside the pool.
    unsafe {
        let k = (layout.base as *mut u8).add(page * layout.page_bytes + row * row_bytes);
        std::ptr::write_bytes(k, 0xab, row_bytes);
    }
    seq.finish().unwrap();

    assert!(self::engine(4).kv_layout().unwrap().base.is_null(), "MemoryKind::None has no pool memory");

    // The raw call checks the caller's struct_size.
    // SAFETY: all-zero is a valid clm_kv_layout; the engine is live.
    let mut raw: sys::clm_kv_layout = unsafe { std::mem::zeroed() };
    let status = unsafe { sys::clm_engine_kv_layout(&mut raw, engine.as_raw()) };
    assert_eq!(status, sys::CLM_ERR_INVALID_ARGUMENT);
    assert!(raw.base.is_null(), "nothing is written for a bad struct_size");
}

#[test]
fn an_engine_shared_by_two_threads() {
    const PER_THREAD: usize = 200;
    let engine = Arc::new(engine(128)); // small: threads evict each other's prefixes
    let system_prompt = tokens(1, 32);
    let workers: Vec<_> = (0..2)
        .map(|t| {
            let engine = Arc::clone(&engine);
            let system_prompt = system_prompt.clone();
            thread::spawn(move || {
                let mut hits = 0usize;
                for i in 0..PER_THREAD {
                    let mut prompt = system_prompt.clone();
                    prompt.extend(tokens(100_000 * (t + 1) + 100 * i as i32, 5 + i % 40));
                    let mut seq = engine.admit(&prompt).unwrap();
                    hits += seq.cached_tokens();
                    assert_eq!(seq.slots().len(), prompt.len() - seq.cached_tokens());
                    seq.extend(&[7, 8, 9]).unwrap();
                    if i % 10 == 9 {
                        seq.abort().unwrap();
                    } else {
                        seq.finish().unwrap();
                    }
                }
                hits
            })
        })
        .collect();
    // Meanwhile, this thread reads the counters.
    for _ in 0..50 {
        let m = engine.metrics().unwrap();
        assert!(m.finished + m.aborted <= m.admitted);
    }
    let hits: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(hits > 0, "the shared system prompt was never reused");

    let m = engine.metrics().unwrap();
    assert_eq!(m.admitted, 2 * PER_THREAD as u64);
    assert_eq!(m.aborted, 2 * (PER_THREAD / 10) as u64);
    assert_eq!(m.finished, m.admitted - m.aborted);
    assert_eq!(m.active_sequences, 0);
    assert_eq!(m.rejected, 0);
    assert_eq!(m.pages_used as i64 * PAGE as i64, m.cached_tokens, "only the cache holds pages now");
}

#[test]
fn a_sequence_can_move_to_another_thread() {
    let engine = Arc::new(engine(64));
    let mut seq = engine.admit(&tokens(1, 40)).unwrap();
    let moved = thread::spawn(move || {
        assert_eq!(seq.extend(&[1, 2]).unwrap().len(), 2);
        seq.finish().unwrap();
        seq
    })
    .join()
    .unwrap();
    assert_eq!(moved.cached_tokens(), 0);
    assert_eq!(engine.metrics().unwrap().finished, 1);
}

#[test]
fn sequences_may_outlive_their_engine() {
    let engine = engine(64);
    let mut running = engine.admit(&tokens(1, 20)).unwrap();
    assert_eq!(running.slots().len(), 20);
    let mut finished = engine.admit(&tokens(100, 20)).unwrap();
    finished.finish().unwrap();
    drop(engine);

    // The handles stay valid to read and to drop; calls fail cleanly. The
    // pages went with the engine, so the sequence has none to show.
    assert!(running.slots().is_empty());
    assert!(running.page_table().is_empty());
    let err = running.extend(&[1]).unwrap_err();
    assert_eq!(err.code(), ErrorCode::FailedPrecondition);
    assert!(err.message().contains("engine was freed"), "{}", err);
    assert_eq!(running.finish().unwrap_err().code(), ErrorCode::FailedPrecondition);
    assert_eq!(finished.abort().unwrap_err().code(), ErrorCode::FailedPrecondition);
}

#[test]
fn many_engines_and_sequences_come_and_go() {
    // Run under valgrind (see README.md) to check Drop frees everything.
    for round in 0..20 {
        let engine = Engine::new(&EngineOptions { memory: MemoryKind::Host, head_dim: 16, ..options(32) }).unwrap();
        let mut keep = Vec::new();
        for i in 0..10 {
            let mut seq = engine.admit(&tokens(round * 1000 + i, 30)).unwrap();
            seq.extend(&[1, 2, 3]).unwrap();
            match i % 3 {
                0 => seq.finish().unwrap(),
                1 => keep.push(seq), // dropped after the engine
                _ => drop(seq),      // aborted by Drop
            }
        }
        if round % 2 == 0 {
            drop(engine);
            drop(keep);
        } else {
            drop(keep);
            assert_eq!(engine.metrics().unwrap().active_sequences, 0);
        }
    }
}

#[test]
fn device_memory_is_unsupported_without_cuda() {
    let opts = EngineOptions { memory: MemoryKind::Device, num_layers: 1, head_dim: 8, ..options(4) };
    match Engine::new(&opts) {
        Ok(engine) => assert_eq!(engine.kv_layout().unwrap().memory, MemoryKind::Device), // a CUDA build
        Err(err) => assert_eq!(err.code(), ErrorCode::Unsupported, "{}", err),
    }
}

#[test]
fn admit_options_are_checked() {
    let engine = engine(16);
    let err = engine.admit_with(&[1, 2, 3], &AdmitOptions { priority: 101, ..AdmitOptions::default() }).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.message().contains("priority"), "{}", err);
    let ok = AdmitOptions {
        priority: 100,
        adapter_id: 2,
        cache_salt: Some(b"t"),
        priority_update: PriorityUpdate::Set,
        tenant: Some("acme"),
    };
    engine.admit_with(&[1, 2, 3], &ok).unwrap().finish().unwrap();
    let raw = ok.to_raw().unwrap();
    assert_eq!(raw.priority_update, sys::CLM_PRIORITY_SET);
    // SAFETY: to_raw points tenant at ok's str for tenant_len bytes.
    assert_eq!(unsafe { std::slice::from_raw_parts(raw.tenant as *const u8, raw.tenant_len) }, b"acme");
    // An empty name is none: NULL, as the library's default.
    let unnamed = AdmitOptions { tenant: Some(""), ..ok }.to_raw().unwrap();
    assert_eq!((unnamed.tenant, unnamed.tenant_len), (std::ptr::null(), 0));
}

/// A conversation admitted at priority 1, then at 0: raised, its first turn
/// outlives a newer prompt; set, it drops to 0 and goes first (as
/// tests/capi/test_capi_engine.cpp's "priority_update" case, in pages of 16).
#[test]
fn priority_update_raise_keeps_the_highest_set_the_latest() {
    for update in [PriorityUpdate::Raise, PriorityUpdate::Set] {
        let engine = Engine::new(&EngineOptions { eviction_policy: EvictionPolicy::Priority, ..options(8) }).unwrap();
        let run = |prompt: &[i32], priority: i32| {
            let opts = AdmitOptions { priority, priority_update: update, ..AdmitOptions::default() };
            engine.admit_with(prompt, &opts).unwrap().finish().unwrap();
        };
        let cached = |prompt: &[i32]| {
            let mut probe = prompt.to_vec();
            probe.push(9999);
            engine.plan_admission(&probe, None).unwrap().cached_tokens
        };
        let first_turn = tokens(0, 2 * PAGE);
        let second_turn = [first_turn.clone(), tokens(500, 2 * PAGE)].concat();
        let (older, newer) = (tokens(1000, 2 * PAGE), tokens(2000, 2 * PAGE));
        run(&first_turn, 1);
        run(&older, 0);
        run(&second_turn, 0);
        run(&newer, 0);
        let mut probe = engine.admit(&tokens(3000, 6 * PAGE)).unwrap(); // evicts three 2-page leaves
        let set = update == PriorityUpdate::Set;
        assert_eq!(cached(&older), 0, "{:?}", update);
        assert_eq!(cached(&first_turn), if set { 0 } else { 2 * PAGE as i32 }, "{:?}", update);
        assert_eq!(cached(&newer), if set { 2 * PAGE as i32 } else { 0 }, "{:?}", update);
        probe.abort().unwrap();
    }
}

//! KV events through the real library: a host's sink gets every batch in
//! order, numbered without gaps, on one thread that is not the caller's; a
//! picture rebuilt from the batches alone (a set of hashes per medium, a
//! parent known before its child, a removed block present) equals
//! `Engine::kv_event_blocks` after a random workload with evictions, the host
//! tier, tenants and adapters; dropping the engine delivers what is queued,
//! and the sink is never called after. Then the ZeroMQ endpoints as bound,
//! the defaults, and options and calls that must be refused.
mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::thread::{self, ThreadId};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clmcache::{
    AdmitOptions, Engine, EngineOptions, ErrorCode, KvDtype, KvEventBatch, KvEventKind, KvEventSink, KvEventsBind,
    KvEventsLayout, KvMedium, MemoryKind,
};
use common::Rng;

const PAGE: i32 = 4;

fn fresh_seed() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

fn options() -> EngineOptions {
    let mut o = EngineOptions::new(48);
    o.page_size = PAGE;
    o.num_layers = 1;
    o.kv_heads = 1;
    o.head_dim = 4;
    o.kv_dtype = KvDtype::F32;
    o.memory = MemoryKind::Host;
    o.host_pages = 96;
    o.model_id = Some("rust-events-model".into());
    o.kv_events = true;
    o.kv_events_endpoint = Some("tcp://127.0.0.1:*".into());
    o.kv_events_batch_interval_ms = 2;
    o.kv_events_max_batch_events = 16;
    o
}

/// What the sink got: each batch, and the threads it came on. The sink only
/// keeps them; the checks run on the test's thread (a panic in a sink is
/// caught, and would show only as a poisoned lock).
#[derive(Default)]
struct Received {
    batches: Vec<KvEventBatch>,
    threads: HashSet<ThreadId>,
}

fn sink_into(received: &Arc<Mutex<Received>>) -> KvEventSink {
    let received = Arc::clone(received);
    KvEventSink::new(move |batch| {
        let mut r = received.lock().unwrap();
        r.batches.push(batch.clone());
        r.threads.insert(thread::current().id());
    })
}

/// The picture the batches alone give.
#[derive(Default)]
struct Picture {
    sequences: Vec<u64>,
    gpu: HashSet<u64>,
    cpu: HashSet<u64>,
    events: u64,
    extra_keys: HashSet<String>,
    lora_ids: HashSet<i32>,
    token_ids: bool,
}

impl Picture {
    fn of(received: &Arc<Mutex<Received>>, token_ids: bool) -> Picture {
        let mut p = Picture { token_ids, ..Picture::default() };
        for b in &received.lock().unwrap().batches {
            p.apply(b);
        }
        p
    }

    fn apply(&mut self, batch: &KvEventBatch) {
        self.sequences.push(batch.sequence);
        assert_eq!(batch.data_parallel_rank, 2);
        assert!(batch.ts > 1.7e9);
        for e in &batch.events {
            self.events += 1;
            let tier = if e.medium == KvMedium::Cpu { &mut self.cpu } else { &mut self.gpu };
            match e.kind {
                KvEventKind::AllBlocksCleared => {
                    self.gpu.clear();
                    self.cpu.clear();
                }
                KvEventKind::BlockStored => {
                    assert!(!e.block_hashes.is_empty());
                    assert_eq!(e.block_size, PAGE);
                    let ids = if self.token_ids { e.block_hashes.len() * PAGE as usize } else { 0 };
                    assert_eq!(e.token_ids.len(), ids);
                    if let Some(parent) = e.parent_block_hash {
                        assert!(tier.contains(&parent), "a child before its parent");
                    }
                    for h in &e.block_hashes {
                        assert!(tier.insert(*h), "block {:x} stored twice", h);
                    }
                    self.extra_keys.insert(e.extra_key.clone());
                    self.lora_ids.insert(e.lora_id);
                }
                KvEventKind::BlockRemoved => {
                    for h in &e.block_hashes {
                        assert!(tier.remove(h), "block {:x} removed but not there", h);
                    }
                }
                KvEventKind::Other(kind) => panic!("an event of unknown kind {}", kind),
            }
        }
    }
}

fn blocks(engine: &Engine, medium: KvMedium) -> HashSet<u64> {
    let list = engine.kv_event_blocks(medium).unwrap();
    let set: HashSet<u64> = list.iter().copied().collect();
    assert_eq!(set.len(), list.len(), "a page listed twice");
    set
}

/// Prompts over a few shared system prompts, three tenants and two
/// adapters, in a pool small enough to evict; some come back.
fn workload(engine: &Engine, rng: &mut Rng, requests: usize) {
    let systems: Vec<Vec<i32>> =
        (0..4).map(|_| (0..12 + rng.next_u64() % 12).map(|_| (rng.next_u64() % 30000) as i32).collect()).collect();
    let salts: [Option<&[u8]>; 3] = [None, Some(b"tenant-a"), Some(b"tenant-b")];
    let mut seen: Vec<Vec<i32>> = Vec::new();
    for r in 0..requests {
        let prompt = if !seen.is_empty() && rng.next_u64() % 4 == 0 {
            seen[(rng.next_u64() % seen.len() as u64) as usize].clone()
        } else {
            let mut p = systems[(rng.next_u64() % 4) as usize].clone();
            let extra = 4 + rng.next_u64() % 24;
            p.extend((0..extra).map(|_| (rng.next_u64() % 30000) as i32));
            seen.push(p.clone());
            p
        };
        let options = AdmitOptions {
            cache_salt: salts[prompt.len() % 3],
            adapter_id: if rng.next_u64() % 2 == 0 { 0 } else { 7 },
            ..AdmitOptions::default()
        };
        let mut seq = engine.admit_with(&prompt, &options).unwrap();
        seq.finish().unwrap();
        if r % 16 == 0 {
            engine.wait_for_tiers().unwrap();
        }
    }
    engine.wait_for_tiers().unwrap();
}

#[test]
fn a_sinks_batches_rebuild_the_engines_blocks_in_order_on_one_thread() {
    let seed = fresh_seed();
    let mut rng = Rng::new(seed);
    let received = Arc::new(Mutex::new(Received::default()));
    let mut o = options();
    o.kv_events_sink = Some(sink_into(&received));
    o.kv_events_data_parallel_rank = 2;
    let engine = Engine::new(&o).unwrap();
    workload(&engine, &mut rng, 300);
    engine.flush_kv_events(Duration::from_secs(10)).unwrap();

    let gpu = blocks(&engine, KvMedium::Gpu);
    let cpu = blocks(&engine, KvMedium::Cpu);
    let m = engine.metrics().unwrap();
    {
        let p = Picture::of(&received, true);
        assert!(!p.sequences.is_empty(), "seed {}", seed);
        assert_eq!(p.sequences, (0..p.sequences.len() as u64).collect::<Vec<_>>(), "seed {}", seed);
        let threads = &received.lock().unwrap().threads;
        assert_eq!(threads.len(), 1);
        assert!(!threads.contains(&thread::current().id()));
        assert_eq!(p.gpu, gpu, "seed {}", seed);
        assert_eq!(p.cpu, cpu, "seed {}", seed);
        assert!(!gpu.is_empty() && !cpu.is_empty());
        assert_eq!(p.extra_keys.len(), 3);
        assert!(p.extra_keys.iter().all(|k| k.is_empty() || (k.starts_with("salt:") && k.len() == 37)));
        assert_eq!(p.lora_ids, [0, 7].into_iter().collect());
        assert!(m.has_kv_events);
        assert_eq!(m.kv_events_published, p.events);
        assert_eq!(m.kv_events_published_batches, p.sequences.len() as u64);
        assert_eq!(m.kv_events_next_sequence, p.sequences.len() as u64);
        assert_eq!((m.kv_events_dropped, m.kv_events_queued), (0, 0));
        assert!(m.evictions > 0 && m.backed_up_pages > 0, "the run exercised evictions and the host tier");
    }
    // With a sink there is no socket.
    assert_eq!(engine.kv_events_endpoint().unwrap(), "");
}

#[test]
fn dropping_the_engine_delivers_what_is_queued_and_nothing_after() {
    let mut rng = Rng::new(fresh_seed());
    let received = Arc::new(Mutex::new(Received::default()));
    let mut o = options();
    o.kv_events_sink = Some(sink_into(&received));
    o.kv_events_data_parallel_rank = 2;
    // Batches only when asked: everything is still queued at the drop.
    o.kv_events_batch_interval_ms = 60000;
    o.kv_events_max_batch_events = 65536;
    let engine = Engine::new(&o).unwrap();
    workload(&engine, &mut rng, 100);
    let mut seq = engine.admit(&[1, 2, 3, 4, 5, 6, 7, 8, 9]).unwrap(); // keeps the engine's core alive
    assert!(engine.metrics().unwrap().kv_events_queued > 0);
    let (gpu, cpu) = (blocks(&engine, KvMedium::Gpu), blocks(&engine, KvMedium::Cpu));
    drop(engine);
    let p = Picture::of(&received, true);
    assert_eq!((p.gpu, p.cpu), (gpu, cpu));
    assert!(seq.finish().is_err(), "the engine is gone");
    drop(seq);
    thread::sleep(Duration::from_millis(50));
    assert_eq!(Picture::of(&received, true).events, p.events, "the sink was called after the engine was dropped");
}

#[test]
fn token_ids_left_out_sockets_as_bound_and_the_defaults() {
    let mut rng = Rng::new(fresh_seed());
    let received = Arc::new(Mutex::new(Received::default()));
    let mut o = options();
    o.kv_events_sink = Some(sink_into(&received));
    o.kv_events_data_parallel_rank = 2;
    o.kv_events_token_ids = false;
    let engine = Engine::new(&o).unwrap();
    workload(&engine, &mut rng, 100);
    engine.flush_kv_events(Duration::from_secs(10)).unwrap();
    let p = Picture::of(&received, false);
    assert_eq!((&p.gpu, &p.cpu), (&blocks(&engine, KvMedium::Gpu), &blocks(&engine, KvMedium::Cpu)));
    assert!(p.events > 1);

    let mut o = options();
    o.kv_events_replay_endpoint = Some("tcp://127.0.0.1:*".into());
    o.kv_events_topic = Some("kv@pod-1@rust-events-model".into());
    o.kv_events_layout = KvEventsLayout::Map;
    let engine = Engine::new(&o).unwrap();
    let publish = engine.kv_events_endpoint().unwrap();
    let replay = engine.kv_events_replay_endpoint().unwrap();
    assert!(publish.starts_with("tcp://127.0.0.1:") && publish != "tcp://127.0.0.1:*", "{}", publish);
    assert!(replay.starts_with("tcp://127.0.0.1:") && replay != publish, "{}", replay);
    workload(&engine, &mut rng, 30);
    engine.flush_kv_events(Duration::from_secs(10)).unwrap();
    let m = engine.metrics().unwrap();
    assert!(m.kv_events_published_batches > 0);
    assert_eq!(m.kv_events_send_failures, 0);

    let d = EngineOptions::default();
    assert!(!d.kv_events && d.kv_events_token_ids);
    assert_eq!((d.kv_events_bind, d.kv_events_layout), (KvEventsBind::Auto, KvEventsLayout::Array));
    assert_eq!((d.kv_events_endpoint.as_deref(), d.kv_events_sink.is_none()), (None, true));
    assert_eq!((d.kv_events_batch_interval_ms, d.kv_events_max_batch_events), (10, 1024));
    assert_eq!((d.kv_events_queue_events, d.kv_events_buffer_batches, d.kv_events_send_hwm), (131072, 10000, 100000));
}

#[test]
fn options_and_calls_that_cannot_work_are_refused() {
    let refused = |o: EngineOptions| {
        let err = Engine::new(&o).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{}", err);
    };
    refused(EngineOptions { model_id: None, ..options() });
    refused(EngineOptions { kv_events_topic: Some("t".repeat(300)), ..options() });
    refused(EngineOptions { kv_events_endpoint: Some("tcp://127.0.0.1:1\0".into()), ..options() });
    refused(EngineOptions {
        kv_events_sink: Some(KvEventSink::new(|_| {})),
        kv_events_replay_endpoint: Some("tcp://127.0.0.1:*".into()),
        ..options()
    });
    let plain = Engine::new(&EngineOptions { kv_events: false, ..options() }).unwrap();
    for err in [
        plain.flush_kv_events(Duration::from_millis(10)).unwrap_err(),
        plain.kv_event_blocks(KvMedium::Gpu).unwrap_err(),
        plain.kv_events_endpoint().unwrap_err(),
    ] {
        assert_eq!(err.code(), ErrorCode::FailedPrecondition, "{}", err);
    }
    assert!(!plain.metrics().unwrap().has_kv_events);
}

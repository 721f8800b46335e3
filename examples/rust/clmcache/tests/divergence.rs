//! Divergence hot spots through the real library (docs/observability.md),
//! on fresh random prompts each run (the seed is in every message):
//! - a timestamp planted at a random depth of one named tenant's system
//!   prompt is the report's first point, within a page of that depth, with
//!   no hits, as many splits as requests after the first, and the tokens
//!   either side as the requests and the cached path had them; another
//!   tenant's conversations make one ordinary point whose branches and hits
//!   are worked out here exactly;
//! - the match-depth histogram equals one built here from each admission's
//!   cached tokens, and the diverged lookups are the splits;
//! - a tenant admitted without a name is "salt:" and the first 32 hex digits
//!   of its salt's SHA-256 (computed here), never its salt; a report for an
//!   unknown tenant is empty;
//! - switched off, the report is `FailedPrecondition` and the counters stay
//!   0; the options' defaults and bounds.
mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use clmcache::{
    AdmitOptions, BranchPoint, Engine, EngineOptions, ErrorCode, MemoryKind, Metrics, Sequence, MATCH_DEPTH_BOUNDS,
};
use common::{hex, sha256, Rng};

const PAGE: usize = 16;

fn fresh_seed() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

fn options() -> EngineOptions {
    EngineOptions { page_size: PAGE as i32, memory: MemoryKind::None, ..EngineOptions::new(4096) }
}

fn below(rng: &mut Rng, n: usize) -> usize {
    (rng.next_u64() % n as u64) as usize
}

/// The bucket of `match_depth_counts` a lookup that matched `depth` tokens
/// falls in, from clm.h's words: upper bounds 0, 16, 32, ..., 2^20 (buckets
/// 0..17), then above (18).
fn depth_bucket(depth: usize) -> usize {
    let mut bound = 0usize;
    for bucket in 0..18 {
        if depth <= bound {
            return bucket;
        }
        bound = if bound == 0 { 16 } else { 2 * bound };
    }
    18
}

/// What the engine's match-depth counters must say: a histogram of the
/// cached tokens of each admission (no host tier: a lookup's match is its
/// cached prefix).
#[derive(Default)]
struct Depths {
    counts: [u64; 19],
    sum: u64,
}

impl Depths {
    /// One request that runs to its end: admit, one decoded token, finish.
    fn request(&mut self, engine: &Engine, prompt: &[i32], options: &AdmitOptions<'_>) {
        let mut seq: Sequence = engine.admit_with(prompt, options).unwrap();
        let cached = seq.cached_tokens();
        self.counts[depth_bucket(cached)] += 1;
        self.sum += cached as u64;
        seq.extend(&[7]).unwrap();
        seq.finish().unwrap();
    }

    fn check(&self, m: &Metrics, seed: u64) {
        assert_eq!(m.match_depth_counts, self.counts, "seed {}", seed);
        assert_eq!(m.match_depth_sum_tokens, self.sum, "seed {}", seed);
    }
}

/// Whether some prompt has `before` just before token `depth` and `after`
/// from it.
fn some_prompt_has(prompts: &[Vec<i32>], depth: usize, before: &[i32], after: &[i32]) -> bool {
    prompts.iter().any(|p| {
        depth >= before.len()
            && p.len() >= depth + after.len()
            && &p[depth - before.len()..depth] == before
            && &p[depth..depth + after.len()] == after
    })
}

#[test]
fn a_timestamp_in_a_system_prompt_is_the_first_point_and_a_chat_is_ordinary() {
    let seed = fresh_seed();
    let mut rng = Rng::new(seed);
    let context = PAGE + below(&mut rng, PAGE + 1); // >= a page: the split's difference is in `after`
    let window_ms = 600_000 + below(&mut rng, 7_200_000) as i32;
    let engine = Engine::new(&EngineOptions {
        divergence_context_tokens: context as i32,
        divergence_window_ms: window_ms,
        ..options()
    })
    .unwrap();
    let planted = 64 + below(&mut rng, 237); // [64, 300]
    let system: Vec<i32> = (0..400).map(|_| 100 + below(&mut rng, 49_900) as i32).collect();
    let mut depths = Depths::default();

    // acme: every request carries the time (a second a request, two digit
    // tokens) at token `planted`, then a question of its own.
    let acme = AdmitOptions { tenant: Some("acme"), ..AdmitOptions::salted(b"secret-salt-acme") };
    let mut acme_prompts: Vec<Vec<i32>> = Vec::new();
    // globex: conversations under one system prompt, each growing turn by
    // turn (a turn's prompt is the last one, its decoded token, and more).
    let globex = AdmitOptions { tenant: Some("globex"), adapter_id: 5, ..AdmitOptions::salted(b"secret-salt-globex") };
    let globex_system = 48 + below(&mut rng, 150);
    let conversations = 2 + below(&mut rng, 3);
    let mut chats: Vec<Vec<i32>> = (0..conversations).map(|_| system[..globex_system].to_vec()).collect();
    let mut first_turns: Vec<Vec<i32>> = Vec::new();
    let turns = 60 / conversations;
    for i in 0..60 {
        let mut prompt = system.clone();
        prompt[planted] = (i / 10) as i32;
        prompt[planted + 1] = (i % 10) as i32;
        prompt.extend((0..20).map(|k| 60_000 + 20 * i as i32 + k));
        depths.request(&engine, &prompt, &acme);
        acme_prompts.push(prompt);
        if i < turns {
            for (c, chat) in chats.iter_mut().enumerate() {
                if i > 0 {
                    chat.push(7);
                }
                let words = if i == 0 { 64 } else { 1 + below(&mut rng, 30) };
                chat.extend((0..words).map(|_| 100_000 * (c as i32 + 1) + below(&mut rng, 50_000) as i32));
                depths.request(&engine, chat, &globex);
                if i == 0 {
                    first_turns.push(chat.clone());
                }
            }
        }
    }
    let admissions = 60 + conversations * turns;
    let why = format!("seed {}, timestamp at {}, context {}", seed, planted, context);

    let report = engine.divergence_report(3, 2, None).unwrap();
    assert_eq!(report.window_ms, window_ms as i64, "{}", why);
    let top = report.points.first().unwrap_or_else(|| panic!("an empty report; {}", why));
    assert_eq!(top.tenant, "acme", "{}: {:?}", why, report.points);
    assert!((top.depth - planted as i32).abs() <= PAGE as i32 && top.depth % PAGE as i32 == 0, "{}: {:?}", why, top);
    assert!(top.branches >= 50, "{}: {:?}", why, top);
    assert_eq!((top.hits, top.overcount, top.adapter_id), (0, 0, 0), "{}: {:?}", why, top);
    assert_eq!(top.unreused(), top.branches);
    let depth = top.depth as usize;
    assert_eq!((top.before.len(), top.after.len(), top.cached_after.len()), (context, context, context), "{}", why);
    assert!(some_prompt_has(&acme_prompts[1..], depth, &top.before, &top.after), "{}: {:?}", why, top);
    assert!(some_prompt_has(&acme_prompts, depth, &top.before, &top.cached_after), "{}: {:?}", why, top);
    assert_ne!(top.after, top.cached_after, "{}", why);
    for p in &report.points {
        assert!(p.tenant == "acme" || p.tenant == "globex", "{}: {:?}", why, p);
        assert!(!p.tenant.contains("secret"), "{}", why);
    }
    // Every acme request after the first split off, at one point or two
    // (when the time's two digits straddle a page).
    let all_acme = engine.divergence_report(10, 1, Some("acme")).unwrap();
    assert!(all_acme.points.iter().all(|p| p.tenant == "acme"), "{}", why);
    assert_eq!(all_acme.points.iter().map(|p| p.branches).sum::<u64>(), 59, "{}: {:?}", why, all_acme.points);
    assert_eq!(all_acme.points[0], *top, "{}", why);

    // globex: one point, where its conversations part at the end of the
    // system prompt: split off by every conversation but the first, passed
    // by every later turn.
    let chat_point = globex_system / PAGE * PAGE;
    let want = BranchPoint {
        tenant: "globex".into(),
        adapter_id: 5,
        depth: chat_point as i32,
        branches: conversations as u64 - 1,
        hits: (conversations * (turns - 1)) as u64,
        overcount: 0,
        before: first_turns[1][chat_point - context..chat_point].to_vec(),
        after: first_turns[1][chat_point..chat_point + context].to_vec(),
        cached_after: first_turns[0][chat_point..chat_point + context].to_vec(),
    };
    let globex_points = engine.divergence_report(5, 1, Some("globex")).unwrap().points;
    assert_eq!(globex_points, vec![want.clone()], "{}, {} conversations", why, conversations);
    let second = report.points.iter().position(|p| p.tenant == "globex");
    assert_eq!(second.map(|i| &report.points[i]), if want.branches >= 2 { Some(&want) } else { None }, "{}", why);

    let m = engine.metrics().unwrap();
    assert_eq!(m.match_depth_counts.iter().sum::<u64>(), admissions as u64, "{}", why);
    depths.check(&m, seed);
    assert_eq!(m.diverged_lookups, 59 + conversations as u64 - 1, "{}", why);
    assert_eq!(m.admitted, admissions as u64);
    assert_eq!(
        MATCH_DEPTH_BOUNDS.iter().map(|&b| depth_bucket(b as usize)).collect::<Vec<_>>(),
        (0..18).collect::<Vec<_>>()
    );
    assert_eq!(depth_bucket((1 << 20) + 1), 18);

    // Nobody by that name; never by a salt.
    for unknown in ["nobody", "secret-salt-acme", "ACME"] {
        assert_eq!(engine.divergence_report(5, 1, Some(unknown)).unwrap().points, vec![], "{}", unknown);
    }
}

#[test]
fn sha256_of_known_texts() {
    assert_eq!(hex(&sha256(b"")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    assert_eq!(hex(&sha256(b"abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    assert_eq!(
        hex(&sha256(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
    );
}

#[test]
fn a_tenant_without_a_name_is_its_salts_digest_never_its_salt() {
    let seed = fresh_seed();
    let mut rng = Rng::new(seed);
    let engine = Engine::new(&options()).unwrap();
    let salt = format!("salt-{:016x}", rng.next_u64());
    let digest = format!("salt:{}", &hex(&sha256(salt.as_bytes()))[..32]);
    let shared: Vec<i32> = (0..2 * PAGE).map(|_| below(&mut rng, 50_000) as i32).collect();
    let splits = 3 + below(&mut rng, 5);
    // Each request shares two pages with the first, then goes its own way:
    // every one after the first splits off at token 32.
    let mut depths = Depths::default();
    for (options, offset) in [(AdmitOptions::salted(salt.as_bytes()), 0), (AdmitOptions::default(), 1_000_000)] {
        for r in 0..=splits {
            let mut prompt = shared.clone();
            prompt.extend((0..PAGE + 5).map(|k| offset + 1000 * (r as i32 + 1) + k as i32));
            depths.request(&engine, &prompt, &options);
        }
    }
    let why = format!("seed {}, salt {}", seed, salt);
    let report = engine.divergence_report(5, 1, None).unwrap();
    let mut names: Vec<&str> = report.points.iter().map(|p| p.tenant.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, vec!["", digest.as_str()], "{}", why);
    for p in &report.points {
        assert!(!p.tenant.contains(&salt), "{}", why);
        assert_eq!((p.depth as usize, p.branches, p.hits), (2 * PAGE, splits as u64, 0), "{}: {:?}", why, p);
        assert_eq!(p.before, shared[2 * PAGE - 8..].to_vec(), "{}", why);
    }
    let only = engine.divergence_report(5, 1, Some(&digest)).unwrap();
    assert_eq!(only.points.len(), 1, "{}", why);
    assert_eq!(only.points[0].tenant, digest);
    for unknown in [salt.as_str(), "salt:00000000000000000000000000000000", "nobody"] {
        assert!(engine.divergence_report(5, 1, Some(unknown)).unwrap().points.is_empty(), "{}: {}", why, unknown);
    }
    // min_branches above every count leaves nothing.
    assert!(engine.divergence_report(5, splits as u64 + 1, None).unwrap().points.is_empty(), "{}", why);
    let m = engine.metrics().unwrap();
    depths.check(&m, seed);
    assert_eq!(m.diverged_lookups, 2 * splits as u64, "{}", why);
}

#[test]
fn switched_off_the_report_is_a_failed_precondition_and_the_counters_stay_zero() {
    let engine = Engine::new(&EngineOptions { divergence: false, ..options() }).unwrap();
    let prompt: Vec<i32> = (1..=40).collect();
    for r in 0..3 {
        let mut p = prompt.clone();
        p[20] = 1000 + r;
        engine.admit(&p).unwrap().finish().unwrap();
    }
    let err = engine.divergence_report(3, 1, None).unwrap_err();
    assert_eq!(err.code(), ErrorCode::FailedPrecondition, "{}", err);
    assert!(!err.message().is_empty());
    let m = engine.metrics().unwrap();
    assert_eq!((m.diverged_lookups, m.match_depth_counts, m.match_depth_sum_tokens), (0, [0; 19], 0));
    assert_eq!(m.admitted, 3);

    // On, the same traffic is counted.
    let engine = Engine::new(&options()).unwrap();
    for r in 0..3 {
        let mut p = prompt.clone();
        p[20] = 1000 + r;
        engine.admit(&p).unwrap().finish().unwrap();
    }
    let m = engine.metrics().unwrap();
    assert_eq!((m.diverged_lookups, m.match_depth_counts.iter().sum::<u64>()), (2, 3));
    assert_eq!(engine.divergence_report(3, 1, None).unwrap().points.len(), 1);
}

#[test]
fn defaults_bounds_and_bad_input() {
    let d = EngineOptions::default();
    assert!(d.divergence);
    assert_eq!((d.divergence_branch_points, d.divergence_window_ms, d.divergence_context_tokens), (256, 3600000, 8));
    assert_eq!(AdmitOptions::default().tenant, None);
    for (bad, field) in [
        (EngineOptions { divergence_branch_points: 15, ..options() }, "branch_points"),
        (EngineOptions { divergence_branch_points: 65537, ..options() }, "branch_points"),
        (EngineOptions { divergence_window_ms: 1, ..options() }, "window_ms"),
        (EngineOptions { divergence_context_tokens: -1, ..options() }, "context_tokens"),
        (EngineOptions { divergence_context_tokens: 65, ..options() }, "context_tokens"),
    ] {
        let err = Engine::new(&bad).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{}", err);
        assert!(err.message().contains(field), "{}", err);
    }
    let engine = Engine::new(&options()).unwrap();
    assert!(engine.divergence_report(1, 0, None).unwrap().points.is_empty());
    assert_eq!(engine.divergence_report(0, 1, None).unwrap_err().code(), ErrorCode::InvalidArgument);
    assert_eq!(engine.divergence_report(-1, 1, Some("x")).unwrap_err().code(), ErrorCode::InvalidArgument);
    let long = "t".repeat((1 << 16) + 1);
    assert_eq!(engine.divergence_report(1, 1, Some(&long)).unwrap_err().code(), ErrorCode::InvalidArgument);
    // A name is carried whole, bytes and all; an empty one is none.
    let named = AdmitOptions { tenant: Some("tenant ü/7"), ..AdmitOptions::default() };
    let prompt: Vec<i32> = (1..=40).collect();
    engine.admit_with(&prompt, &named).unwrap().finish().unwrap();
    let mut other = prompt.clone();
    other[20] = 999;
    engine.admit_with(&other, &named).unwrap().finish().unwrap();
    let report = engine.divergence_report(1, 1, Some("tenant ü/7")).unwrap();
    assert_eq!(report.points.len(), 1);
    assert_eq!(report.points[0].depth, 16);
}

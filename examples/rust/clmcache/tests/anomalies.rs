//! CLM anomalies through the real library (docs/observability.md), on fresh
//! random workloads each run (the seed is in every message):
//! - sequences scored by a constant SRC head (w1 and w2 zero: the score is
//!   sigmoid(b2) whatever the rows) look keys up one to three times each,
//!   several sequences to a lookup; a naive model here keeps every sighting
//!   and takes exact lower medians: the low-SRC keys (at least
//!   min_sightings, median below low_src; a key seen too few times or
//!   scored high is not), their sightings (once per sequence and key), their
//!   medians within 0.0125, each key's turn to low-SRC as an event in order,
//!   tenants as admitted and an unnamed one as "salt:" and 32 hex digits of
//!   its salt's SHA-256 (computed here), never a salt;
//! - the store's events after them, in order: a first and a distant second
//!   version, an administrator's blacklist with its reason and end, the
//!   unblacklist;
//! - every JSON line the sink got parses (a small parser here), has the
//!   fields clm.h's example shows for its kind with the event's values, and
//!   equals the report's line for the same event; the metrics agree;
//! - a sink that panics does not take the process down; max_events and
//!   max_keys bound what is kept; off or without a store the report is
//!   `FailedPrecondition`; options out of range are refused at creation.
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::mem::size_of;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use clmcache::{
    sys, Activations, AdmitOptions, ClmAnomalyReport, ClmEvent, ClmEventKind, ClmWatchSink, Engine, EngineOptions,
    ErrorCode, Gelu, MemoryKind, RecordResult, Sequence, SrcHeadWeights, Suffix,
};
use common::{hex, sha256, Rng};

const DIM: usize = 8;
const HIDDEN: usize = 8;
const GROUP: &str = "g";
/// clm.h: "scores go into bins of 0.025: the median is known to 0.0125"
/// (and the scores themselves are f32 sigmoids).
const MEDIAN_TOLERANCE: f32 = 0.0125 + 1e-6;

fn fresh_seed() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

fn below(rng: &mut Rng, n: usize) -> usize {
    (rng.next_u64() % n as u64) as usize
}

/// Uniform in [lo, hi].
fn between(rng: &mut Rng, lo: f32, hi: f32) -> f32 {
    lo + (hi - lo) * (below(rng, 1 << 20) as f32 / (1 << 20) as f32)
}

fn options() -> EngineOptions {
    EngineOptions {
        page_size: 4,
        memory: MemoryKind::None,
        snapshot_store_path: Some(":memory:".into()),
        snapshot_store_shards: 2,
        snapshot_dim: DIM as i32,
        snapshot_min_usage: 1,
        snapshot_lookup_timeout_us: 2_000_000, // no busy misses on a loaded machine
        src_threshold: 0.0,                    // every step says "look up"
        ..EngineOptions::new(4096)
    }
}

/// A sink that keeps every line, in order.
fn collecting_sink() -> (ClmWatchSink, Arc<Mutex<Vec<String>>>) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&lines);
    (ClmWatchSink::new(move |line| kept.lock().unwrap().push(line.to_string())), lines)
}

/// Scores `seq` `score` with a one-row SRC step of a head whose score is
/// sigmoid(b2) whatever the rows (w1 and w2 zero, b2 = logit(score));
/// returns the score the engine keeps for it.
fn score(engine: &Engine, seq: &Sequence, score: f32) -> f32 {
    let (w1, b1, w2) = (vec![0.0f32; HIDDEN / 4 * HIDDEN], vec![0.0f32; HIDDEN / 4], vec![0.0f32; HIDDEN / 4]);
    let b2 = (score / (1.0 - score)).ln();
    let head = SrcHeadWeights { hidden: HIDDEN as i32, w1: &w1, b1: &b1, w2: &w2, b2 };
    engine.set_src_head(&head, Gelu::Tanh).unwrap();
    let rows = [0.5f32; HIDDEN];
    let d = engine.src_step(&[seq], Activations::F32(&rows), HIDDEN as i32, &[42], &[0, 1]).unwrap();
    assert!(d[0].scored && !d[0].baseline, "{:?}", d[0]);
    assert!((d[0].score - score).abs() < 1e-5, "head of {} scored {}", score, d[0].score);
    d[0].score
}

/// "salt:" and the first 32 hex digits of the salt's SHA-256.
fn digest(salt: &str) -> String {
    format!("salt:{}", &hex(&sha256(salt.as_bytes()))[..32])
}

// ---- a JSON line, parsed here ------------------------------------------------

/// A JSON value of a flat object: a string, or any other scalar as its text.
#[derive(Clone, Debug, PartialEq)]
enum Value {
    Str(String),
    Scalar(String),
}

/// Parses one JSON object of scalar values (what a CLM line is); an error
/// for anything else, trailing bytes and repeated names included.
fn parse_object(line: &str) -> Result<BTreeMap<String, Value>, String> {
    let b = line.as_bytes();
    let mut i = 0usize;
    let ws = |i: &mut usize| {
        while *i < b.len() && matches!(b[*i], b' ' | b'\t' | b'\n' | b'\r') {
            *i += 1;
        }
    };
    let string = |i: &mut usize| -> Result<String, String> {
        if b.get(*i) != Some(&b'"') {
            return Err(format!("a string expected at {}", i));
        }
        *i += 1;
        let mut out: Vec<u8> = Vec::new();
        loop {
            match b.get(*i).copied() {
                None => return Err("an unterminated string".into()),
                Some(b'"') => {
                    *i += 1;
                    return String::from_utf8(out).map_err(|_| "a string that is not UTF-8".to_string());
                }
                Some(b'\\') => {
                    let escaped = b.get(*i + 1).copied().ok_or("a lone backslash")?;
                    *i += 2;
                    match escaped {
                        b'"' | b'\\' | b'/' => out.push(escaped),
                        b'b' => out.push(8),
                        b'f' => out.push(12),
                        b'n' => out.push(b'\n'),
                        b'r' => out.push(b'\r'),
                        b't' => out.push(b'\t'),
                        b'u' => {
                            let digits = line.get(*i..*i + 4).ok_or("a short \\u escape")?;
                            let code = u32::from_str_radix(digits, 16).map_err(|_| "a bad \\u escape")?;
                            let c = char::from_u32(code).ok_or("a \\u escape of a surrogate")?;
                            out.extend_from_slice(c.to_string().as_bytes());
                            *i += 4;
                        }
                        other => return Err(format!("a bad escape \\{}", other as char)),
                    }
                }
                Some(c) if c < 0x20 => return Err("a control character in a string".into()),
                Some(c) => {
                    out.push(c);
                    *i += 1;
                }
            }
        }
    };
    let mut fields = BTreeMap::new();
    ws(&mut i);
    if b.get(i) != Some(&b'{') {
        return Err("not an object".into());
    }
    i += 1;
    ws(&mut i);
    if b.get(i) == Some(&b'}') {
        i += 1;
    } else {
        loop {
            ws(&mut i);
            let name = string(&mut i)?;
            ws(&mut i);
            if b.get(i) != Some(&b':') {
                return Err(format!("':' expected at {}", i));
            }
            i += 1;
            ws(&mut i);
            let value = if b.get(i) == Some(&b'"') {
                Value::Str(string(&mut i)?)
            } else {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || matches!(b[i], b'-' | b'+' | b'.')) {
                    i += 1;
                }
                let text = &line[start..i];
                let scalar = matches!(text, "true" | "false" | "null") || text.parse::<f64>().is_ok();
                if !scalar || text.starts_with('+') || text.starts_with('.') {
                    return Err(format!("a bad value {:?} at {}", text, start));
                }
                Value::Scalar(text.to_string())
            };
            if fields.insert(name.clone(), value).is_some() {
                return Err(format!("{:?} twice", name));
            }
            ws(&mut i);
            match b.get(i) {
                Some(b',') => i += 1,
                Some(b'}') => {
                    i += 1;
                    break;
                }
                _ => return Err(format!("',' or '}}' expected at {}", i)),
            }
        }
    }
    ws(&mut i);
    if i != b.len() {
        return Err(format!("bytes after the object at {}", i));
    }
    Ok(fields)
}

#[test]
fn the_json_parser_parses_json_and_refuses_the_rest() {
    let o = parse_object(r#" {"a":"x\"y\\z\u00fc","b":-12,"c":0.0625,"d":true} "#).unwrap();
    assert_eq!(o["a"], Value::Str("x\"y\\zü".into()));
    assert_eq!((o["b"].clone(), o["c"].clone()), (Value::Scalar("-12".into()), Value::Scalar("0.0625".into())));
    assert_eq!(parse_object("{}").unwrap().len(), 0);
    for bad in [r#"{"a":1,"a":2}"#, r#"{"a":1}x"#, r#"{"a":}"#, r#"{"a" 1}"#, r#"{"a":"b}"#, r#"{"a":1,}"#, "[1]"] {
        assert!(parse_object(bad).is_err(), "{}", bad);
    }
}

fn int(fields: &BTreeMap<String, Value>, name: &str) -> i64 {
    match fields.get(name) {
        Some(Value::Scalar(text)) => text.parse().unwrap_or_else(|_| panic!("{}: {:?} is not an integer", name, text)),
        other => panic!("{}: {:?}", name, other),
    }
}

fn text<'a>(fields: &'a BTreeMap<String, Value>, name: &str) -> &'a str {
    match fields.get(name) {
        Some(Value::Str(s)) => s,
        other => panic!("{}: {:?}", name, other),
    }
}

/// The line parses, names the fields clm.h's and docs/observability.md's
/// examples show for its kind, no others, and says what the event says.
fn check_line(line: &str, e: &ClmEvent) {
    let f = parse_object(line).unwrap_or_else(|why| panic!("{}: {}", why, line));
    let (name, extra): (&str, &[&str]) = match e.kind {
        ClmEventKind::Blacklisted => ("blacklisted", &["reason", "until_ms", "by"]),
        ClmEventKind::Unblacklisted => ("unblacklisted", &[]),
        ClmEventKind::VersionCreated => ("version_created", &["version"]),
        ClmEventKind::Drift => ("drift", &["version"]),
        ClmEventKind::LowSrc => ("low_src", &["sightings", "median_src"]),
        ClmEventKind::Other(kind) => panic!("an event of unknown kind {}: {}", kind, line),
    };
    let mut want: BTreeSet<&str> = ["time_ms", "event", "tenant", "adapter_id", "key"].into_iter().collect();
    want.extend(extra.iter().copied());
    assert_eq!(f.keys().map(String::as_str).collect::<BTreeSet<_>>(), want, "{}", line);
    assert_eq!(text(&f, "event"), name, "{}", line);
    assert_eq!(int(&f, "time_ms"), e.time_ms, "{}", line);
    assert_eq!((text(&f, "tenant"), text(&f, "key")), (e.tenant.as_str(), e.key.as_str()), "{}", line);
    assert_eq!(int(&f, "adapter_id"), e.adapter_id as i64, "{}", line);
    match e.kind {
        ClmEventKind::Blacklisted => {
            assert_eq!(text(&f, "reason"), e.reason, "{}", line);
            assert_eq!(int(&f, "until_ms"), e.until_ms, "{}", line);
            assert_eq!(text(&f, "by"), if e.by_breaker { "breaker" } else { "administrator" }, "{}", line);
        }
        ClmEventKind::VersionCreated | ClmEventKind::Drift => assert_eq!(int(&f, "version"), e.version as i64),
        ClmEventKind::LowSrc => {
            assert_eq!(int(&f, "sightings"), e.sightings as i64, "{}", line);
            let median = match &f["median_src"] {
                Value::Scalar(t) => t.parse::<f32>().unwrap_or_else(|_| panic!("median_src {:?}", t)),
                other => panic!("median_src {:?}", other),
            };
            assert_eq!(median, e.median_src, "{}", line);
        }
        _ => {}
    }
}

// ---- the naive model ------------------------------------------------------------

/// Every sighting of every key, with exact medians.
struct Model {
    min_sightings: usize,
    low_src: f32,
    /// (tenant, adapter, key) -> its scores, in order.
    keys: BTreeMap<(String, i32, String), Vec<f32>>,
    /// Low-SRC as of its last sighting.
    flagged: BTreeMap<(String, i32, String), bool>,
    /// Each turn to low-SRC: the key, its sightings and its median then.
    turns: Vec<((String, i32, String), u64, f32)>,
}

/// The lower median (clm_watch.hpp: the bin "holding the lower median").
fn lower_median(scores: &[f32]) -> f32 {
    let mut sorted = scores.to_vec();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
    sorted[(sorted.len() + 1) / 2 - 1]
}

impl Model {
    fn low(&self, scores: &[f32]) -> bool {
        scores.len() >= self.min_sightings && lower_median(scores) < self.low_src
    }

    fn sighting(&mut self, key: &(String, i32, String), score: f32) {
        let scores = self.keys.entry(key.clone()).or_default();
        scores.push(score);
        let scores = scores.clone();
        let low = self.low(&scores);
        let was = self.flagged.insert(key.clone(), low).unwrap_or(false);
        if low && !was {
            self.turns.push((key.clone(), scores.len() as u64, lower_median(&scores)));
        }
    }

    /// The low-SRC keys now: (key, sightings, exact median).
    fn low_keys(&self) -> BTreeMap<(String, i32, String), (u64, f32)> {
        self.keys
            .iter()
            .filter(|(_, scores)| self.low(scores))
            .map(|(k, scores)| (k.clone(), (scores.len() as u64, lower_median(scores))))
            .collect()
    }
}

/// One planned sequence: its tenant, key and score, and how many times it
/// looks the key up.
struct Planned {
    tenant: usize,
    key: &'static str,
    score: f32,
    times: usize,
}

#[test]
fn low_src_keys_events_and_lines_against_a_naive_model() {
    let seed = fresh_seed();
    let mut rng = Rng::new(seed);
    let min_sightings = 4 + below(&mut rng, 7); // 4..10
    let low_src = 0.15 + 0.01 * below(&mut rng, 40) as f32; // [0.15, 0.54]
    let window_ms = 600_000 + below(&mut rng, 3_000_000) as i64;
    let why = format!("seed {}, min_sightings {}, low_src {}", seed, min_sightings, low_src);
    let (sink, lines) = collecting_sink();
    let engine = Engine::new(&EngineOptions {
        clm_watch_min_sightings: min_sightings as i64,
        clm_watch_low_src: low_src,
        clm_watch_window_ms: window_ms,
        clm_watch_sink: Some(sink),
        ..options()
    })
    .unwrap();
    let started = now_ms();

    // Tenants: two named (one with an adapter), one unnamed; every salt is secret.
    let acme_salt = format!("secret-salt-acme-{:x}", rng.next_u64());
    let globex_salt = format!("secret-salt-globex-{:x}", rng.next_u64());
    let unnamed_salt = format!("secret-salt-unnamed-{:x}", rng.next_u64());
    let tenants = [
        (AdmitOptions { tenant: Some("acme"), ..AdmitOptions::salted(acme_salt.as_bytes()) }, "acme".to_string()),
        (
            AdmitOptions { tenant: Some("globex"), adapter_id: 3, ..AdmitOptions::salted(globex_salt.as_bytes()) },
            "globex".to_string(),
        ),
        (AdmitOptions::salted(unnamed_salt.as_bytes()), digest(&unnamed_salt)),
    ];

    // Scores from two clusters 0.04 away from low_src either side, so that a
    // median known to 0.0125 is on the same side of it as the exact one.
    let (low_lo, low_hi, high_lo, high_hi) = (0.01, low_src - 0.04, low_src + 0.04, 0.94);
    let mut plan: Vec<Planned> = Vec::new();
    let mut add = |rng: &mut Rng, tenant: usize, key: &'static str, n: usize, lows: usize| {
        let mut scores: Vec<f32> = (0..n)
            .map(|i| if i < lows { between(rng, low_lo, low_hi) } else { between(rng, high_lo, high_hi) })
            .collect();
        for i in (1..n).rev() {
            scores.swap(i, below(rng, i + 1));
        }
        for s in scores {
            plan.push(Planned { tenant, key, score: s, times: 1 + below(rng, 3) });
        }
    };
    // A lower median is low when at least (n + 1) / 2 scores are.
    let mostly_low = |rng: &mut Rng, n: usize| (n + 1) / 2 + below(rng, n - (n + 1) / 2 + 1);
    let n = min_sightings + below(&mut rng, 8);
    let lows = mostly_low(&mut rng, n);
    add(&mut rng, 0, "REFUND-ORDER", n, lows); // low-SRC
    let n = min_sightings + below(&mut rng, 8);
    let lows = below(&mut rng, (n + 1) / 2);
    add(&mut rng, 0, "SHIP-ORDER", n, lows); // seen often, scored high: not low-SRC
    add(&mut rng, 0, "RARE-KEY", min_sightings - 1, min_sightings - 1); // scored low, seen too few times
    let n = min_sightings + below(&mut rng, 8);
    let lows = mostly_low(&mut rng, n);
    add(&mut rng, 1, "REFUND-ORDER", n, lows); // the same key, another tenant: low-SRC on its own
    let n = min_sightings + below(&mut rng, 8);
    let lows = mostly_low(&mut rng, n);
    add(&mut rng, 2, "UNNAMED-KEY", n, lows); // an unnamed tenant's: low-SRC
    for i in (1..plan.len()).rev() {
        let j = below(&mut rng, i + 1);
        plan.swap(i, j);
    }

    // Up to three sequences at a time: each admitted and scored, then all
    // looked up together, again and again while any has lookups left.
    let mut model = Model { min_sightings, low_src, keys: BTreeMap::new(), flagged: BTreeMap::new(), turns: vec![] };
    let mut lookups = 0usize;
    for batch in plan.chunks(1 + below(&mut rng, 3)) {
        let mut seqs: Vec<Sequence> = Vec::new();
        for (i, p) in batch.iter().enumerate() {
            let prompt = [11, 12, 13, 14, 15 + i as i32];
            let seq = engine.admit_with(&prompt, &tenants[p.tenant].0).unwrap();
            let kept = score(&engine, &seq, p.score);
            model.sighting(&(tenants[p.tenant].1.clone(), tenants[p.tenant].0.adapter_id, p.key.to_string()), kept);
            seqs.push(seq);
        }
        for round in 0..3 {
            let (ours, suffixes): (Vec<&Sequence>, Vec<Suffix<'_>>) = batch
                .iter()
                .zip(&seqs)
                .filter(|(p, _)| p.times > round)
                .map(|(p, s)| (s, Suffix::Key { key: p.key, group: GROUP }))
                .unzip();
            if !ours.is_empty() {
                engine.lookup_snapshots(&ours, &suffixes, None).unwrap();
                lookups += ours.len();
            }
        }
        for mut seq in seqs {
            seq.finish().unwrap();
        }
    }
    assert!(lookups > plan.len(), "{}: the workload looked keys up again", why);

    let report = engine.clm_anomalies().unwrap();
    assert_eq!((report.window_ms, report.min_sightings, report.low_src), (window_ms, min_sightings as i64, low_src));
    let want = model.low_keys();
    let got: BTreeMap<(String, i32, String), (u64, f32)> = report
        .low_src_keys
        .iter()
        .map(|k| ((k.tenant.clone(), k.adapter_id, k.key.clone()), (k.sightings, k.median_src)))
        .collect();
    assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>(), "{}: {:?}", why, report.low_src_keys);
    assert_eq!(got.len(), 3, "{}", why);
    for (key, (sightings, median)) in &want {
        let (got_sightings, got_median) = got[key];
        assert_eq!(got_sightings, *sightings, "{}: {:?}", why, key);
        assert!((got_median - median).abs() <= MEDIAN_TOLERANCE, "{}: {:?}: {} vs {}", why, key, got_median, median);
    }
    for pair in report.low_src_keys.windows(2) {
        assert!(pair[0].sightings >= pair[1].sightings, "{}: the most seen first: {:?}", why, report.low_src_keys);
    }

    // Each turn to low-SRC is an event, in the order the model saw them.
    assert_eq!(report.events.len(), model.turns.len(), "{}: {:?}", why, report.events);
    for (e, (key, sightings, median)) in report.events.iter().zip(&model.turns) {
        assert_eq!(e.kind, ClmEventKind::LowSrc, "{}", why);
        assert_eq!(&(e.tenant.clone(), e.adapter_id, e.key.clone()), key, "{}: {:?}", why, e);
        assert_eq!(e.sightings, *sightings, "{}: {:?}", why, e);
        assert!((e.median_src - median).abs() <= MEDIAN_TOLERANCE, "{}: {:?} vs {}", why, e, median);
        assert_eq!((e.reason.as_str(), e.until_ms, e.by_breaker, e.version), ("", 0, false, 0), "{}", why);
    }
    let m = engine.metrics().unwrap();
    assert_eq!(m.clm_watch_sightings, plan.len() as u64, "{}: once per sequence and key", why);
    assert_eq!(m.clm_watch_low_src_turns, model.turns.len() as u64, "{}", why);
    assert_eq!((m.clm_watch_watched_keys, m.clm_watch_low_src_keys), (5, 3), "{}", why);
    assert_eq!(m.clm_watch_key_events, [0; 4], "{}", why);

    // The store's events for acme's low key, then one of the unnamed tenant.
    let mut seq = engine.admit_with(&[21, 22, 23, 24, 25], &tenants[0].0).unwrap();
    let refund = Suffix::Key { key: "REFUND-ORDER", group: GROUP };
    let mut v1 = vec![0.0f32; DIM];
    v1[0] = 1.0;
    let mut v2 = vec![0.0f32; DIM];
    v2[1] = 1.0; // orthogonal to v1: a new version
    let first = engine.record_snapshot(&seq, refund, &v1).unwrap();
    assert_eq!((first.result, first.version), (RecordResult::Admitted, 1), "{}", why);
    let second = engine.record_snapshot(&seq, refund, &v2).unwrap();
    assert_eq!((second.result, second.version), (RecordResult::NewVersion, 2), "{}", why);
    let reason = format!("wrong answers reported by support, ticket \"{}\"\n", below(&mut rng, 100_000));
    let until = now_ms() + 86_400_000 + below(&mut rng, 1_000_000) as i64;
    engine.blacklist_snapshot_key(acme_salt.as_bytes(), 0, refund, &reason, until).unwrap();
    engine.unblacklist_snapshot_key(acme_salt.as_bytes(), 0, refund).unwrap();
    seq.finish().unwrap();
    let mut unnamed = engine.admit_with(&[31, 32, 33, 34, 35], &tenants[2].0).unwrap();
    let unnamed_key = Suffix::Key { key: "UNNAMED-KEY", group: GROUP };
    assert_eq!(engine.record_snapshot(&unnamed, unnamed_key, &v1).unwrap().result, RecordResult::Admitted);
    unnamed.finish().unwrap();
    let finished = now_ms();

    let report = engine.clm_anomalies().unwrap();
    let turns = model.turns.len();
    let store_events: Vec<_> = report.events[turns..]
        .iter()
        .map(|e| (e.kind, e.tenant.as_str(), e.adapter_id, e.key.as_str(), e.version))
        .collect();
    let acme = ("acme", 0, "REFUND-ORDER");
    let unnamed_name = digest(&unnamed_salt);
    assert_eq!(
        store_events,
        vec![
            (ClmEventKind::VersionCreated, acme.0, acme.1, acme.2, 1),
            (ClmEventKind::VersionCreated, acme.0, acme.1, acme.2, 2),
            (ClmEventKind::Blacklisted, acme.0, acme.1, acme.2, 0),
            (ClmEventKind::Unblacklisted, acme.0, acme.1, acme.2, 0),
            (ClmEventKind::VersionCreated, unnamed_name.as_str(), 0, "UNNAMED-KEY", 1),
        ],
        "{}",
        why
    );
    let blacklisted = &report.events[turns + 2];
    assert_eq!(
        (blacklisted.reason.as_str(), blacklisted.until_ms, blacklisted.by_breaker),
        (reason.as_str(), until, false)
    );
    for e in &report.events[turns..] {
        if e.kind != ClmEventKind::Blacklisted {
            assert_eq!((e.reason.as_str(), e.until_ms, e.sightings, e.median_src), ("", 0, 0, 0.0), "{:?}", e);
        }
    }
    for pair in report.events.windows(2) {
        assert!(pair[0].time_ms <= pair[1].time_ms, "{}: in order: {:?}", why, pair);
    }
    for e in &report.events {
        assert!(e.time_ms >= started - 1000 && e.time_ms <= finished + 1000, "{}: {:?}", why, e);
        assert!(!e.tenant.contains("secret") && !e.json.contains("secret"), "{}: a salt in {:?}", why, e);
    }

    // The sink got every line, in order, each the report's line for the same event.
    let lines = lines.lock().unwrap().clone();
    let jsons: Vec<&str> = report.events.iter().map(|e| e.json.as_str()).collect();
    assert_eq!(lines, jsons, "{}", why);
    for (line, e) in lines.iter().zip(&report.events) {
        check_line(line, e);
    }

    let m = engine.metrics().unwrap();
    let mut key_events = [0u64; 4];
    for e in &report.events[turns..] {
        key_events[e.kind.raw() as usize] += 1;
    }
    assert_eq!(key_events, [1, 1, 3, 0]);
    assert_eq!(m.clm_watch_key_events, key_events, "{}", why);
    assert_eq!(m.clm_watch_sightings, plan.len() as u64, "{}: records and blacklists are not sightings", why);
    assert_eq!(
        m.clm_watch_low_src_turns,
        report.events.iter().filter(|e| e.kind == ClmEventKind::LowSrc).count() as u64
    );
    assert_eq!(m.clm_watch_low_src_keys, report.low_src_keys.len() as i64, "{}", why);
    assert_eq!(m.store_versions + m.store_admissions, 3, "{}", why);
}

#[test]
fn a_sink_that_panics_does_not_take_the_process_down() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let kept = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&kept);
    let sink = ClmWatchSink::new(move |line| {
        if counted.fetch_add(1, Ordering::SeqCst) % 2 == 0 {
            panic!("a host's bug, on {}", line);
        }
        keep.lock().unwrap().push(line.to_string());
    });
    let engine = Engine::new(&EngineOptions { clm_watch_sink: Some(sink), ..options() }).unwrap();
    let salt = b"salt-of-a-panicking-host";
    let mut seq = engine.admit_with(&[1, 2, 3, 4, 5], &AdmitOptions::salted(salt)).unwrap();
    let mut v = vec![0.0f32; DIM];
    for k in 0..4 {
        v[k] = 1.0; // each a new version of a fresh key, or a version after one
        let key = format!("KEY-{}", k % 2);
        engine.record_snapshot(&seq, Suffix::Key { key: &key, group: GROUP }, &v).unwrap();
    }
    seq.finish().unwrap();
    // Four events, four calls: the first and third panicked, the others were
    // kept; the engine and its report went on.
    let report = engine.clm_anomalies().unwrap();
    assert_eq!(report.events.len(), 4, "{:?}", report.events);
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    let kept = kept.lock().unwrap().clone();
    assert_eq!(kept, vec![report.events[1].json.clone(), report.events[3].json.clone()]);
    assert_eq!(engine.metrics().unwrap().clm_watch_key_events[ClmEventKind::VersionCreated.raw() as usize], 4);
    engine.admit(&[9, 9, 9, 9, 9]).unwrap().finish().unwrap();
}

#[test]
fn max_events_keeps_the_newest_and_max_keys_the_watch() {
    let (sink, lines) = collecting_sink();
    let engine =
        Engine::new(&EngineOptions { clm_watch_max_events: 2, clm_watch_sink: Some(sink), ..options() }).unwrap();
    let mut seq = engine.admit_with(&[1, 2, 3, 4, 5], &AdmitOptions::salted(b"s")).unwrap();
    let v = vec![1.0f32; DIM];
    for k in 0..5 {
        let key = format!("KEY-{}", k);
        engine.record_snapshot(&seq, Suffix::Key { key: &key, group: GROUP }, &v).unwrap();
    }
    let report = engine.clm_anomalies().unwrap();
    let lines = lines.lock().unwrap().clone();
    assert_eq!(lines.len(), 5, "the sink gets every line");
    let keys: Vec<&str> = report.events.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, vec!["KEY-3", "KEY-4"], "the newest two, oldest first");
    assert_eq!(vec![report.events[0].json.clone(), report.events[1].json.clone()], lines[3..].to_vec());
    assert_eq!(engine.metrics().unwrap().clm_watch_key_events[ClmEventKind::VersionCreated.raw() as usize], 5);
    seq.finish().unwrap();

    // None kept; a watch of two keys. Five keys looked up: two watched.
    let (sink, lines) = collecting_sink();
    let engine = Engine::new(&EngineOptions {
        clm_watch_max_events: 0,
        clm_watch_max_keys: 2,
        clm_watch_min_sightings: 1,
        clm_watch_sink: Some(sink),
        ..options()
    })
    .unwrap();
    for k in 0..5 {
        let seq = engine.admit(&[1, 2, 3, 4, 5]).unwrap();
        score(&engine, &seq, 0.05);
        let key = format!("KEY-{}", k);
        engine.lookup_snapshots(&[&seq], &[Suffix::Key { key: &key, group: GROUP }], None).unwrap();
    }
    let report = engine.clm_anomalies().unwrap();
    assert!(report.events.is_empty());
    assert_eq!(lines.lock().unwrap().len(), 5, "each key turned low-SRC at its first sighting");
    let m = engine.metrics().unwrap();
    assert_eq!((m.clm_watch_sightings, m.clm_watch_low_src_turns, m.clm_watch_watched_keys), (5, 5, 2));
    assert_eq!(report.low_src_keys.len(), 2);
}

#[test]
fn without_a_store_or_switched_off_the_report_is_a_failed_precondition() {
    let (sink, lines) = collecting_sink();
    let plain =
        Engine::new(&EngineOptions { snapshot_store_path: None, clm_watch_sink: Some(sink), ..options() }).unwrap();
    let err = plain.clm_anomalies().unwrap_err();
    assert_eq!(err.code(), ErrorCode::FailedPrecondition, "{}", err);
    assert!(err.message().contains("snapshot store"), "{}", err);
    plain.admit(&[1, 2, 3, 4, 5]).unwrap().finish().unwrap();
    assert_eq!(plain.metrics().unwrap().clm_watch_watched_keys, 0);

    let engine = Engine::new(&EngineOptions { clm_watch: false, ..options() }).unwrap();
    let seq = engine.admit_with(&[1, 2, 3, 4, 5], &AdmitOptions::salted(b"s")).unwrap();
    score(&engine, &seq, 0.05);
    let key = Suffix::Key { key: "REFUND-ORDER", group: GROUP };
    engine.lookup_snapshots(&[&seq], &[key], None).unwrap();
    assert_eq!(engine.record_snapshot(&seq, key, &[1.0; DIM]).unwrap().result, RecordResult::Admitted);
    let err = engine.clm_anomalies().unwrap_err();
    assert_eq!(err.code(), ErrorCode::FailedPrecondition, "{}", err);
    assert!(!err.message().is_empty());
    let m = engine.metrics().unwrap();
    assert_eq!((m.clm_watch_sightings, m.clm_watch_low_src_turns, m.clm_watch_key_events), (0, 0, [0; 4]));
    assert_eq!((m.clm_watch_watched_keys, m.clm_watch_low_src_keys), (0, 0));
    assert_eq!((m.store_lookups, m.store_admissions), (1, 1), "the store itself works");
    assert!(lines.lock().unwrap().is_empty());
}

#[test]
fn defaults_bounds_and_bad_input() {
    let d = EngineOptions::default();
    assert!(d.clm_watch && d.clm_watch_sink.is_none());
    assert_eq!((d.clm_watch_max_keys, d.clm_watch_window_ms, d.clm_watch_min_sightings), (4096, 3_600_000, 20));
    assert_eq!((d.clm_watch_low_src, d.clm_watch_max_events), (0.2, 1024));
    let report = Engine::new(&options()).unwrap().clm_anomalies().unwrap();
    assert_eq!(
        report,
        ClmAnomalyReport { window_ms: 3_600_000, min_sightings: 20, low_src: 0.2, ..Default::default() }
    );

    // The struct carries every setting; the sink only through Engine::new.
    let (sink, _) = collecting_sink();
    let set = EngineOptions {
        clm_watch: false,
        clm_watch_max_keys: 7,
        clm_watch_window_ms: 1 << 40,
        clm_watch_min_sightings: 3,
        clm_watch_low_src: 0.5,
        clm_watch_max_events: 9,
        clm_watch_sink: Some(sink),
        ..options()
    };
    assert_eq!(set, set.clone());
    let raw = set.to_raw().unwrap();
    assert_eq!((raw.clm_watch, raw.clm_watch_max_keys, raw.clm_watch_max_events), (0, 7, 9));
    assert_eq!((raw.clm_watch_window_ms, raw.clm_watch_min_sightings, raw.clm_watch_low_src), (1 << 40, 3, 0.5));
    assert!(raw.clm_watch_callback.is_none() && raw.clm_watch_callback_data.is_null());
    assert!(set.to_raw_owned().unwrap().as_raw().clm_watch_callback.is_none());

    for (bad, field) in [
        (EngineOptions { clm_watch_window_ms: 1, ..options() }, "window_ms"),
        (EngineOptions { clm_watch_window_ms: -5, ..options() }, "window_ms"),
        (EngineOptions { clm_watch_low_src: 0.0, ..options() }, "low_src"),
        (EngineOptions { clm_watch_low_src: 1.5, ..options() }, "low_src"),
        (EngineOptions { clm_watch_low_src: f32::NAN, ..options() }, "low_src"),
        (EngineOptions { clm_watch_max_keys: 0, ..options() }, "max_keys"),
        (EngineOptions { clm_watch_max_keys: (1 << 20) + 1, ..options() }, "max_keys"),
        (EngineOptions { clm_watch_min_sightings: 0, ..options() }, "min_sightings"),
        (EngineOptions { clm_watch_max_events: -1, ..options() }, "max_events"),
        (EngineOptions { clm_watch_max_events: (1 << 20) + 1, ..options() }, "max_events"),
    ] {
        let err = Engine::new(&bad).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{}", err);
        assert!(err.message().contains(field), "{}: {}", field, err);
    }
    // The bounds themselves are accepted.
    Engine::new(&EngineOptions {
        clm_watch_window_ms: 2,
        clm_watch_low_src: 1.0,
        clm_watch_max_keys: 1 << 20,
        clm_watch_min_sightings: 1,
        clm_watch_max_events: 0,
        ..options()
    })
    .unwrap();

    // Version 7 of clm_metrics (up to match_depth_sum_tokens) is still a size
    // the library knows: it writes nothing of version 8.
    let engine = Engine::new(&options()).unwrap();
    let seq = engine.admit(&[1, 2, 3, 4, 5]).unwrap();
    score(&engine, &seq, 0.05);
    engine.lookup_snapshots(&[&seq], &[Suffix::key("K")], None).unwrap();
    let whole = sys::clm_metrics::default();
    let v7 = &whole.clm_watch_sightings as *const u64 as usize - &whole as *const sys::clm_metrics as usize;
    assert!(v7 > 0 && v7 < size_of::<sys::clm_metrics>());
    let mut raw = sys::clm_metrics {
        struct_size: v7 as u32,
        clm_watch_sightings: 77,
        clm_watch_watched_keys: -7,
        ..Default::default()
    };
    // SAFETY: raw is writable for its whole size, more than struct_size.
    assert_eq!(unsafe { sys::clm_engine_metrics(&mut raw, engine.as_raw()) }, sys::CLM_OK);
    assert_eq!((raw.clm_watch_sightings, raw.clm_watch_watched_keys, raw.store_lookups), (77, -7, 1));
    let m = engine.metrics().unwrap();
    assert_eq!((m.clm_watch_sightings, m.clm_watch_watched_keys), (1, 1));
}

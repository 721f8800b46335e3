//! CLM suffix reuse through the real library: the SRC head (host memory and a
//! safetensors file) against a float64 reference over each sequence's running
//! mean, the gate and the breaker, snapshots and their injection against
//! float64 references, the version-2 options and metrics, and bad input.
mod common;

use clmcache::{
    sys, Activations, ActivationsMut, AdapterOptions, Engine, EngineOptions, ErrorCode, Gelu, MemoryKind, Sequence,
    SrcHeadWeights,
};
use common::{close, temp_path, write_safetensors, Rng};

const HIDDEN: usize = 8;
const INNER: usize = HIDDEN / 4;
const EOT: i32 = 2; // a special token: left out of the running mean

struct Head {
    w1: Vec<f32>,
    b1: Vec<f32>,
    w2: Vec<f32>,
    b2: f32,
}

impl Head {
    fn random(rng: &mut Rng, b2: f32) -> Head {
        Head { w1: rng.vec(INNER * HIDDEN, 0.8), b1: rng.vec(INNER, 0.5), w2: rng.vec(INNER, 1.5), b2 }
    }

    fn weights(&self) -> SrcHeadWeights<'_> {
        SrcHeadWeights { hidden: HIDDEN as i32, w1: &self.w1, b1: &self.b1, w2: &self.w2, b2: self.b2 }
    }

    /// sigmoid(w2 . GELU(W1 h + b1) + b2) in f64.
    #[allow(clippy::needless_range_loop)] // written as the formula reads
    fn reference(&self, mean: &[f64], gelu: Gelu) -> f64 {
        let mut logit = self.b2 as f64;
        for i in 0..INNER {
            let mut z = self.b1[i] as f64;
            for c in 0..HIDDEN {
                z += self.w1[i * HIDDEN + c] as f64 * mean[c];
            }
            let g = match gelu {
                Gelu::Erf => 0.5 * z * (1.0 + erf(z / 2f64.sqrt())),
                Gelu::Tanh => {
                    0.5 * z * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (z + 0.044715 * z * z * z)).tanh())
                }
            };
            logit += self.w2[i] as f64 * g;
        }
        1.0 / (1.0 + (-logit).exp())
    }
}

/// erf in f64: the Maclaurin series below 3 (error ~1e-15), Abramowitz and
/// Stegun 7.1.26 above (erfc < 2e-5 there, its error 1.5e-7).
fn erf(x: f64) -> f64 {
    if x.abs() < 3.0 {
        let (mut sum, mut term, mut n) = (0.0f64, x, 0u32);
        // term_n = (-1)^n x^(2n+1) / n!
        while n < 100 {
            let add = term / (2 * n + 1) as f64;
            sum += add;
            if add.abs() < 1e-17 {
                break;
            }
            n += 1;
            term *= -x * x / n as f64;
        }
        return sum * 2.0 / std::f64::consts::PI.sqrt();
    }
    let t = 1.0 / (1.0 + 0.3275911 * x.abs());
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    (1.0 - poly * (-x * x).exp()).copysign(x)
}

fn options() -> EngineOptions {
    EngineOptions { page_size: 4, memory: MemoryKind::None, special_token_ids: vec![EOT], ..EngineOptions::new(64) }
}

fn admit(engine: &Engine, first: i32) -> Sequence {
    engine.admit(&[first, 5, 6, 7, 8]).expect("admit")
}

#[test]
fn version_2_options_have_the_documented_defaults() {
    let defaults = EngineOptions::default();
    assert_eq!(defaults.src_daily_requests, 10000.0);
    assert_eq!(defaults.src_threshold, -1.0);
    assert_eq!(defaults.src_breaker_score, 0.95);
    assert_eq!(defaults.src_breaker_steps, 3);
    assert!(defaults.special_token_ids.is_empty());
    let raw = EngineOptions { special_token_ids: vec![1, 2, 3], ..defaults }.to_raw().unwrap();
    assert_eq!(raw.struct_size as usize, std::mem::size_of::<sys::clm_engine_options>());
    assert_eq!(raw.n_special_token_ids, 3);

    let adapter = AdapterOptions::default();
    assert_eq!((adapter.num_layers, adapter.layers.len(), adapter.residual_scale), (0, 0, 0.3));
    assert_eq!(AdapterOptions::new(12).num_layers, 12);
}

#[test]
fn bad_src_options_are_rejected_at_create() {
    let cases: Vec<EngineOptions> = vec![
        EngineOptions { src_daily_requests: 0.0, ..options() },
        EngineOptions { src_threshold: 1.5, ..options() },
        EngineOptions { src_breaker_score: 2.0, ..options() },
        EngineOptions { src_breaker_steps: 0, ..options() },
    ];
    for opts in cases {
        let err = Engine::new(&opts).expect_err(&format!("{:?}", opts));
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{}", err);
        assert!(!err.message().is_empty());
    }
}

/// Steps two sequences through the head and compares every score with the
/// float64 reference over each one's running mean of non-special rows.
fn running_mean_scores(gelu: Gelu, seed: u64) {
    let mut rng = Rng::new(seed);
    let engine = Engine::new(&options()).unwrap();
    let head = Head::random(&mut rng, 0.3);
    engine.set_src_head(&head.weights(), gelu).unwrap();
    let (a, b) = (admit(&engine, 1), admit(&engine, 3));
    let mut sums = [vec![0.0f64; HIDDEN], vec![0.0f64; HIDDEN]];
    let mut counts = [0usize; 2];
    for step in 0..6 {
        // a: two rows (the second special at odd steps); b: one row.
        let rows = rng.vec(3 * HIDDEN, 1.0);
        let ids = [10, if step % 2 == 1 { EOT } else { 11 }, 12];
        let indptr = [0, 2, 3];
        for r in 0..3 {
            if ids[r] == EOT {
                continue;
            }
            let s = if r < 2 { 0 } else { 1 };
            for (sum, &x) in sums[s].iter_mut().zip(&rows[r * HIDDEN..(r + 1) * HIDDEN]) {
                *sum += x as f64;
            }
            counts[s] += 1;
        }
        let decisions = engine.src_step(&[&a, &b], Activations::F32(&rows), HIDDEN as i32, &ids, &indptr).unwrap();
        assert_eq!(decisions.len(), 2);
        for (s, d) in decisions.iter().enumerate() {
            let mean: Vec<f64> = sums[s].iter().map(|v| v / counts[s] as f64).collect();
            let want = head.reference(&mean, gelu);
            assert!(d.scored, "step {} seq {}", step, s);
            assert!(close(d.score as f64, want, 1e-5), "step {} seq {}: {} vs {}", step, s, d.score, want);
            assert!((d.threshold - 0.8).abs() < 1e-6, "{}", d.threshold);
            assert_eq!(d.reuse, d.score >= d.threshold);
            assert!(!d.baseline);
        }
    }
    let m = engine.metrics().unwrap();
    assert_eq!(m.src_steps, 12);
    assert!((m.src_threshold - 0.8).abs() < 1e-6);
}

#[test]
fn src_scores_match_a_float64_reference_of_the_running_mean() {
    running_mean_scores(Gelu::Erf, 1);
    running_mean_scores(Gelu::Tanh, 2);
}

#[test]
fn src_step_takes_half_precision_rows() {
    // Values exact in f16 and bf16: both give the f32 scores.
    let mut rng = Rng::new(3);
    let head = Head::random(&mut rng, 0.0);
    let values: Vec<f32> = (0..HIDDEN).map(|i| (i as f32 - 3.0) * 0.25).collect();
    let bf16: Vec<u16> = values.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
    let f16: Vec<u16> = values.iter().map(|&v| f32_to_f16_exact(v)).collect();
    let mean: Vec<f64> = values.iter().map(|&v| v as f64).collect();
    let want = head.reference(&mean, Gelu::Tanh);
    for rows in [Activations::F32(&values), Activations::F16(&f16), Activations::Bf16(&bf16)] {
        let engine = Engine::new(&options()).unwrap();
        engine.set_src_head(&head.weights(), Gelu::Tanh).unwrap();
        let seq = admit(&engine, 1);
        let d = engine.src_step(&[&seq], rows, HIDDEN as i32, &[9], &[0, 1]).unwrap();
        assert!(close(d[0].score as f64, want, 1e-5), "{:?}: {} vs {}", rows.dtype(), d[0].score, want);
    }
}

/// f16 bits of a value that f16 holds exactly (normal, small exponent range).
fn f32_to_f16_exact(v: f32) -> u16 {
    if v == 0.0 {
        return if v.is_sign_negative() { 0x8000 } else { 0 };
    }
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    let mantissa = bits & 0x7f_ffff;
    assert!(exp > 0 && exp < 31 && mantissa & 0x1fff == 0, "{} is not exact in f16", v);
    sign | ((exp as u16) << 10) | (mantissa >> 13) as u16
}

#[test]
fn special_rows_only_leave_a_sequence_unscored() {
    let mut rng = Rng::new(4);
    let engine = Engine::new(&options()).unwrap();
    engine.set_src_head(&Head::random(&mut rng, 0.0).weights(), Gelu::Erf).unwrap();
    let (a, b) = (admit(&engine, 1), admit(&engine, 3));
    let rows = rng.vec(2 * HIDDEN, 1.0);
    // a: one special row; b: no rows at all.
    let d = engine.src_step(&[&a, &b], Activations::F32(&rows[..HIDDEN]), HIDDEN as i32, &[EOT], &[0, 1, 1]).unwrap();
    for decision in &d {
        assert!(!decision.scored);
        assert_eq!((decision.score, decision.reuse), (0.0, false));
    }
    let m = engine.metrics().unwrap();
    assert_eq!(m.src_unscored_steps, 2);
    assert_eq!(m.src_reuse_decisions, 0);
}

#[test]
fn src_head_from_a_safetensors_file_and_the_breaker() {
    let mut rng = Rng::new(5);
    // b2 = 40: every score is 1, above the breaker's 0.95.
    let head = Head::random(&mut rng, 40.0);
    let path = temp_path("src-head");
    write_safetensors(
        &path,
        &[
            ("src_head.b1", &[INNER], &head.b1),
            ("src_head.b2", &[1], &[head.b2]),
            ("src_head.w1", &[INNER, HIDDEN], &head.w1),
            ("src_head.w2", &[INNER], &head.w2),
        ],
    );
    // threshold 0.9
    let engine = Engine::new(&EngineOptions { src_daily_requests: 1e6, ..options() }).unwrap();
    // This file does not say which GELU it was trained with.
    let from_file = engine.load_src_head_as_trained(&path);
    let loaded = engine.load_src_head(&path, Gelu::Tanh);
    std::fs::remove_file(&path).unwrap();
    loaded.unwrap();
    let err = from_file.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.message().contains("GELU"), "{}", err);

    let err = engine.load_src_head("/nonexistent/head.safetensors", Gelu::Tanh).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Io, "{}", err);
    let err = engine.load_src_head("bad\0path", Gelu::Tanh).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.message().contains("NUL"), "{}", err);

    let seq = admit(&engine, 1);
    let row = vec![0.5f32; HIDDEN];
    for step in 0..4 {
        let d = engine.src_step(&[&seq], Activations::F32(&row), HIDDEN as i32, &[9], &[0, 1]).unwrap()[0];
        assert!(d.score > 0.95, "step {}: {}", step, d.score);
        assert!((d.threshold - 0.9).abs() < 1e-6, "{}", d.threshold);
        assert_eq!(d.reuse, step < 3, "step {}", step);
        assert_eq!(d.baseline, step >= 3, "step {}", step);
        if d.reuse {
            engine.report_retrieval(&[&seq], &[false]).unwrap();
        }
    }
    let m = engine.metrics().unwrap();
    assert_eq!(m.src_breaker_trips, 1);
    assert_eq!(m.src_baseline_sequences, 1);
    assert_eq!(m.src_retrievals_failed, 3);
    assert_eq!(m.src_retrievals_found, 0);
    assert_eq!(m.src_reuse_decisions, 3);
    assert_eq!(engine.report_retrieval(&[&seq], &[]).unwrap_err().code(), ErrorCode::InvalidArgument);
}

#[test]
fn a_fixed_threshold_and_found_retrievals() {
    let mut rng = Rng::new(6);
    let head = Head::random(&mut rng, 40.0);
    let engine = Engine::new(&EngineOptions { src_threshold: 0.5, src_breaker_steps: 1, ..options() }).unwrap();
    engine.set_src_head(&head.weights(), Gelu::Erf).unwrap();
    let seq = admit(&engine, 1);
    let row = vec![0.25f32; HIDDEN];
    for _ in 0..3 {
        let d = engine.src_step(&[&seq], Activations::F32(&row), HIDDEN as i32, &[9], &[0, 1]).unwrap()[0];
        assert_eq!((d.threshold, d.reuse, d.baseline), (0.5, true, false));
        engine.report_retrieval(&[&seq], &[true]).unwrap(); // found: the breaker never counts
    }
    let m = engine.metrics().unwrap();
    assert_eq!((m.src_retrievals_found, m.src_breaker_trips, m.src_threshold), (3, 0, 0.5));
}

#[test]
fn bad_src_input_is_an_error_and_changes_nothing() {
    let mut rng = Rng::new(7);
    let engine = Engine::new(&options()).unwrap();
    let seq = admit(&engine, 1);
    let rows = rng.vec(HIDDEN, 1.0);
    let h = HIDDEN as i32;

    // No head yet.
    let err = engine.src_step(&[&seq], Activations::F32(&rows), h, &[9], &[0, 1]).unwrap_err();
    assert_eq!(err.code(), ErrorCode::FailedPrecondition, "{}", err);

    let head = Head::random(&mut rng, 0.0);
    // Rust-side length checks.
    let short = SrcHeadWeights { w1: &head.w1[1..], ..head.weights() };
    let err = engine.set_src_head(&short, Gelu::Erf).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.message().contains("w1"), "{}", err);
    let odd = SrcHeadWeights { hidden: 6, ..head.weights() };
    assert_eq!(engine.set_src_head(&odd, Gelu::Erf).unwrap_err().code(), ErrorCode::InvalidArgument);
    // The library's own check: NaN weights.
    let mut nan = head.w2.clone();
    nan[0] = f32::NAN;
    let err = engine.set_src_head(&SrcHeadWeights { w2: &nan, ..head.weights() }, Gelu::Erf).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{}", err);

    engine.set_src_head(&head.weights(), Gelu::Erf).unwrap();
    let cases: Vec<(&str, clmcache::Result<Vec<clmcache::SrcDecision>>)> = vec![
        ("token_ids", engine.src_step(&[&seq], Activations::F32(&rows), h, &[9, 9], &[0, 1])),
        ("indptr", engine.src_step(&[&seq], Activations::F32(&rows), h, &[9], &[0])),
        ("multiple of hidden", engine.src_step(&[&seq], Activations::F32(&rows[1..]), h, &[9], &[0, 1])),
        ("indptr ends", engine.src_step(&[&seq], Activations::F32(&rows), h, &[9], &[0, 2])),
        ("twice", engine.src_step(&[&seq, &seq], Activations::F32(&rows), h, &[9], &[0, 1, 1])),
        ("hidden", engine.src_step(&[&seq], Activations::F32(&rows), 4, &[9, 9], &[0, 2])),
    ];
    for (what, result) in cases {
        let err = result.expect_err(what);
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{}: {}", what, err);
        assert!(!err.message().is_empty());
    }
    let mut bad = rows.clone();
    bad[3] = f32::INFINITY;
    let err = engine.src_step(&[&seq], Activations::F32(&bad), h, &[9], &[0, 1]).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{}", err);

    // A sequence of another engine, and an ended one.
    let other = Engine::new(&options()).unwrap();
    let foreign = admit(&other, 1);
    let err = engine.src_step(&[&foreign], Activations::F32(&rows), h, &[9], &[0, 1]).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.message().contains("another engine"), "{}", err);
    let mut ended = admit(&engine, 3);
    ended.finish().unwrap();
    let err = engine.src_step(&[&ended], Activations::F32(&rows), h, &[9], &[0, 1]).unwrap_err();
    assert_eq!(err.code(), ErrorCode::FailedPrecondition);

    // Nothing was counted by the failed steps.
    assert_eq!(engine.metrics().unwrap().src_steps, 0);
    // And the first good step still sees an empty history: the score is the
    // head of this row alone.
    let d = engine.src_step(&[&seq], Activations::F32(&rows), h, &[9], &[0, 1]).unwrap()[0];
    let mean: Vec<f64> = rows.iter().map(|&v| v as f64).collect();
    assert!(close(d.score as f64, head.reference(&mean, Gelu::Erf), 1e-5));
}

// ---- snapshots ------------------------------------------------------------------

const SNAP_HIDDEN: usize = 6;
const SNAP_DIM: usize = 2;

/// mean [6], two orthonormal components [2][6].
fn projection(rng: &mut Rng) -> (Vec<f32>, Vec<f32>) {
    let r = std::f32::consts::FRAC_1_SQRT_2;
    let components = vec![r, r, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, r, -r, 0.0, 0.0];
    (rng.vec(SNAP_HIDDEN, 0.5), components)
}

/// normalize(C (x - mean)) in f64.
fn snapshot_reference(x: &[f32], mean: &[f32], components: &[f32]) -> Vec<f64> {
    let mut s: Vec<f64> = (0..SNAP_DIM)
        .map(|d| (0..SNAP_HIDDEN).map(|c| components[d * SNAP_HIDDEN + c] as f64 * (x[c] - mean[c]) as f64).sum())
        .collect();
    let norm = s.iter().map(|v| v * v).sum::<f64>().sqrt();
    s.iter_mut().for_each(|v| *v /= norm);
    s
}

#[test]
fn snapshots_match_a_float64_reference() {
    let mut rng = Rng::new(8);
    let engine = Engine::new(&options()).unwrap();
    let rows = rng.vec(3 * SNAP_HIDDEN, 2.0);
    let h = SNAP_HIDDEN as i32;
    let err = engine.make_snapshots(Activations::F32(&rows), h, SNAP_DIM as i32).unwrap_err();
    assert_eq!(err.code(), ErrorCode::FailedPrecondition, "{}", err);

    let (mean, components) = projection(&mut rng);
    engine.set_snapshot_projection(h, SNAP_DIM as i32, &mean, &components).unwrap();
    let snaps = engine.make_snapshots(Activations::F32(&rows), h, SNAP_DIM as i32).unwrap();
    assert_eq!(snaps.len(), 3 * SNAP_DIM);
    for r in 0..3 {
        let want = snapshot_reference(&rows[r * SNAP_HIDDEN..(r + 1) * SNAP_HIDDEN], &mean, &components);
        for d in 0..SNAP_DIM {
            assert!(close(snaps[r * SNAP_DIM + d] as f64, want[d], 1e-5), "row {} dim {}", r, d);
        }
    }

    // From a file: the same snapshots.
    let path = temp_path("projection");
    write_safetensors(
        &path,
        &[("snapshot.components", &[SNAP_DIM, SNAP_HIDDEN], &components), ("snapshot.mean", &[SNAP_HIDDEN], &mean)],
    );
    let other = Engine::new(&options()).unwrap();
    let loaded = other.load_snapshot_projection(&path);
    std::fs::remove_file(&path).unwrap();
    loaded.unwrap();
    let mut again = vec![0.0f32; 3 * SNAP_DIM];
    other.make_snapshots_into(Activations::F32(&rows), h, &mut again).unwrap();
    assert_eq!(again, snaps);

    // Bad input.
    let err = engine.make_snapshots_into(Activations::F32(&rows), h, &mut again[1..]).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    let mut wrong_dim = vec![0.0f32; 3 * 3];
    let err = engine.make_snapshots_into(Activations::F32(&rows), h, &mut wrong_dim).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{}", err);
    let err = engine.make_snapshots(Activations::F32(&rows), 4, SNAP_DIM as i32).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{}", err);
    let err = engine.set_snapshot_projection(h, SNAP_DIM as i32, &mean[1..], &components).unwrap_err();
    assert!(err.message().contains("mean"), "{}", err);
    let not_orthonormal: Vec<f32> = components.iter().map(|v| v * 2.0).collect();
    let err = engine.set_snapshot_projection(h, SNAP_DIM as i32, &mean, &not_orthonormal).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{}", err);
    assert_eq!(other.load_snapshot_projection("/nonexistent/p.safetensors").unwrap_err().code(), ErrorCode::Io);
}

#[test]
fn injection_adds_residual_scale_times_w_s_plus_b() {
    let mut rng = Rng::new(9);
    let engine = Engine::new(&options()).unwrap();
    let (h, dim) = (SNAP_HIDDEN as i32, SNAP_DIM as i32);
    let weight = rng.vec(SNAP_HIDDEN * SNAP_DIM, 1.0); // [hidden][dim]
    let bias = rng.vec(SNAP_HIDDEN, 1.0);
    let (a, b) = (admit(&engine, 1), admit(&engine, 3));
    let states = rng.vec(3 * SNAP_HIDDEN, 1.0); // a: rows 0-1, b: row 2
    let snapshots = rng.vec(2 * SNAP_DIM, 1.0);
    let indptr = [0, 2, 3];

    let mut hs = states.clone();
    let err = engine
        .inject_snapshots(ActivationsMut::F32(&mut hs), h, &[&a, &b], &indptr, &snapshots, dim, &[true, true], 3)
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::FailedPrecondition, "{}", err);

    let opts = AdapterOptions { residual_scale: 0.5, ..AdapterOptions::new(4) }; // injects at 1, 2, 3
    engine.set_snapshot_adapter(dim, h, &weight, &bias, &opts).unwrap();
    engine
        .inject_snapshots(ActivationsMut::F32(&mut hs), h, &[&a, &b], &indptr, &snapshots, dim, &[true, false], 3)
        .unwrap();
    for r in 0..3 {
        for c in 0..SNAP_HIDDEN {
            let before = states[r * SNAP_HIDDEN + c] as f64;
            let want = if r < 2 {
                let ws: f64 = (0..SNAP_DIM).map(|d| weight[c * SNAP_DIM + d] as f64 * snapshots[d] as f64).sum();
                before + 0.5 * (ws + bias[c] as f64)
            } else {
                before // apply[1] is false
            };
            assert!(close(hs[r * SNAP_HIDDEN + c] as f64, want, 1e-5), "row {} col {}", r, c);
        }
    }
    assert_eq!(engine.metrics().unwrap().src_injections, 1);

    // Layer 0 is not an injecting layer: nothing changes.
    let mut untouched = states.clone();
    engine
        .inject_snapshots(ActivationsMut::F32(&mut untouched), h, &[&a, &b], &indptr, &snapshots, dim, &[true, true], 0)
        .unwrap();
    assert_eq!(untouched, states);

    // Explicit layers, from a file.
    let path = temp_path("adapter");
    write_safetensors(
        &path,
        &[("adapter.bias", &[SNAP_HIDDEN], &bias), ("adapter.weight", &[SNAP_HIDDEN, SNAP_DIM], &weight)],
    );
    let layer0 = AdapterOptions { layers: vec![0], residual_scale: 1.0, ..AdapterOptions::new(4) };
    let loaded = engine.load_snapshot_adapter(&path, &layer0);
    std::fs::remove_file(&path).unwrap();
    loaded.unwrap();
    let mut one = states[..SNAP_HIDDEN].to_vec();
    engine
        .inject_snapshots(ActivationsMut::F32(&mut one), h, &[&b], &[0, 1], &snapshots[..SNAP_DIM], dim, &[true], 0)
        .unwrap();
    for c in 0..SNAP_HIDDEN {
        let ws: f64 = (0..SNAP_DIM).map(|d| weight[c * SNAP_DIM + d] as f64 * snapshots[d] as f64).sum();
        assert!(close(one[c] as f64, states[c] as f64 + ws + bias[c] as f64, 1e-5), "col {}", c);
    }

    // Bad input: Rust-side lengths, then the library's checks; never a write.
    let mut hs = states.clone();
    let seqs = [&a, &b];
    let cases: Vec<(&str, clmcache::Result<()>)> = vec![
        (
            "snapshots",
            engine.inject_snapshots(
                ActivationsMut::F32(&mut hs),
                h,
                &seqs,
                &indptr,
                &snapshots[1..],
                dim,
                &[true, true],
                0,
            ),
        ),
        (
            "apply",
            engine.inject_snapshots(ActivationsMut::F32(&mut hs), h, &seqs, &indptr, &snapshots, dim, &[true], 0),
        ),
        (
            "indptr",
            engine.inject_snapshots(ActivationsMut::F32(&mut hs), h, &seqs, &[0, 3], &snapshots, dim, &[true, true], 0),
        ),
        (
            "layer",
            engine.inject_snapshots(ActivationsMut::F32(&mut hs), h, &seqs, &indptr, &snapshots, dim, &[true, true], 9),
        ),
        (
            "indptr order",
            engine.inject_snapshots(
                ActivationsMut::F32(&mut hs),
                h,
                &seqs,
                &[0, 3, 2],
                &snapshots,
                dim,
                &[true, true],
                0,
            ),
        ),
        (
            "hidden",
            engine.inject_snapshots(
                ActivationsMut::F32(&mut hs),
                9,
                &seqs,
                &[0, 1, 2],
                &snapshots,
                dim,
                &[true, true],
                0,
            ),
        ),
    ];
    for (what, result) in cases {
        let err = result.expect_err(what);
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{}: {}", what, err);
    }
    let mut nan = snapshots.clone();
    nan[0] = f32::NAN;
    let err = engine
        .inject_snapshots(ActivationsMut::F32(&mut hs), h, &seqs, &indptr, &nan, dim, &[true, true], 0)
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{}", err);
    assert_eq!(hs, states, "a failed injection wrote to the hidden states");

    let err = engine.set_snapshot_adapter(dim, h, &weight[1..], &bias, &opts).unwrap_err();
    assert!(err.message().contains("weight"), "{}", err);
    let err = engine.set_snapshot_adapter(dim, h, &weight, &bias, &AdapterOptions::default()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "num_layers 0: {}", err);
    let err = engine
        .set_snapshot_adapter(dim, h, &weight, &bias, &AdapterOptions { layers: vec![7], ..AdapterOptions::new(4) })
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "layer 7 of 4: {}", err);
}

#[test]
fn a_sequence_in_baseline_mode_gets_no_injection() {
    let mut rng = Rng::new(10);
    let head = Head::random(&mut rng, 40.0);
    let engine = Engine::new(&EngineOptions { src_breaker_steps: 1, ..options() }).unwrap();
    engine.set_src_head(&head.weights(), Gelu::Erf).unwrap();
    let seq = admit(&engine, 1);
    let row = vec![0.5f32; HIDDEN];
    let d = engine.src_step(&[&seq], Activations::F32(&row), HIDDEN as i32, &[9], &[0, 1]).unwrap()[0];
    assert!(d.reuse);
    engine.report_retrieval(&[&seq], &[false]).unwrap(); // one failure trips a 1-step breaker
    assert_eq!(engine.metrics().unwrap().src_baseline_sequences, 1);

    let (h, dim) = (SNAP_HIDDEN as i32, SNAP_DIM as i32);
    let weight = rng.vec(SNAP_HIDDEN * SNAP_DIM, 1.0);
    let bias = rng.vec(SNAP_HIDDEN, 1.0);
    engine.set_snapshot_adapter(dim, h, &weight, &bias, &AdapterOptions::new(2)).unwrap();
    let states = rng.vec(SNAP_HIDDEN, 1.0);
    let mut hs = states.clone();
    engine.inject_snapshots(ActivationsMut::F32(&mut hs), h, &[&seq], &[0, 1], &[0.6, 0.8], dim, &[true], 1).unwrap();
    assert_eq!(hs, states);
    assert_eq!(engine.metrics().unwrap().src_injections, 0);
}

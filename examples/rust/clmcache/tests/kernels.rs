//! The attention and KV kernels through the real library: K/V written into
//! the pool at a sequence's slots, prefill (over a reused prefix too) and
//! batched decode against float64 dense attention, page copies, gathers and
//! scatters against the documented layout, and bad input.
mod common;

use clmcache::{AttentionParams, Engine, EngineOptions, ErrorCode, KvDtype, MemoryKind, Sequence};
use common::{close, Rng};

const PAGE: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 8;
const Q_HEADS: usize = 4;
const LAYERS: i32 = 2;
const ROW: usize = KV_HEADS * HEAD_DIM; // floats of one token's K (or V)

fn engine(num_pages: i32) -> Engine {
    Engine::new(&EngineOptions {
        page_size: PAGE as i32,
        num_layers: LAYERS,
        kv_heads: KV_HEADS as i32,
        head_dim: HEAD_DIM as i32,
        kv_dtype: KvDtype::F32,
        memory: MemoryKind::Host,
        ..EngineOptions::new(num_pages)
    })
    .unwrap()
}

fn params(layer: i32) -> AttentionParams {
    AttentionParams { layer, num_threads: 2, ..AttentionParams::new(Q_HEADS as i32) }
}

/// The host's copy of one sequence's K and V (every token, [len][KV_HEADS][HEAD_DIM]).
#[derive(Default, Clone)]
struct Kv {
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Kv {
    fn len(&self) -> usize {
        self.k.len() / ROW
    }

    /// Appends `n` random tokens and writes them at the sequence's latest slots.
    fn append_and_write(&mut self, rng: &mut Rng, engine: &mut Engine, seq: &Sequence, layer: i32, n: usize) {
        let (k, v) = (rng.vec(n * ROW, 1.0), rng.vec(n * ROW, 1.0));
        assert_eq!(seq.slots().len(), n);
        engine.write_kv(layer, seq.slots(), &k, &v).unwrap();
        self.k.extend_from_slice(&k);
        self.v.extend_from_slice(&v);
    }
}

/// Dense causal GQA attention in f64 of the last `n_new` tokens over `kv`,
/// optionally windowed: [n_new][Q_HEADS][HEAD_DIM].
fn dense(kv: &Kv, q: &[f32], n_new: usize, window: usize) -> Vec<f64> {
    let len = kv.len();
    let scale = 1.0 / (HEAD_DIM as f64).sqrt();
    let group = Q_HEADS / KV_HEADS;
    let mut out = vec![0.0f64; n_new * Q_HEADS * HEAD_DIM];
    for i in 0..n_new {
        let p = len - n_new + i;
        let first = if window > 0 { (p + 1).saturating_sub(window) } else { 0 };
        for h in 0..Q_HEADS {
            let g = h / group;
            let qv = &q[(i * Q_HEADS + h) * HEAD_DIM..][..HEAD_DIM];
            let scores: Vec<f64> = (first..=p)
                .map(|j| {
                    let kj = &kv.k[(j * KV_HEADS + g) * HEAD_DIM..][..HEAD_DIM];
                    scale * qv.iter().zip(kj).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>()
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for (w, j) in weights.iter().zip(first..=p) {
                let vj = &kv.v[(j * KV_HEADS + g) * HEAD_DIM..][..HEAD_DIM];
                for d in 0..HEAD_DIM {
                    out[(i * Q_HEADS + h) * HEAD_DIM + d] += w / total * vj[d] as f64;
                }
            }
        }
    }
    out
}

fn assert_close(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{}", what);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(close(g as f64, w, 1e-4), "{}[{}]: {} vs {}", what, i, g, w);
    }
}

#[test]
fn attention_params_defaults_come_from_the_library() {
    let p = AttentionParams::default();
    assert_eq!((p.layer, p.num_q_heads, p.softmax_scale, p.sliding_window, p.num_threads), (0, 0, 0.0, 0, 0));
    assert_eq!(AttentionParams::new(8).num_q_heads, 8);
}

#[test]
fn prefill_over_a_reused_prefix_matches_dense_attention() {
    let mut rng = Rng::new(11);
    let mut engine = engine(32);
    let layer = 1;

    // Turn 1: 10 tokens, nothing cached; attention over all of them.
    let prompt: Vec<i32> = (100..110).collect();
    let mut turn1 = engine.admit(&prompt).unwrap();
    let mut kv = Kv::default();
    kv.append_and_write(&mut rng, &mut engine, &turn1, layer, prompt.len());
    let q = rng.vec(prompt.len() * Q_HEADS * HEAD_DIM, 1.0);
    let out = engine.paged_prefill_attention(&params(layer), &q, prompt.len(), &turn1.page_table(), kv.len()).unwrap();
    assert_close(&out, &dense(&kv, &q, prompt.len(), 0), "turn 1");

    // A sliding window of 3.
    let windowed = AttentionParams { sliding_window: 3, ..params(layer) };
    let out = engine.paged_prefill_attention(&windowed, &q, prompt.len(), &turn1.page_table(), kv.len()).unwrap();
    assert_close(&out, &dense(&kv, &q, prompt.len(), 3), "window 3");
    turn1.finish().unwrap();

    // Turn 2: the same 10 tokens and 5 more; 8 (two pages) are reused, so the
    // host writes and attends for the last 7 only, over all 15.
    let mut prompt2 = prompt.clone();
    prompt2.extend(200..205);
    let turn2 = engine.admit(&prompt2).unwrap();
    assert_eq!(turn2.cached_tokens(), 8);
    let mut kv2 = Kv { k: kv.k[..8 * ROW].to_vec(), v: kv.v[..8 * ROW].to_vec() };
    kv2.append_and_write(&mut rng, &mut engine, &turn2, layer, prompt2.len() - 8);
    let n_new = prompt2.len() - 8;
    let q = rng.vec(n_new * Q_HEADS * HEAD_DIM, 1.0);
    let mut out = vec![f32::NAN; q.len()];
    engine.paged_prefill_attention_into(&mut out, &params(layer), &q, n_new, &turn2.page_table(), kv2.len()).unwrap();
    assert_close(&out, &dense(&kv2, &q, n_new, 0), "turn 2");

    // Layer 0 was never written by this test; a softmax scale changes the result.
    let scaled = AttentionParams { softmax_scale: 0.1, ..params(layer) };
    let other = engine.paged_prefill_attention(&scaled, &q, n_new, &turn2.page_table(), kv2.len()).unwrap();
    assert!(other.iter().zip(&out).any(|(a, b)| (a - b).abs() > 1e-4));
}

#[test]
fn batched_decode_matches_dense_attention() {
    let mut rng = Rng::new(12);
    let mut engine = engine(32);
    let layer = 0;
    let mut seqs = Vec::new();
    let mut kvs = Vec::new();
    for (i, len) in [3usize, 9, 4].iter().enumerate() {
        let prompt: Vec<i32> = (0..*len as i32).map(|t| 1000 * (i as i32 + 1) + t).collect();
        let seq = engine.admit(&prompt).unwrap();
        let mut kv = Kv::default();
        kv.append_and_write(&mut rng, &mut engine, &seq, layer, prompt.len());
        seqs.push(seq);
        kvs.push(kv);
    }
    // One decode step each: extend, write the new token's K/V, attend.
    for (seq, kv) in seqs.iter_mut().zip(kvs.iter_mut()) {
        seq.extend(&[7]).unwrap();
        kv.append_and_write(&mut rng, &mut engine, seq, layer, 1);
    }
    let refs: Vec<&Sequence> = seqs.iter().collect();
    let batch = engine.batch_page_table(&refs).unwrap();
    let q = rng.vec(seqs.len() * Q_HEADS * HEAD_DIM, 1.0);
    let out = engine.paged_decode_attention(&params(layer), &q, &batch).unwrap();
    let stride = Q_HEADS * HEAD_DIM;
    for (i, kv) in kvs.iter().enumerate() {
        let want = dense(kv, &q[i * stride..(i + 1) * stride], 1, 0);
        assert_close(&out[i * stride..(i + 1) * stride], &want, &format!("seq {}", i));
    }

    // Bad input.
    let mut short = batch.clone();
    short.indptr.pop();
    let err = engine.paged_decode_attention(&params(layer), &q, &short).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.message().contains("indptr"), "{}", err);
    let err = engine.paged_decode_attention(&params(layer), &q[1..], &batch).unwrap_err();
    assert!(err.message().contains("q has"), "{}", err);
    let mut bad_len = batch.clone();
    bad_len.last_page_len[0] = PAGE as i32 + 1;
    let err = engine.paged_decode_attention(&params(layer), &q, &bad_len).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{}", err);
    let mut bad_page = batch.clone();
    bad_page.indices[0] = 999;
    let err = engine.paged_decode_attention(&params(layer), &q, &bad_page).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{}", err);
}

#[test]
fn bad_kernel_input_is_an_error_and_writes_nothing() {
    let mut rng = Rng::new(13);
    let mut engine = engine(16);
    let seq = engine.admit(&[1, 2, 3, 4, 5]).unwrap();
    let mut kv = Kv::default();
    kv.append_and_write(&mut rng, &mut engine, &seq, 0, 5);
    let pages = seq.page_table();
    let before = engine.gather_pages(&pages).unwrap();

    let slots = seq.slots().to_vec();
    let k = rng.vec(5 * ROW, 1.0);
    let cases: Vec<(&str, ErrorCode, clmcache::Result<()>)> = vec![
        ("v has", ErrorCode::InvalidArgument, engine.write_kv(0, &slots, &k, &k[ROW..])),
        ("k has", ErrorCode::InvalidArgument, engine.write_kv(0, &slots[1..], &k, &k)),
        ("layer", ErrorCode::InvalidArgument, engine.write_kv(LAYERS, &slots, &k, &k)),
        ("slot", ErrorCode::InvalidArgument, engine.write_kv(0, &[1 << 40, 1, 2, 3, 4], &k, &k)),
    ];
    for (what, code, result) in cases {
        let err = result.expect_err(what);
        assert_eq!(err.code(), code, "{}: {}", what, err);
        assert!(!err.message().is_empty());
    }
    assert_eq!(engine.gather_pages(&pages).unwrap(), before, "a failed write_kv changed the pool");

    let q = rng.vec(5 * Q_HEADS * HEAD_DIM, 1.0);
    let p = params(0);
    let mut nan_q = q.clone();
    nan_q[3] = f32::NAN;
    let cases: Vec<(&str, clmcache::Result<Vec<f32>>)> = vec![
        ("q length", engine.paged_prefill_attention(&p, &q[1..], 5, &pages, 5)),
        ("n_new > kv_len", engine.paged_prefill_attention(&p, &q, 5, &pages, 4)),
        ("too few pages", engine.paged_prefill_attention(&p, &q, 5, &pages[..1], 5)),
        ("page id", engine.paged_prefill_attention(&p, &q, 5, &[pages[0], 77], 5)),
        ("num_q_heads", engine.paged_prefill_attention(&AttentionParams::new(3), &q[..5 * 3 * HEAD_DIM], 5, &pages, 5)),
        ("num_q_heads 0", engine.paged_prefill_attention(&AttentionParams::default(), &[], 5, &pages, 5)),
        ("layer", engine.paged_prefill_attention(&params(5), &q, 5, &pages, 5)),
        ("NaN q", engine.paged_prefill_attention(&p, &nan_q, 5, &pages, 5)),
    ];
    for (what, result) in cases {
        let err = result.expect_err(what);
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{}: {}", what, err);
    }
    let mut out = vec![0.0f32; q.len() - 1];
    let err = engine.paged_prefill_attention_into(&mut out, &p, &q, 5, &pages, 5).unwrap_err();
    assert!(err.message().contains("out has"), "{}", err);

    // A pool without KV bytes.
    let mut none = Engine::new(&EngineOptions { memory: MemoryKind::None, ..EngineOptions::new(4) }).unwrap();
    assert_eq!(none.write_kv(0, &[], &[], &[]).unwrap_err().code(), ErrorCode::FailedPrecondition);
    assert_eq!(none.gather_pages(&[]).unwrap_err().code(), ErrorCode::FailedPrecondition);
}

/// The f32 K of token `row` of one page, layer `layer`, as the documented
/// layout puts it in a page buffer.
fn k_row(page_bytes: &[u8], layer_bytes: usize, layer: usize, row: usize) -> Vec<f32> {
    let start = layer * layer_bytes + row * ROW * 4;
    page_bytes[start..start + ROW * 4].chunks(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

#[test]
fn gather_scatter_and_copy_move_whole_pages() {
    let mut rng = Rng::new(14);
    let mut a = engine(16);
    let seq = a.admit(&(0..8).collect::<Vec<i32>>()).unwrap();
    let mut kv = Kv::default();
    kv.append_and_write(&mut rng, &mut a, &seq, 1, 8);
    let pages = seq.page_table();
    assert_eq!(pages.len(), 2);
    let layout = a.kv_layout().unwrap();

    let packed = a.gather_pages(&pages).unwrap();
    assert_eq!(packed.len(), 2 * layout.page_bytes);
    assert_eq!(a.page_buffer_len(2), Some(packed.len()));
    for t in 0..8 {
        let page = &packed[(t / PAGE) * layout.page_bytes..][..layout.page_bytes];
        assert_eq!(k_row(page, layout.layer_bytes, 1, t % PAGE), &kv.k[t * ROW..(t + 1) * ROW], "token {}", t);
    }

    // Scatter into another engine's pages, gather back: the same bytes.
    let mut b = engine(16);
    let other = b.admit(&(50..58).collect::<Vec<i32>>()).unwrap();
    let b_pages = other.page_table();
    b.scatter_pages(&b_pages, &packed).unwrap();
    assert_eq!(b.gather_pages(&b_pages).unwrap(), packed);
    // And attention over b's copy gives what a's pages give.
    let q = rng.vec(8 * Q_HEADS * HEAD_DIM, 1.0);
    let from_a = a.paged_prefill_attention(&params(1), &q, 8, &pages, 8).unwrap();
    let from_b = b.paged_prefill_attention(&params(1), &q, 8, &b_pages, 8).unwrap();
    assert_eq!(from_a, from_b);

    // copy_pages between engines, in reverse order, and within one engine.
    let mut c = engine(16);
    let third = c.admit(&(70..78).collect::<Vec<i32>>()).unwrap();
    let c_pages = third.page_table();
    c.copy_pages_from(&[c_pages[1], c_pages[0]], &a, &pages).unwrap();
    let copied = c.gather_pages(&c_pages).unwrap();
    assert_eq!(&copied[..layout.page_bytes], &packed[layout.page_bytes..]);
    assert_eq!(&copied[layout.page_bytes..], &packed[..layout.page_bytes]);
    c.copy_pages_within(&[c_pages[0]], &[c_pages[1]]).unwrap();
    let within = c.gather_pages(&c_pages).unwrap();
    assert_eq!(&within[..layout.page_bytes], &within[layout.page_bytes..]);

    // Bad input.
    let mut small = vec![0u8; packed.len() - 1];
    let err = a.gather_pages_into(&mut small, &pages).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.message().contains("buffer"), "{}", err);
    let err = b.scatter_pages(&b_pages, &packed[1..]).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    let err = b.scatter_pages(&[b_pages[0], 99], &packed).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{}", err);
    assert_eq!(b.gather_pages(&b_pages).unwrap(), packed, "a failed scatter changed the pool");
    let err = c.copy_pages_from(&c_pages, &a, &pages[..1]).unwrap_err();
    assert!(err.message().contains("src_pages"), "{}", err);
    let other_layout = Engine::new(&EngineOptions {
        page_size: PAGE as i32,
        num_layers: 1,
        kv_heads: KV_HEADS as i32,
        head_dim: HEAD_DIM as i32,
        kv_dtype: KvDtype::F32,
        memory: MemoryKind::Host,
        ..EngineOptions::new(4)
    })
    .unwrap();
    let err = c.copy_pages_from(&c_pages[..1], &other_layout, &[0]).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{}", err);
}

#[test]
fn bf16_pools_round_to_nearest_even() {
    let mut engine = Engine::new(&EngineOptions {
        page_size: PAGE as i32,
        kv_heads: 1,
        head_dim: 2,
        kv_dtype: KvDtype::Bf16,
        memory: MemoryKind::Host,
        ..EngineOptions::new(4)
    })
    .unwrap();
    let seq = engine.admit(&[1]).unwrap();
    // 1 + 2^-8 is halfway between two bf16 values: rounds to even (1.0);
    // 1 + 3 * 2^-8 rounds up to 1 + 2^-6.
    let k = [1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0];
    engine.write_kv(0, seq.slots(), &k, &[0.0, -2.0]).unwrap();
    let packed = engine.gather_pages(&seq.page_table()).unwrap();
    let layout = engine.kv_layout().unwrap();
    let row = (seq.slots()[0] as usize) % PAGE;
    let bits = |offset: usize| u16::from_le_bytes([packed[offset], packed[offset + 1]]);
    assert_eq!(bits(row * 4), 0x3f80);
    assert_eq!(bits(row * 4 + 2), 0x3f82);
    let v = layout.layer_bytes / 2 + row * 4;
    assert_eq!((bits(v), bits(v + 2)), (0x0000, 0xc000));
}

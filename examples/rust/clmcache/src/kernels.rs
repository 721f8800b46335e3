//! Attention and KV kernels over the engine's pool (clm.h, docs/kernels.md),
//! for a host that brings its own weights: write the K/V of new tokens into
//! the pool, and attend over a sequence's pages (the reused prefix and the
//! new tokens) without writing paged kernels.
//!
//! Shapes (row-major f32; the KV is in the pool's dtype): `k`, `v`
//! `[n_slots][kv_heads][head_dim]`; prefill `q`, `out`
//! `[n_new][num_q_heads][head_dim]`; decode `q`, `out`
//! `[n_seqs][num_q_heads][head_dim]`. Grouped-query attention: q head `h`
//! reads kv head `h / (num_q_heads / kv_heads)`.
//!
//! These take host slices, so they run on host pools ([`MemoryKind::Host`],
//! the CPU kernels, synchronous). A device pool is
//! [`ErrorCode::Unsupported`] here: its kernels take device pointers and run
//! asynchronously on a CUDA stream, which Rust slices cannot express; use the
//! raw `sys` functions for it. A pool without KV bytes ([`MemoryKind::None`])
//! is [`ErrorCode::FailedPrecondition`].
//!
//! Borrowing follows the pool: the calls that write it (`write_kv`,
//! `scatter_pages`, `copy_pages_*`) take `&mut self`, the ones that read it
//! `&self`, so no write can race with another call on the same pool. Pass
//! only pages the host holds ([`Sequence::page_table`](crate::Sequence::page_table),
//! [`Engine::batch_page_table`], [`Sequence::slots`](crate::Sequence::slots)):
//! the library checks page ids against the pool, not against sequences, and
//! cached prefix pages are shared (read them, never write them).
use std::mem::{size_of, MaybeUninit};
use std::os::raw::c_void;
use std::ptr;

use crate::clm::{expect_len, invalid};
use crate::{check, sys, Engine, Error, ErrorCode, MemoryKind, PagedBatch, Result};

/// Attention settings (`clm_attention_params`). Defaults come from
/// `clm_attention_params_init`; `num_q_heads` has none.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    /// In `[0, num_layers)`.
    pub layer: i32,
    /// A positive multiple of the pool's `kv_heads` (required).
    pub num_q_heads: i32,
    /// 0 = `1 / sqrt(head_dim)`.
    pub softmax_scale: f32,
    /// > 0: a query at position p sees keys in `(p - window, p]`; 0 = all.
    pub sliding_window: i32,
    /// CPU threads; 0 = every hardware thread.
    pub num_threads: i32,
}

impl AttentionParams {
    /// The library's defaults with `num_q_heads` query heads.
    pub fn new(num_q_heads: i32) -> AttentionParams {
        AttentionParams { num_q_heads, ..AttentionParams::default() }
    }

    /// The library's defaults (`clm_attention_params_init`).
    pub fn library_defaults() -> Result<AttentionParams> {
        let raw = raw_attention_params()?;
        Ok(AttentionParams {
            layer: raw.layer,
            num_q_heads: raw.num_q_heads,
            softmax_scale: raw.softmax_scale,
            sliding_window: raw.sliding_window,
            num_threads: raw.num_threads,
        })
    }

    /// The C struct (on the default stream).
    pub fn to_raw(&self) -> Result<sys::clm_attention_params> {
        let mut raw = raw_attention_params()?;
        raw.layer = self.layer;
        raw.num_q_heads = self.num_q_heads;
        raw.softmax_scale = self.softmax_scale;
        raw.sliding_window = self.sliding_window;
        raw.num_threads = self.num_threads;
        raw.stream = ptr::null_mut();
        Ok(raw)
    }
}

impl Default for AttentionParams {
    /// The library's defaults (`num_q_heads` 0, which the library rejects).
    ///
    /// # Panics
    /// On a library/bindings version skew, as [`crate::EngineOptions::default`].
    fn default() -> AttentionParams {
        match AttentionParams::library_defaults() {
            Ok(params) => params,
            Err(e) => panic!("clmcache: clm_attention_params_init failed: {}", e),
        }
    }
}

fn raw_attention_params() -> Result<sys::clm_attention_params> {
    let mut raw = MaybeUninit::<sys::clm_attention_params>::zeroed();
    // SAFETY: raw is a zeroed (valid: NULL stream) struct of exactly the size passed.
    check(unsafe { sys::clm_attention_params_init(raw.as_mut_ptr(), size_of::<sys::clm_attention_params>()) })?;
    // SAFETY: zeroed is a valid value of this plain-data struct, and init filled it.
    Ok(unsafe { raw.assume_init() })
}

fn ptr_or_null<T>(values: &[T]) -> *const T {
    if values.is_empty() {
        ptr::null()
    } else {
        values.as_ptr()
    }
}

fn to_i32(function: &str, name: &str, value: usize) -> Result<i32> {
    if value > i32::MAX as usize {
        return Err(invalid(function, format!("{} {} does not fit in an i32", name, value)));
    }
    Ok(value as i32)
}

impl Engine {
    /// Host pools only (see the module's documentation).
    fn host_pool(&self, function: &str) -> Result<()> {
        if self.layout.memory == MemoryKind::Device {
            return Err(Error::new(
                ErrorCode::Unsupported,
                format!(
                    "{}: the engine's pool is in device memory; the safe wrapper's kernels take host slices \
                     (use clmcache::sys with device pointers and a stream)",
                    function
                ),
            ));
        }
        Ok(())
    }

    /// `rows * heads * head_dim`, the length of an activation buffer.
    fn activation_len(&self, function: &str, rows: usize, heads: i32) -> Result<usize> {
        if heads < 1 {
            return Err(invalid(function, format!("num_q_heads {} must be a positive multiple of kv_heads", heads)));
        }
        rows.checked_mul(heads as usize)
            .and_then(|n| n.checked_mul(self.layout.head_dim.max(0) as usize))
            .ok_or_else(|| invalid(function, format!("{} rows x {} heads overflows", rows, heads)))
    }

    /// `q` and `out` of an attention call must each hold `rows` x
    /// `num_q_heads` x `head_dim` floats (`shape` names that in errors).
    fn check_q_and_out(
        &self,
        function: &str,
        rows: usize,
        heads: i32,
        q: &[f32],
        out: &[f32],
        shape: &str,
    ) -> Result<()> {
        let n = self.activation_len(function, rows, heads)?;
        expect_len(function, "q", q.len(), n, shape)?;
        expect_len(function, "out", out.len(), n, shape)
    }

    /// Writes the K/V rows of one layer into the pool (`clm_engine_write_kv`):
    /// row `i` of `k` and `v` (each `[slots.len()][kv_heads][head_dim]`) goes
    /// to `slots[i]`, converted to the pool's dtype (round to nearest even).
    pub fn write_kv(&mut self, layer: i32, slots: &[i64], k: &[f32], v: &[f32]) -> Result<()> {
        const F: &str = "clm_engine_write_kv";
        self.host_pool(F)?;
        let n = self.activation_len(F, slots.len(), self.layout.kv_heads)?;
        expect_len(F, "k", k.len(), n, "[n_slots][kv_heads][head_dim]")?;
        expect_len(F, "v", v.len(), n, "[n_slots][kv_heads][head_dim]")?;
        // SAFETY: slots holds n_slots ids, k and v kv_len floats each; the pool
        // is exclusively borrowed (no other call reads or writes it now).
        check(unsafe {
            sys::clm_engine_write_kv(
                self.as_raw(),
                layer,
                ptr_or_null(slots),
                slots.len(),
                ptr_or_null(k),
                ptr_or_null(v),
                k.len(),
                ptr::null_mut(),
            )
        })
    }

    /// Causal attention of the last `n_new` tokens of a sequence of `kv_len`
    /// tokens whose K/V is all written, in `pages` (at least
    /// `ceil(kv_len / page_size)` ids: [`Sequence::page_table`](crate::Sequence::page_table)),
    /// into `out` (`clm_engine_paged_prefill_attention`). `q` and `out`:
    /// `[n_new][num_q_heads][head_dim]`.
    pub fn paged_prefill_attention_into(
        &self,
        out: &mut [f32],
        params: &AttentionParams,
        q: &[f32],
        n_new: usize,
        pages: &[i32],
        kv_len: usize,
    ) -> Result<()> {
        const F: &str = "clm_engine_paged_prefill_attention";
        self.host_pool(F)?;
        let n_new_i32 = to_i32(F, "n_new", n_new)?;
        let kv_len_i32 = to_i32(F, "kv_len", kv_len)?;
        self.check_q_and_out(F, n_new, params.num_q_heads, q, out, "[n_new][num_q_heads][head_dim]")?;
        let raw = params.to_raw()?;
        // SAFETY: out is exclusively borrowed (so it cannot overlap q) and
        // holds out_len floats, q q_len, pages n_pages ids; raw lives across
        // the call.
        check(unsafe {
            sys::clm_engine_paged_prefill_attention(
                out.as_mut_ptr(),
                out.len(),
                self.as_raw(),
                &raw,
                ptr_or_null(q),
                q.len(),
                n_new_i32,
                ptr_or_null(pages),
                pages.len(),
                kv_len_i32,
            )
        })
    }

    /// [`Engine::paged_prefill_attention_into`] into a new vector.
    pub fn paged_prefill_attention(
        &self,
        params: &AttentionParams,
        q: &[f32],
        n_new: usize,
        pages: &[i32],
        kv_len: usize,
    ) -> Result<Vec<f32>> {
        let mut out = vec![0.0f32; q.len()];
        self.paged_prefill_attention_into(&mut out, params, q, n_new, pages, kv_len)?;
        Ok(out)
    }

    /// Attention of one query per sequence (its last token) over its pages,
    /// for a ragged batch in FlashInfer's CSR form as
    /// [`Engine::batch_page_table`] gives it, into `out`
    /// (`clm_engine_paged_decode_attention`). `q` and `out`:
    /// `[n_seqs][num_q_heads][head_dim]`.
    pub fn paged_decode_attention_into(
        &self,
        out: &mut [f32],
        params: &AttentionParams,
        q: &[f32],
        batch: &PagedBatch,
    ) -> Result<()> {
        const F: &str = "clm_engine_paged_decode_attention";
        self.host_pool(F)?;
        let n_seqs = batch.last_page_len.len();
        expect_len(F, "batch.indptr", batch.indptr.len(), n_seqs + 1, "batch.last_page_len.len() + 1")?;
        self.check_q_and_out(F, n_seqs, params.num_q_heads, q, out, "[n_seqs][num_q_heads][head_dim]")?;
        let raw = params.to_raw()?;
        // SAFETY: indptr holds n_seqs + 1 entries, last_page_len n_seqs,
        // indices n_indices, q and out their lengths (out exclusively
        // borrowed); raw lives across the call.
        check(unsafe {
            sys::clm_engine_paged_decode_attention(
                out.as_mut_ptr(),
                out.len(),
                self.as_raw(),
                &raw,
                ptr_or_null(q),
                q.len(),
                batch.indptr.as_ptr(),
                ptr_or_null(&batch.indices),
                batch.indices.len(),
                ptr_or_null(&batch.last_page_len),
                n_seqs,
            )
        })
    }

    /// [`Engine::paged_decode_attention_into`] into a new vector.
    pub fn paged_decode_attention(&self, params: &AttentionParams, q: &[f32], batch: &PagedBatch) -> Result<Vec<f32>> {
        let mut out = vec![0.0f32; q.len()];
        self.paged_decode_attention_into(&mut out, params, q, batch)?;
        Ok(out)
    }

    /// Copies whole pages (every layer) from another engine's pool of the
    /// same layout: `dst_pages[i] <- src.src_pages[i]`, pair by pair in order
    /// (`clm_engine_copy_pages`).
    pub fn copy_pages_from(&mut self, dst_pages: &[i32], src: &Engine, src_pages: &[i32]) -> Result<()> {
        const F: &str = "clm_engine_copy_pages";
        self.host_pool(F)?;
        src.host_pool(F)?;
        expect_len(F, "src_pages", src_pages.len(), dst_pages.len(), "one per dst page")?;
        // SAFETY: both arrays hold n_pages ids; self is exclusively borrowed,
        // and src is a different engine (it cannot alias &mut self).
        check(unsafe {
            sys::clm_engine_copy_pages(
                self.as_raw(),
                ptr_or_null(dst_pages),
                src.as_raw(),
                ptr_or_null(src_pages),
                dst_pages.len(),
                ptr::null_mut(),
            )
        })
    }

    /// Copies whole pages within this engine's pool: `dst_pages[i] <-
    /// src_pages[i]` (`clm_engine_copy_pages` with dst == src).
    pub fn copy_pages_within(&mut self, dst_pages: &[i32], src_pages: &[i32]) -> Result<()> {
        const F: &str = "clm_engine_copy_pages";
        self.host_pool(F)?;
        expect_len(F, "src_pages", src_pages.len(), dst_pages.len(), "one per dst page")?;
        let raw = self.as_raw();
        // SAFETY: as copy_pages_from, with one exclusively borrowed engine.
        check(unsafe {
            sys::clm_engine_copy_pages(
                raw,
                ptr_or_null(dst_pages),
                raw,
                ptr_or_null(src_pages),
                dst_pages.len(),
                ptr::null_mut(),
            )
        })
    }

    /// The number of bytes `n_pages` whole pages take in a page buffer.
    pub fn page_buffer_len(&self, n_pages: usize) -> Option<usize> {
        n_pages.checked_mul(self.layout.page_bytes)
    }

    fn page_buffer(&self, function: &str, len: usize, n_pages: usize) -> Result<()> {
        match self.page_buffer_len(n_pages) {
            Some(needed) if len >= needed => Ok(()),
            needed => Err(invalid(
                function,
                format!(
                    "buffer has {} bytes; {} pages of {} bytes need {:?}",
                    len, n_pages, self.layout.page_bytes, needed
                ),
            )),
        }
    }

    /// Packs `pages` (every layer) into `buffer`, at least
    /// [`Engine::page_buffer_len`] bytes (`clm_engine_gather_pages`).
    pub fn gather_pages_into(&self, buffer: &mut [u8], pages: &[i32]) -> Result<()> {
        const F: &str = "clm_engine_gather_pages";
        self.host_pool(F)?;
        self.page_buffer(F, buffer.len(), pages.len())?;
        // SAFETY: buffer is exclusively borrowed and holds buffer_len bytes,
        // pages n_pages ids.
        check(unsafe {
            sys::clm_engine_gather_pages(
                buffer.as_mut_ptr() as *mut c_void,
                buffer.len(),
                self.as_raw(),
                ptr_or_null(pages),
                pages.len(),
                ptr::null_mut(),
            )
        })
    }

    /// [`Engine::gather_pages_into`] a new vector of exactly
    /// `pages.len() * page_bytes` bytes.
    pub fn gather_pages(&self, pages: &[i32]) -> Result<Vec<u8>> {
        let len = self
            .page_buffer_len(pages.len())
            .ok_or_else(|| invalid("clm_engine_gather_pages", format!("{} pages overflow", pages.len())))?;
        let mut buffer = vec![0u8; len];
        self.gather_pages_into(&mut buffer, pages)?;
        Ok(buffer)
    }

    /// Unpacks `buffer` (as [`Engine::gather_pages`] packs it) into `pages`
    /// (`clm_engine_scatter_pages`).
    pub fn scatter_pages(&mut self, pages: &[i32], buffer: &[u8]) -> Result<()> {
        const F: &str = "clm_engine_scatter_pages";
        self.host_pool(F)?;
        self.page_buffer(F, buffer.len(), pages.len())?;
        // SAFETY: buffer holds buffer_len bytes, pages n_pages ids; the pool
        // is exclusively borrowed.
        check(unsafe {
            sys::clm_engine_scatter_pages(
                self.as_raw(),
                ptr_or_null(pages),
                pages.len(),
                ptr_or_null(buffer) as *const c_void,
                buffer.len(),
                ptr::null_mut(),
            )
        })
    }
}

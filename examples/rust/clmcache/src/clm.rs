//! CLM suffix reuse (clm.h, docs/clm.md): the SRC head, which scores per
//! running sequence and step how likely the current suffix repeats an earlier
//! one, and semantic snapshots (a PCA projection of a hidden state, and the
//! adapter that injects one back).
//!
//! Every call checks the lengths of its slices on the Rust side first (an
//! [`ErrorCode::InvalidArgument`] that names the argument), so the library
//! never reads or writes past a slice; the library then checks the values.
use std::ffi::CString;
use std::mem::{size_of, MaybeUninit};
use std::os::raw::c_void;
use std::path::Path;
use std::ptr;

use crate::{check, sys, Engine, Error, ErrorCode, Result, Sequence};

raw_enum!(
    /// The GELU of the SRC head's hidden layer (`CLM_GELU_*`).
    Gelu {
        /// `0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))`.
        Tanh = sys::CLM_GELU_TANH,
        /// `0.5x(1 + erf(x / sqrt(2)))`.
        Erf = sys::CLM_GELU_ERF,
    }
);

raw_enum!(
    /// Element type of activations: hidden states, attention outputs (`CLM_DTYPE_*`).
    ActDtype {
        F32 = sys::CLM_DTYPE_F32,
        /// IEEE half, as its 16 bits.
        F16 = sys::CLM_DTYPE_F16,
        /// bfloat16, as its 16 bits.
        Bf16 = sys::CLM_DTYPE_BF16,
    }
);

/// Rows of activations `[n_rows][hidden]`, row-major, in one of the library's
/// element types. f16 and bf16 travel as their bit patterns (`u16`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activations<'a> {
    F32(&'a [f32]),
    F16(&'a [u16]),
    Bf16(&'a [u16]),
}

impl<'a> Activations<'a> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Activations::F32(x) => x.len(),
            Activations::F16(x) | Activations::Bf16(x) => x.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn dtype(&self) -> ActDtype {
        match self {
            Activations::F32(_) => ActDtype::F32,
            Activations::F16(_) => ActDtype::F16,
            Activations::Bf16(_) => ActDtype::Bf16,
        }
    }

    fn as_ptr(&self) -> *const c_void {
        match self {
            Activations::F32(x) => x.as_ptr() as *const c_void,
            Activations::F16(x) | Activations::Bf16(x) => x.as_ptr() as *const c_void,
        }
    }
}

impl<'a> From<&'a [f32]> for Activations<'a> {
    fn from(rows: &'a [f32]) -> Self {
        Activations::F32(rows)
    }
}

impl<'a> From<&'a Vec<f32>> for Activations<'a> {
    fn from(rows: &'a Vec<f32>) -> Self {
        Activations::F32(rows)
    }
}

/// Rows of activations updated in place (see [`Activations`]).
#[derive(Debug, PartialEq)]
pub enum ActivationsMut<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [u16]),
    Bf16(&'a mut [u16]),
}

impl<'a> ActivationsMut<'a> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            ActivationsMut::F32(x) => x.len(),
            ActivationsMut::F16(x) | ActivationsMut::Bf16(x) => x.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn dtype(&self) -> ActDtype {
        match self {
            ActivationsMut::F32(_) => ActDtype::F32,
            ActivationsMut::F16(_) => ActDtype::F16,
            ActivationsMut::Bf16(_) => ActDtype::Bf16,
        }
    }

    fn as_mut_ptr(&mut self) -> *mut c_void {
        match self {
            ActivationsMut::F32(x) => x.as_mut_ptr() as *mut c_void,
            ActivationsMut::F16(x) | ActivationsMut::Bf16(x) => x.as_mut_ptr() as *mut c_void,
        }
    }
}

impl<'a> From<&'a mut [f32]> for ActivationsMut<'a> {
    fn from(rows: &'a mut [f32]) -> Self {
        ActivationsMut::F32(rows)
    }
}

impl<'a> From<&'a mut Vec<f32>> for ActivationsMut<'a> {
    fn from(rows: &'a mut Vec<f32>) -> Self {
        ActivationsMut::F32(rows)
    }
}

/// The SRC head's weights in host memory, row-major f32:
/// `sigmoid(w2 . GELU(w1 h + b1) + b2)`, `w1` `[hidden/4][hidden]`, `b1` and
/// `w2` `[hidden/4]`. `hidden` must be a positive multiple of 4.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SrcHeadWeights<'a> {
    pub hidden: i32,
    pub w1: &'a [f32],
    pub b1: &'a [f32],
    pub w2: &'a [f32],
    pub b2: f32,
}

/// One sequence's outcome of an SRC step (`clm_src_decision`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SrcDecision {
    /// SRC in [0, 1]; 0 when not scored.
    pub score: f32,
    /// The threshold it was compared with.
    pub threshold: f32,
    /// False while the sequence has no non-special row yet.
    pub scored: bool,
    /// Look up a snapshot and inject it (then report with
    /// [`Engine::report_retrieval`]).
    pub reuse: bool,
    /// The breaker switched this sequence off for good.
    pub baseline: bool,
}

impl From<sys::clm_src_decision> for SrcDecision {
    fn from(d: sys::clm_src_decision) -> SrcDecision {
        SrcDecision {
            score: d.score,
            threshold: d.threshold,
            scored: d.scored != 0,
            reuse: d.reuse != 0,
            baseline: d.baseline != 0,
        }
    }
}

/// How the snapshot adapter injects (`clm_adapter_options`). Defaults come
/// from `clm_adapter_options_init`; `num_layers` has none.
#[derive(Clone, Debug, PartialEq)]
pub struct AdapterOptions {
    /// The model's layer count (required, >= 1).
    pub num_layers: i32,
    /// Layers that inject; empty = the last 3.
    pub layers: Vec<i32>,
    /// The injection adds `residual_scale * (W s + b)`.
    pub residual_scale: f32,
}

impl AdapterOptions {
    /// The library's defaults for a model of `num_layers` layers.
    pub fn new(num_layers: i32) -> AdapterOptions {
        AdapterOptions { num_layers, ..AdapterOptions::default() }
    }

    /// The library's defaults (`clm_adapter_options_init`), or the error it
    /// gives when it does not know this wrapper's struct size.
    pub fn library_defaults() -> Result<AdapterOptions> {
        let raw = raw_adapter_options()?;
        Ok(AdapterOptions { num_layers: raw.num_layers, layers: Vec::new(), residual_scale: raw.residual_scale })
    }

    /// The C struct; it borrows `layers`, so it must not outlive `self`.
    pub fn to_raw(&self) -> Result<sys::clm_adapter_options> {
        let mut raw = raw_adapter_options()?;
        raw.num_layers = self.num_layers;
        raw.layers = if self.layers.is_empty() { ptr::null() } else { self.layers.as_ptr() };
        raw.n_layers = self.layers.len();
        raw.residual_scale = self.residual_scale;
        Ok(raw)
    }
}

impl Default for AdapterOptions {
    /// The library's defaults (`num_layers` 0, which the library rejects).
    ///
    /// # Panics
    /// On a library/bindings version skew, as [`crate::EngineOptions::default`].
    fn default() -> AdapterOptions {
        match AdapterOptions::library_defaults() {
            Ok(options) => options,
            Err(e) => panic!("clmcache: clm_adapter_options_init failed: {}", e),
        }
    }
}

fn raw_adapter_options() -> Result<sys::clm_adapter_options> {
    let mut raw = MaybeUninit::<sys::clm_adapter_options>::zeroed();
    // SAFETY: raw is a zeroed (valid: NULL layers) struct of exactly the size passed.
    check(unsafe { sys::clm_adapter_options_init(raw.as_mut_ptr(), size_of::<sys::clm_adapter_options>()) })?;
    // SAFETY: zeroed is a valid value of this plain-data struct, and init filled it.
    Ok(unsafe { raw.assume_init() })
}

// ---- helpers --------------------------------------------------------------------

/// An [`ErrorCode::InvalidArgument`] raised on the Rust side, before any call.
pub(crate) fn invalid(function: &str, message: String) -> Error {
    Error::new(ErrorCode::InvalidArgument, format!("{}: {}", function, message))
}

/// `len == expected`, else an error naming the argument.
pub(crate) fn expect_len(function: &str, name: &str, len: usize, expected: usize, why: &str) -> Result<()> {
    if len == expected {
        Ok(())
    } else {
        Err(invalid(function, format!("{} has {} elements; {} needs {}", name, len, why, expected)))
    }
}

/// The number of rows of `[n][hidden]` activations of `len` elements.
fn rows_of(function: &str, name: &str, len: usize, hidden: i32) -> Result<usize> {
    if hidden < 1 {
        return Err(invalid(function, format!("hidden must be >= 1, got {}", hidden)));
    }
    let hidden = hidden as usize;
    if len % hidden != 0 {
        return Err(invalid(function, format!("{} has {} elements, not a multiple of hidden {}", name, len, hidden)));
    }
    Ok(len / hidden)
}

/// `a * b`, or an error when it overflows.
pub(crate) fn product(function: &str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b).ok_or_else(|| invalid(function, format!("{} x {} overflows", a, b)))
}

pub(crate) fn path_cstring(function: &str, path: &Path) -> Result<CString> {
    #[cfg(unix)]
    let bytes = {
        use std::os::unix::ffi::OsStrExt;
        path.as_os_str().as_bytes().to_vec()
    };
    #[cfg(not(unix))]
    let bytes = match path.to_str() {
        Some(s) => s.as_bytes().to_vec(),
        None => return Err(invalid(function, format!("path {:?} is not valid Unicode", path))),
    };
    CString::new(bytes).map_err(|_| invalid(function, format!("path {:?} contains a NUL byte", path)))
}

pub(crate) fn handles(seqs: &[&Sequence]) -> Vec<*mut sys::clm_seq> {
    seqs.iter().map(|s| s.as_raw()).collect()
}

pub(crate) fn flags(values: &[bool]) -> Vec<u8> {
    values.iter().map(|&v| v as u8).collect()
}

pub(crate) fn null_if_empty<T>(values: &[T]) -> *const T {
    if values.is_empty() {
        ptr::null()
    } else {
        values.as_ptr()
    }
}

// ---- the SRC head -------------------------------------------------------------------

impl Engine {
    /// Installs the SRC head from host memory (`clm_engine_set_src_head`,
    /// copied), replacing any earlier one.
    pub fn set_src_head(&self, weights: &SrcHeadWeights<'_>, gelu: Gelu) -> Result<()> {
        const F: &str = "clm_engine_set_src_head";
        let hidden = weights.hidden;
        if hidden < 4 || hidden % 4 != 0 {
            return Err(invalid(F, format!("hidden must be a positive multiple of 4, got {}", hidden)));
        }
        let inner = hidden as usize / 4;
        expect_len(F, "w1", weights.w1.len(), product(F, inner, hidden as usize)?, "[hidden/4][hidden]")?;
        expect_len(F, "b1", weights.b1.len(), inner, "[hidden/4]")?;
        expect_len(F, "w2", weights.w2.len(), inner, "[hidden/4]")?;
        // SAFETY: each array holds exactly what `hidden` makes the library
        // read (checked above); it copies them.
        check(unsafe {
            sys::clm_engine_set_src_head(
                self.as_raw(),
                hidden,
                weights.w1.as_ptr(),
                weights.b1.as_ptr(),
                weights.w2.as_ptr(),
                weights.b2,
                gelu.raw(),
            )
        })
    }

    /// Loads the SRC head from a safetensors file (`src_head.w1`, `.b1`,
    /// `.w2`, `.b2`; `clm_engine_load_src_head`), replacing any earlier one.
    /// A file whose `gelu` metadata names another form than `gelu` is refused
    /// (the earlier head stays).
    pub fn load_src_head(&self, path: impl AsRef<Path>, gelu: Gelu) -> Result<()> {
        let path = path_cstring("clm_engine_load_src_head", path.as_ref())?;
        // SAFETY: path is NUL-terminated and lives across the call.
        check(unsafe { sys::clm_engine_load_src_head(self.as_raw(), path.as_ptr(), gelu.raw()) })
    }

    /// [`Engine::load_src_head`] with the GELU the file names in its `gelu`
    /// metadata, as `clm_fit` writes it (`CLM_GELU_FROM_FILE`); a file that
    /// names none is refused.
    pub fn load_src_head_as_trained(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path_cstring("clm_engine_load_src_head", path.as_ref())?;
        // SAFETY: path is NUL-terminated and lives across the call.
        check(unsafe { sys::clm_engine_load_src_head(self.as_raw(), path.as_ptr(), sys::CLM_GELU_FROM_FILE) })
    }

    /// One SRC step over a ragged batch (`clm_engine_src_step`):
    /// `attn_out` `[n_rows][hidden]` holds the new rows of one layer's
    /// attention output, `seqs[i]` owning rows `indptr[i]..indptr[i + 1]`
    /// (`indptr` has `seqs.len() + 1` entries; 0 rows is allowed), and
    /// `token_ids[n_rows]` their ids. The engine keeps each sequence's
    /// running mean over non-special rows, so a step passes only new rows.
    /// Nothing changes on error.
    pub fn src_step(
        &self,
        seqs: &[&Sequence],
        attn_out: Activations<'_>,
        hidden: i32,
        token_ids: &[i32],
        indptr: &[i32],
    ) -> Result<Vec<SrcDecision>> {
        const F: &str = "clm_engine_src_step";
        let n_rows = rows_of(F, "attn_out", attn_out.len(), hidden)?;
        expect_len(F, "token_ids", token_ids.len(), n_rows, "one per row of attn_out")?;
        expect_len(F, "indptr", indptr.len(), seqs.len() + 1, "seqs.len() + 1")?;
        let handles = handles(seqs);
        let mut raw = vec![sys::clm_src_decision::default(); seqs.len()];
        // SAFETY: decisions and handles hold n_seqs entries, indptr n_seqs + 1,
        // attn_out n_rows * hidden elements of its dtype and token_ids n_rows
        // (checked above); the sequences are live and, being !Sync, used by no
        // other thread meanwhile.
        check(unsafe {
            sys::clm_engine_src_step(
                raw.as_mut_ptr(),
                self.as_raw(),
                null_if_empty(&handles),
                handles.len(),
                attn_out.as_ptr(),
                attn_out.dtype().raw(),
                n_rows,
                hidden,
                token_ids.as_ptr(),
                indptr.as_ptr(),
            )
        })?;
        Ok(raw.into_iter().map(SrcDecision::from).collect())
    }

    /// Whether each snapshot lookup the last step asked for found one
    /// (`clm_engine_report_retrieval`). After `src_breaker_steps` failed
    /// lookups in a row at scores above `src_breaker_score` a sequence falls
    /// back to baseline mode.
    pub fn report_retrieval(&self, seqs: &[&Sequence], found: &[bool]) -> Result<()> {
        const F: &str = "clm_engine_report_retrieval";
        expect_len(F, "found", found.len(), seqs.len(), "one per sequence")?;
        let handles = handles(seqs);
        let found = flags(found);
        // SAFETY: both arrays hold n_seqs entries; the sequences are live.
        check(unsafe {
            sys::clm_engine_report_retrieval(
                self.as_raw(),
                null_if_empty(&handles),
                handles.len(),
                null_if_empty(&found),
            )
        })
    }

    // ---- snapshots ------------------------------------------------------------------

    /// Installs the snapshot projection from host memory
    /// (`clm_engine_set_snapshot_projection`, copied): `mean` `[hidden]`,
    /// `components` `[snapshot_dim][hidden]` with orthonormal rows.
    pub fn set_snapshot_projection(
        &self,
        hidden: i32,
        snapshot_dim: i32,
        mean: &[f32],
        components: &[f32],
    ) -> Result<()> {
        const F: &str = "clm_engine_set_snapshot_projection";
        if hidden < 1 || snapshot_dim < 1 {
            return Err(invalid(F, format!("hidden {} and snapshot_dim {} must be >= 1", hidden, snapshot_dim)));
        }
        expect_len(F, "mean", mean.len(), hidden as usize, "[hidden]")?;
        let n = product(F, snapshot_dim as usize, hidden as usize)?;
        expect_len(F, "components", components.len(), n, "[snapshot_dim][hidden]")?;
        // SAFETY: the arrays hold what the dimensions say (checked); copied.
        check(unsafe {
            sys::clm_engine_set_snapshot_projection(
                self.as_raw(),
                hidden,
                snapshot_dim,
                mean.as_ptr(),
                components.as_ptr(),
            )
        })
    }

    /// Loads the snapshot projection (`snapshot.mean`, `snapshot.components`)
    /// from a safetensors file (`clm_engine_load_snapshot_projection`).
    pub fn load_snapshot_projection(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path_cstring("clm_engine_load_snapshot_projection", path.as_ref())?;
        // SAFETY: path is NUL-terminated and lives across the call.
        check(unsafe { sys::clm_engine_load_snapshot_projection(self.as_raw(), path.as_ptr()) })
    }

    /// Snapshots of `rows` `[n_rows][hidden]` into `out` `[n_rows][snapshot_dim]`
    /// (`clm_engine_make_snapshots`): `normalize(components (x - mean))`.
    pub fn make_snapshots_into(&self, rows: Activations<'_>, hidden: i32, out: &mut [f32]) -> Result<()> {
        const F: &str = "clm_engine_make_snapshots";
        let n_rows = rows_of(F, "rows", rows.len(), hidden)?;
        if n_rows > 0 && out.len() % n_rows != 0 {
            return Err(invalid(F, format!("out has {} floats, not a multiple of the {} rows", out.len(), n_rows)));
        }
        // SAFETY: out is writable for out.len() floats (the library checks
        // that it is n_rows * snapshot_dim); rows holds n_rows * hidden
        // elements of its dtype.
        check(unsafe {
            sys::clm_engine_make_snapshots(
                out.as_mut_ptr(),
                out.len(),
                self.as_raw(),
                rows.as_ptr(),
                rows.dtype().raw(),
                n_rows,
                hidden,
            )
        })
    }

    /// [`Engine::make_snapshots_into`] into a new vector of
    /// `n_rows * snapshot_dim` floats (`snapshot_dim` of the installed
    /// projection).
    pub fn make_snapshots(&self, rows: Activations<'_>, hidden: i32, snapshot_dim: i32) -> Result<Vec<f32>> {
        const F: &str = "clm_engine_make_snapshots";
        let n_rows = rows_of(F, "rows", rows.len(), hidden)?;
        if snapshot_dim < 1 {
            return Err(invalid(F, format!("snapshot_dim must be >= 1, got {}", snapshot_dim)));
        }
        let mut out = vec![0.0f32; product(F, n_rows, snapshot_dim as usize)?];
        self.make_snapshots_into(rows, hidden, &mut out)?;
        Ok(out)
    }

    /// Installs the snapshot adapter from host memory
    /// (`clm_engine_set_snapshot_adapter`, copied): `weight`
    /// `[hidden][snapshot_dim]`, `bias` `[hidden]`.
    pub fn set_snapshot_adapter(
        &self,
        snapshot_dim: i32,
        hidden: i32,
        weight: &[f32],
        bias: &[f32],
        options: &AdapterOptions,
    ) -> Result<()> {
        const F: &str = "clm_engine_set_snapshot_adapter";
        if hidden < 1 || snapshot_dim < 1 {
            return Err(invalid(F, format!("hidden {} and snapshot_dim {} must be >= 1", hidden, snapshot_dim)));
        }
        let n = product(F, hidden as usize, snapshot_dim as usize)?;
        expect_len(F, "weight", weight.len(), n, "[hidden][snapshot_dim]")?;
        expect_len(F, "bias", bias.len(), hidden as usize, "[hidden]")?;
        let raw = options.to_raw()?;
        // SAFETY: the arrays hold what the dimensions say (checked); raw and
        // the layers it borrows live across the call; all are copied.
        check(unsafe {
            sys::clm_engine_set_snapshot_adapter(
                self.as_raw(),
                snapshot_dim,
                hidden,
                weight.as_ptr(),
                bias.as_ptr(),
                &raw,
            )
        })
    }

    /// Loads the snapshot adapter (`adapter.weight`, `adapter.bias`) from a
    /// safetensors file (`clm_engine_load_snapshot_adapter`).
    pub fn load_snapshot_adapter(&self, path: impl AsRef<Path>, options: &AdapterOptions) -> Result<()> {
        let path = path_cstring("clm_engine_load_snapshot_adapter", path.as_ref())?;
        let raw = options.to_raw()?;
        // SAFETY: path is NUL-terminated; raw and its layers live across the call.
        check(unsafe { sys::clm_engine_load_snapshot_adapter(self.as_raw(), path.as_ptr(), &raw) })
    }

    /// Adds `residual_scale * (W snapshots[i] + b)` to rows
    /// `indptr[i]..indptr[i + 1]` of `hidden_states` `[n_rows][hidden]` for
    /// each `i` with `apply[i]` whose sequence is not in baseline mode, when
    /// the adapter injects at `layer` (else nothing changes)
    /// (`clm_engine_inject_snapshots`). `snapshots` is
    /// `[seqs.len()][snapshot_dim]`. On error `hidden_states` is untouched.
    #[allow(clippy::too_many_arguments)]
    pub fn inject_snapshots(
        &self,
        mut hidden_states: ActivationsMut<'_>,
        hidden: i32,
        seqs: &[&Sequence],
        indptr: &[i32],
        snapshots: &[f32],
        snapshot_dim: i32,
        apply: &[bool],
        layer: i32,
    ) -> Result<()> {
        const F: &str = "clm_engine_inject_snapshots";
        let n_rows = rows_of(F, "hidden_states", hidden_states.len(), hidden)?;
        if snapshot_dim < 1 {
            return Err(invalid(F, format!("snapshot_dim must be >= 1, got {}", snapshot_dim)));
        }
        expect_len(F, "indptr", indptr.len(), seqs.len() + 1, "seqs.len() + 1")?;
        let n = product(F, seqs.len(), snapshot_dim as usize)?;
        expect_len(F, "snapshots", snapshots.len(), n, "[seqs.len()][snapshot_dim]")?;
        expect_len(F, "apply", apply.len(), seqs.len(), "one per sequence")?;
        let handles = handles(seqs);
        let apply = flags(apply);
        // SAFETY: hidden_states is exclusively borrowed and holds n_rows *
        // hidden elements of its dtype; indptr n_seqs + 1 entries, snapshots
        // n_seqs * snapshot_dim floats, apply and handles n_seqs (checked).
        check(unsafe {
            sys::clm_engine_inject_snapshots(
                self.as_raw(),
                hidden_states.as_mut_ptr(),
                hidden_states.dtype().raw(),
                n_rows,
                hidden,
                null_if_empty(&handles),
                handles.len(),
                indptr.as_ptr(),
                null_if_empty(snapshots),
                snapshot_dim,
                null_if_empty(&apply),
                layer,
            )
        })
    }
}

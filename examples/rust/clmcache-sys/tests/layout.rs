//! Checks the #[repr(C)] declarations of src/lib.rs against the C compiler's
//! view of the installed clm.h (measured by probe/layout.c, see build.rs), and
//! against the sizes worked out by hand for LP64 targets.
use clmcache_sys::*;
use std::mem::{align_of, size_of, MaybeUninit};

mod c {
    include!(concat!(env!("OUT_DIR"), "/c_layout.rs"));
}

fn size_of_pointee<T>(_: *const T) -> usize {
    size_of::<T>()
}

// (offset, size) of a field; std::mem::offset_of! needs Rust 1.77.
macro_rules! field {
    ($t:ident, $f:ident) => {{
        let value = MaybeUninit::<$t>::uninit();
        let base = value.as_ptr();
        // SAFETY: addr_of! only computes the address; nothing is read.
        let field = unsafe { std::ptr::addr_of!((*base).$f) };
        (concat!(stringify!($t), ".", stringify!($f)), field as usize - base as usize, size_of_pointee(field))
    }};
}

macro_rules! ty {
    ($t:ident) => {
        (stringify!($t), size_of::<$t>(), align_of::<$t>())
    };
}

macro_rules! constant {
    ($c:ident) => {
        (stringify!($c), $c as i64)
    };
}

fn rust_types() -> Vec<(&'static str, usize, usize)> {
    vec![ty!(clm_status), ty!(clm_engine_options), ty!(clm_kv_layout), ty!(clm_admit_options), ty!(clm_metrics)]
}

fn rust_fields() -> Vec<(&'static str, usize, usize)> {
    vec![
        field!(clm_engine_options, struct_size),
        field!(clm_engine_options, num_pages),
        field!(clm_engine_options, page_size),
        field!(clm_engine_options, num_layers),
        field!(clm_engine_options, kv_heads),
        field!(clm_engine_options, head_dim),
        field!(clm_engine_options, kv_dtype),
        field!(clm_engine_options, memory),
        field!(clm_engine_options, device),
        field!(clm_engine_options, eviction_policy),
        field!(clm_engine_options, slru_protected_fraction),
        field!(clm_kv_layout, struct_size),
        field!(clm_kv_layout, base),
        field!(clm_kv_layout, page_bytes),
        field!(clm_kv_layout, layer_bytes),
        field!(clm_kv_layout, num_pages),
        field!(clm_kv_layout, page_size),
        field!(clm_kv_layout, num_layers),
        field!(clm_kv_layout, kv_heads),
        field!(clm_kv_layout, head_dim),
        field!(clm_kv_layout, kv_dtype),
        field!(clm_kv_layout, memory),
        field!(clm_admit_options, struct_size),
        field!(clm_admit_options, cache_salt),
        field!(clm_admit_options, cache_salt_len),
        field!(clm_admit_options, adapter_id),
        field!(clm_admit_options, priority),
        field!(clm_metrics, struct_size),
        field!(clm_metrics, tokens_queried),
        field!(clm_metrics, tokens_hit),
        field!(clm_metrics, hit_rate),
        field!(clm_metrics, cached_tokens),
        field!(clm_metrics, evictable_tokens),
        field!(clm_metrics, protected_tokens),
        field!(clm_metrics, pages_used),
        field!(clm_metrics, pages_free),
        field!(clm_metrics, evicted_tokens),
        field!(clm_metrics, evictions),
        field!(clm_metrics, inserted_tokens),
        field!(clm_metrics, admitted),
        field!(clm_metrics, finished),
        field!(clm_metrics, aborted),
        field!(clm_metrics, rejected),
        field!(clm_metrics, active_sequences),
        field!(clm_metrics, metadata_bytes),
    ]
}

fn rust_constants() -> Vec<(&'static str, i64)> {
    vec![
        constant!(CLM_VERSION_MAJOR),
        constant!(CLM_VERSION_MINOR),
        constant!(CLM_VERSION_PATCH),
        constant!(CLM_VERSION_NUMBER),
        constant!(CLM_OK),
        constant!(CLM_ERR_INVALID_ARGUMENT),
        constant!(CLM_ERR_OUT_OF_MEMORY),
        constant!(CLM_ERR_NOT_FOUND),
        constant!(CLM_ERR_FAILED_PRECONDITION),
        constant!(CLM_ERR_UNSUPPORTED),
        constant!(CLM_ERR_INTERNAL),
        constant!(CLM_ERR_IO),
        constant!(CLM_KV_F32),
        constant!(CLM_KV_F16),
        constant!(CLM_KV_BF16),
        constant!(CLM_MEMORY_NONE),
        constant!(CLM_MEMORY_HOST),
        constant!(CLM_MEMORY_DEVICE),
        constant!(CLM_EVICT_LRU),
        constant!(CLM_EVICT_LFU),
        constant!(CLM_EVICT_SLRU),
        constant!(CLM_EVICT_PRIORITY),
    ]
}

// Both tables must list the same names with the same values, so a field or
// macro added to clm.h but not here (or the reverse) fails too.
fn same<T: PartialEq + std::fmt::Debug>(what: &str, c: &[(&str, T)], rust: &[(&str, T)]) {
    let mut problems = Vec::new();
    for (name, value) in c {
        match rust.iter().find(|(n, _)| n == name) {
            None => problems.push(format!("{} missing on the Rust side (C: {:?})", name, value)),
            Some((_, v)) if v != value => problems.push(format!("{}: C {:?}, Rust {:?}", name, value, v)),
            Some(_) => {}
        }
    }
    for (name, _) in rust {
        if !c.iter().any(|(n, _)| n == name) {
            problems.push(format!("{} is not measured by probe/layout.c", name));
        }
    }
    assert!(problems.is_empty(), "{} differ from clm.h:\n  {}", what, problems.join("\n  "));
}

fn probed() {
    if let Err(why) = c::C_PROBE {
        panic!("the C layout probe did not run ({}); see build.rs", why);
    }
}

#[test]
fn struct_sizes_and_alignments_match_c() {
    probed();
    let c: Vec<_> = c::C_TYPES.iter().map(|&(n, s, a)| (n, (s, a))).collect();
    let rust: Vec<_> = rust_types().into_iter().map(|(n, s, a)| (n, (s, a))).collect();
    same("sizes/alignments", &c, &rust);
}

#[test]
fn field_offsets_and_sizes_match_c() {
    probed();
    let c: Vec<_> = c::C_FIELDS.iter().map(|&(n, o, s)| (n, (o, s))).collect();
    let rust: Vec<_> = rust_fields().into_iter().map(|(n, o, s)| (n, (o, s))).collect();
    same("field offsets/sizes", &c, &rust);
}

#[test]
fn constants_match_c() {
    probed();
    same("constants", c::C_CONSTANTS, &rust_constants());
}

// Worked out by hand for LP64 (8-byte pointers, size_t and double, 4-byte int):
// engine options: u32 + 9 x i32 = 40, then the double at 40: 48.
// kv layout: u32 at 0, pointer at 8, 2 x size_t -> 32, 7 x i32 = 28 -> 60,
// padded to 64.
// admit options: u32 at 0, pointer at 8, size_t at 16, 2 x i32 at 24: 32.
// metrics: u32 at 0, 6 x 8-byte fields at 8..56, 2 x i32 at 56, 7 x u64 at
// 64..120, i64 at 120, u64 at 128: 136.
#[cfg(all(target_pointer_width = "64", not(windows)))]
#[test]
fn lp64_sizes_worked_out_by_hand() {
    assert_eq!(size_of::<clm_engine_options>(), 48);
    assert_eq!(field!(clm_engine_options, slru_protected_fraction).1, 40);
    assert_eq!(size_of::<clm_kv_layout>(), 64);
    assert_eq!(field!(clm_kv_layout, base).1, 8);
    assert_eq!(field!(clm_kv_layout, memory).1, 56);
    assert_eq!(size_of::<clm_admit_options>(), 32);
    assert_eq!(field!(clm_admit_options, cache_salt).1, 8);
    assert_eq!(field!(clm_admit_options, priority).1, 28);
    assert_eq!(size_of::<clm_metrics>(), 136);
    assert_eq!(field!(clm_metrics, pages_used).1, 56);
    assert_eq!(field!(clm_metrics, evicted_tokens).1, 64);
    assert_eq!(field!(clm_metrics, active_sequences).1, 120);
    assert_eq!(field!(clm_metrics, metadata_bytes).1, 128);
}

#[test]
fn links_and_agrees_on_the_version() {
    // SAFETY: both functions take nothing and return static data.
    let (number, string) = unsafe { (clm_version(), std::ffi::CStr::from_ptr(clm_version_string())) };
    assert_eq!(number, CLM_VERSION_NUMBER, "header/library version skew");
    let expected = format!("{}.{}.{}", CLM_VERSION_MAJOR, CLM_VERSION_MINOR, CLM_VERSION_PATCH);
    assert_eq!(string.to_str().unwrap(), expected);
}

#[test]
fn init_functions_accept_our_struct_sizes() {
    // SAFETY: each pointer is to a live, properly sized value.
    unsafe {
        let mut engine = MaybeUninit::<clm_engine_options>::zeroed().assume_init();
        assert_eq!(clm_engine_options_init(&mut engine, size_of::<clm_engine_options>()), CLM_OK);
        assert_eq!(engine.struct_size as usize, size_of::<clm_engine_options>());
        let mut admit = MaybeUninit::<clm_admit_options>::zeroed().assume_init();
        assert_eq!(clm_admit_options_init(&mut admit, size_of::<clm_admit_options>()), CLM_OK);
        assert_eq!(admit.struct_size as usize, size_of::<clm_admit_options>());
        // One byte short is a size this library does not know.
        assert_eq!(clm_engine_options_init(&mut engine, size_of::<clm_engine_options>() - 1), CLM_ERR_INVALID_ARGUMENT);
        assert!(!std::ffi::CStr::from_ptr(clm_last_error()).to_bytes().is_empty());
    }
}

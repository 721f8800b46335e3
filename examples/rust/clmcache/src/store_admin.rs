//! The snapshot store by hand (`clm.h`, "the snapshot store by hand"): what
//! an operator corrects in a running engine's store. A tenant is named by its
//! cache salt and adapter id (as `set_fallback_snapshot` names it), a key by a
//! [`Suffix`] (as `record_snapshot` names it; a text whose key abstained names
//! nothing stored: `NotFound`). Every call changes nothing on error; what is
//! not there is `NotFound`.
//!
//! ```no_run
//! # fn demo(engine: &clmcache::Engine) -> clmcache::Result<()> {
//! use clmcache::Suffix;
//! let key = Suffix::Key { key: "FAQ-7", group: "billing" };
//! for v in engine.snapshot_versions(b"tenant-7", 0, key)? {
//!     println!("v{} served={} usage={}", v.version, v.served, v.usage_count);
//! }
//! engine.pin_snapshot_version(b"tenant-7", 0, key, 1)?;
//! # Ok(()) }
//! ```

use std::os::raw::c_char;
use std::ptr;

use crate::store::Suffix;
use crate::{check, sys, Engine, Error, ErrorCode, Result};

/// One version of a key (`clm_snapshot_version`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotVersion {
    pub version: i32,
    /// Its snapshot passes its checks (an unreadable one is never served).
    pub readable: bool,
    /// Confirmed by enough later records.
    pub stable: bool,
    /// Pinned by `pin_snapshot_version`.
    pub pinned: bool,
    /// The version level 1 serves now.
    pub served: bool,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds of its latest use, once written.
    pub last_used: i64,
    pub usage_count: i64,
    pub confirmations: i64,
}

/// One key refused at every level (`clm_snapshot_blacklist_entry`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlacklistEntry {
    /// In force until (milliseconds since the Unix epoch).
    pub until_ms: i64,
    /// FNV-1a 64 of the key.
    pub fingerprint: u64,
    /// The tenant: its cache salt (its first `CLM_SNAPSHOT_KEY_BYTES - 1` bytes
    /// when `truncated`) and adapter id.
    pub salt: Vec<u8>,
    pub adapter_id: i32,
    pub key: String,
    /// Why: what `blacklist_snapshot_key` was told, or what the breaker saw.
    pub reason: String,
    /// Set by `blacklist_snapshot_key`; false: by the accuracy breaker.
    pub by_hand: bool,
    /// A field holds only the first bytes of a longer value.
    pub truncated: bool,
}

fn c_bytes(field: &[c_char], len: u32) -> Vec<u8> {
    field.iter().take((len as usize).min(field.len() - 1)).map(|&c| c as u8).collect()
}

fn bytes_ptr(b: &[u8]) -> *const c_char {
    if b.is_empty() {
        ptr::null()
    } else {
        b.as_ptr() as *const c_char
    }
}

/// The C views of a tenant's salt and a key, for one call.
struct KeyArgs {
    salt: *const c_char,
    salt_len: usize,
    text: *const c_char,
    text_len: usize,
    group: *const c_char,
    group_len: usize,
    kind: i32,
}

/// The C views of a suffix: text, its length, group, its length, kind.
fn parts(s: Suffix<'_>) -> (*const c_char, usize, *const c_char, usize, i32) {
    let (text, group) = (s.text(), s.group());
    (bytes_ptr(text.as_bytes()), text.len(), bytes_ptr(group.as_bytes()), group.len(), s.kind())
}

impl Engine {
    /// A key's versions, newest first (`clm_engine_snapshot_versions`).
    pub fn snapshot_versions(&self, salt: &[u8], adapter_id: i32, suffix: Suffix<'_>) -> Result<Vec<SnapshotVersion>> {
        let (text, text_len, group, group_len, kind) = parts(suffix);
        let mut out: Vec<sys::clm_snapshot_version> = Vec::new();
        // Versions may be added between the sizing call and the fill: try again.
        for _ in 0..4 {
            let mut count = 0usize;
            // SAFETY: out holds out.len() writable elements (or none: a sizing
            // call with NULL); salt, text and group are borrowed with their lengths.
            let status = unsafe {
                sys::clm_engine_snapshot_versions(
                    if out.is_empty() { ptr::null_mut() } else { out.as_mut_ptr() },
                    out.len(),
                    &mut count,
                    self.as_raw(),
                    bytes_ptr(salt),
                    salt.len(),
                    adapter_id,
                    text,
                    text_len,
                    group,
                    group_len,
                    kind,
                )
            };
            match check(status) {
                Ok(()) if count <= out.len() => {
                    return Ok(out[..count]
                        .iter()
                        .map(|v| SnapshotVersion {
                            version: v.version,
                            readable: v.readable != 0,
                            stable: v.stable != 0,
                            pinned: v.pinned != 0,
                            served: v.served != 0,
                            created_at: v.created_at,
                            last_used: v.last_used,
                            usage_count: v.usage_count,
                            confirmations: v.confirmations,
                        })
                        .collect());
                }
                Err(e) if e.code() != ErrorCode::InvalidArgument || count <= out.len() => return Err(e),
                _ => out = vec![sys::clm_snapshot_version::default(); count],
            }
        }
        Err(Error::new(ErrorCode::Internal, "clm_engine_snapshot_versions: the key's versions kept changing"))
    }

    /// Calls `f` with the engine and the C views of `salt` and `suffix`
    /// (pointer and length each, then the suffix kind), borrowed for the call.
    fn with_key<T>(
        &self,
        salt: &[u8],
        suffix: Suffix<'_>,
        f: impl FnOnce(*mut sys::clm_engine, KeyArgs) -> (sys::clm_status, T),
    ) -> Result<T> {
        let (text, text_len, group, group_len, kind) = parts(suffix);
        let args = KeyArgs { salt: bytes_ptr(salt), salt_len: salt.len(), text, text_len, group, group_len, kind };
        let (status, value) = f(self.as_raw(), args);
        check(status)?;
        Ok(value)
    }

    /// The blacklist entries in force, by tenant and key
    /// (`clm_engine_snapshot_blacklist`).
    pub fn snapshot_blacklist(&self) -> Result<Vec<BlacklistEntry>> {
        let mut out: Vec<sys::clm_snapshot_blacklist_entry> = Vec::new();
        // Entries may be added between the sizing call and the fill: try again.
        for _ in 0..4 {
            let mut count = 0usize;
            // SAFETY: out holds out.len() writable elements (or none: a sizing call with NULL).
            let status = unsafe {
                sys::clm_engine_snapshot_blacklist(
                    if out.is_empty() { ptr::null_mut() } else { out.as_mut_ptr() },
                    out.len(),
                    &mut count,
                    self.as_raw(),
                )
            };
            match check(status) {
                Ok(()) if count <= out.len() => {
                    return Ok(out[..count]
                        .iter()
                        .map(|e| BlacklistEntry {
                            until_ms: e.until_ms,
                            fingerprint: e.fingerprint,
                            salt: c_bytes(&e.salt, e.salt_len),
                            adapter_id: e.adapter_id,
                            key: String::from_utf8_lossy(&c_bytes(&e.key, e.key_len)).into_owned(),
                            reason: String::from_utf8_lossy(&c_bytes(&e.reason, e.reason_len)).into_owned(),
                            by_hand: e.by_hand != 0,
                            truncated: (e.salt_truncated | e.key_truncated | e.reason_truncated) != 0,
                        })
                        .collect());
                }
                Err(e) if e.code() != ErrorCode::InvalidArgument || count <= out.len() => return Err(e),
                _ => out = vec![sys::clm_snapshot_blacklist_entry::default(); count],
            }
        }
        Err(Error::new(ErrorCode::Internal, "clm_engine_snapshot_blacklist: the blacklist kept changing"))
    }

    /// Serves `version` of the key at levels 1 and 2 whatever is recorded
    /// later, until `unpin_snapshot_version` (`clm_engine_pin_snapshot_version`).
    pub fn pin_snapshot_version(&self, salt: &[u8], adapter_id: i32, suffix: Suffix<'_>, version: i32) -> Result<()> {
        self.with_key(salt, suffix, |e, k| {
            // SAFETY: every array of k is borrowed for the call with its length.
            let status = unsafe {
                sys::clm_engine_pin_snapshot_version(
                    e,
                    k.salt,
                    k.salt_len,
                    adapter_id,
                    k.text,
                    k.text_len,
                    k.group,
                    k.group_len,
                    k.kind,
                    version,
                )
            };
            (status, ())
        })
    }

    /// Lifts a key's pin (`clm_engine_unpin_snapshot_version`).
    pub fn unpin_snapshot_version(&self, salt: &[u8], adapter_id: i32, suffix: Suffix<'_>) -> Result<()> {
        self.with_key(salt, suffix, |e, k| {
            // SAFETY: every array of k is borrowed for the call with its length.
            let status = unsafe {
                sys::clm_engine_unpin_snapshot_version(
                    e,
                    k.salt,
                    k.salt_len,
                    adapter_id,
                    k.text,
                    k.text_len,
                    k.group,
                    k.group_len,
                    k.kind,
                )
            };
            (status, ())
        })
    }

    /// Deletes the key's versions newer than `version`; returns how many
    /// (`clm_engine_roll_back_snapshot_key`).
    pub fn roll_back_snapshot_key(
        &self,
        salt: &[u8],
        adapter_id: i32,
        suffix: Suffix<'_>,
        version: i32,
    ) -> Result<i64> {
        self.with_key(salt, suffix, |e, k| {
            let mut deleted = 0i64;
            // SAFETY: deleted is writable; every array of k is borrowed with its length.
            let status = unsafe {
                sys::clm_engine_roll_back_snapshot_key(
                    &mut deleted,
                    e,
                    k.salt,
                    k.salt_len,
                    adapter_id,
                    k.text,
                    k.text_len,
                    k.group,
                    k.group_len,
                    k.kind,
                    version,
                )
            };
            (status, deleted)
        })
    }

    /// Deletes every version of the key; returns how many
    /// (`clm_engine_delete_snapshot_key`).
    pub fn delete_snapshot_key(&self, salt: &[u8], adapter_id: i32, suffix: Suffix<'_>) -> Result<i64> {
        self.with_key(salt, suffix, |e, k| {
            let mut deleted = 0i64;
            // SAFETY: deleted is writable; every array of k is borrowed with its length.
            let status = unsafe {
                sys::clm_engine_delete_snapshot_key(
                    &mut deleted,
                    e,
                    k.salt,
                    k.salt_len,
                    adapter_id,
                    k.text,
                    k.text_len,
                    k.group,
                    k.group_len,
                    k.kind,
                )
            };
            (status, deleted)
        })
    }

    /// Deletes everything of the tenant; returns how many snapshot rows
    /// (`clm_engine_delete_snapshot_tenant`).
    pub fn delete_snapshot_tenant(&self, salt: &[u8], adapter_id: i32) -> Result<i64> {
        let mut deleted = 0i64;
        // SAFETY: deleted is writable; salt is borrowed with its length.
        check(unsafe {
            sys::clm_engine_delete_snapshot_tenant(&mut deleted, self.as_raw(), bytes_ptr(salt), salt.len(), adapter_id)
        })?;
        Ok(deleted)
    }

    /// Refuses the key at every level until `until_ms` (milliseconds since the
    /// Unix epoch, after now), with a reason of 1..1024 bytes
    /// (`clm_engine_blacklist_snapshot_key`).
    pub fn blacklist_snapshot_key(
        &self,
        salt: &[u8],
        adapter_id: i32,
        suffix: Suffix<'_>,
        reason: &str,
        until_ms: i64,
    ) -> Result<()> {
        self.with_key(salt, suffix, |e, k| {
            // SAFETY: every array of k, and reason, is borrowed for the call with its length.
            let status = unsafe {
                sys::clm_engine_blacklist_snapshot_key(
                    e,
                    k.salt,
                    k.salt_len,
                    adapter_id,
                    k.text,
                    k.text_len,
                    k.group,
                    k.group_len,
                    k.kind,
                    bytes_ptr(reason.as_bytes()),
                    reason.len(),
                    until_ms,
                )
            };
            (status, ())
        })
    }

    /// Lifts the key's blacklist entry (`clm_engine_unblacklist_snapshot_key`).
    pub fn unblacklist_snapshot_key(&self, salt: &[u8], adapter_id: i32, suffix: Suffix<'_>) -> Result<()> {
        self.with_key(salt, suffix, |e, k| {
            // SAFETY: every array of k is borrowed for the call with its length.
            let status = unsafe {
                sys::clm_engine_unblacklist_snapshot_key(
                    e,
                    k.salt,
                    k.salt_len,
                    adapter_id,
                    k.text,
                    k.text_len,
                    k.group,
                    k.group_len,
                    k.kind,
                )
            };
            (status, ())
        })
    }
}

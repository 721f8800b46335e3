//! CLM's semantic snapshot store (clm.h, "the snapshot store"): an engine
//! created with [`crate::EngineOptions::snapshot_store_path`] keeps the
//! snapshots a host records of repeated suffixes and finds them again for a
//! reuse decision, at three levels: the suffix's own key, a near snapshot of
//! the same group, a greeting's generic fallback. A sequence's tenant is its
//! cache salt and adapter id; no tenant sees another's snapshots.
//!
//! As in the rest of the crate, slice lengths are checked on the Rust side
//! first ([`ErrorCode::InvalidArgument`] naming the argument); the library
//! checks the values. Every call on an engine without a store is
//! [`ErrorCode::FailedPrecondition`].
use std::os::raw::c_char;
use std::ptr;

use crate::clm::{expect_len, flags, handles, invalid, null_if_empty, product};
use crate::{check, known, sys, Engine, Error, ErrorCode, Result, Sequence};

/// One suffix of a lookup or a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suffix<'a> {
    /// The user's text (`CLM_SUFFIX_TEXT`): the engine's keyer makes the key,
    /// so paraphrases share one.
    Text(&'a str),
    /// A key of the host's own, 1..256 printable ASCII bytes, and the group
    /// level 2 must agree on ("" = the key itself) (`CLM_SUFFIX_KEY`).
    Key { key: &'a str, group: &'a str },
}

impl<'a> Suffix<'a> {
    /// A host key without a group.
    pub fn key(key: &'a str) -> Suffix<'a> {
        Suffix::Key { key, group: "" }
    }

    pub(crate) fn kind(&self) -> i32 {
        match self {
            Suffix::Text(_) => sys::CLM_SUFFIX_TEXT,
            Suffix::Key { .. } => sys::CLM_SUFFIX_KEY,
        }
    }

    pub(crate) fn text(&self) -> &'a str {
        match *self {
            Suffix::Text(text) => text,
            Suffix::Key { key, .. } => key,
        }
    }

    pub(crate) fn group(&self) -> &'a str {
        match *self {
            Suffix::Text(_) => "",
            Suffix::Key { group, .. } => group,
        }
    }
}

raw_enum!(
    /// Where a lookup found its snapshot (`CLM_SNAPSHOT_*`).
    SnapshotLevel {
        /// Nothing: the snapshot is zeros, apply is false.
        Miss = sys::CLM_SNAPSHOT_MISS,
        /// Level 1: the key's newest stable version (else its newest, unstable).
        Exact = sys::CLM_SNAPSHOT_EXACT,
        /// Level 2: the nearest stored snapshot of the same group (needs a query).
        Ann = sys::CLM_SNAPSHOT_ANN,
        /// Level 3: the tenant's generic snapshot of a greeting or thanks.
        Fallback = sys::CLM_SNAPSHOT_FALLBACK,
    }
);

raw_enum!(
    /// What recording a snapshot did (`CLM_RECORD_*`).
    RecordResult {
        /// Seen fewer than `snapshot_min_usage` times: counted, not stored.
        Counted = sys::CLM_RECORD_COUNTED,
        /// Stored as version 1.
        Admitted = sys::CLM_RECORD_ADMITTED,
        /// Agrees with the newest version.
        Confirmed = sys::CLM_RECORD_CONFIRMED,
        /// Disagrees with it: stored as a new version.
        NewVersion = sys::CLM_RECORD_NEW_VERSION,
        /// The key's recent records drifted apart: stored as a new version.
        Drifted = sys::CLM_RECORD_DRIFTED,
        /// The text's key abstained (low information): neither stored nor counted.
        Abstained = sys::CLM_RECORD_ABSTAINED,
    }
);

/// One sequence's lookup result (`clm_snapshot_hit`).
#[derive(Clone, Debug, PartialEq)]
pub struct SnapshotHit {
    pub level: SnapshotLevel,
    /// Cosine of the query and the snapshot (level 1 without a query: 1; level 3: 0).
    pub similarity: f32,
    /// The served version (levels 1 and 2; else 0).
    pub version: i32,
    /// Level 1: the version is stable (confirmed by later records).
    pub stable: bool,
    /// FNV-1a 64 of the served key (0 on a miss).
    pub fingerprint: u64,
    /// The served key: the suffix's own at level 1, a neighbour's at level 2,
    /// the fallback's name at level 3, "" on a miss. Its first
    /// `CLM_SNAPSHOT_KEY_BYTES - 1` bytes when `key_truncated`.
    pub key: String,
    /// The served key's full length in bytes.
    pub key_len: usize,
    /// `key` holds only the first bytes of a longer key.
    pub key_truncated: bool,
}

impl SnapshotHit {
    fn from_raw(h: &sys::clm_snapshot_hit) -> Result<SnapshotHit> {
        let bytes: Vec<u8> = h.key.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        Ok(SnapshotHit {
            level: known(SnapshotLevel::from_raw(h.level), "snapshot level", h.level)?,
            similarity: h.similarity,
            version: h.version,
            stable: h.stable != 0,
            fingerprint: h.fingerprint,
            key: String::from_utf8_lossy(&bytes).into_owned(),
            key_len: h.key_len as usize,
            key_truncated: h.key_truncated != 0,
        })
    }
}

/// What [`Engine::lookup_snapshots`] gives: one hit per sequence, their
/// snapshots `[n][snapshot_dim]` (zeros on a miss) and the apply flags, as
/// [`Engine::inject_snapshots`] takes them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SnapshotLookup {
    pub hits: Vec<SnapshotHit>,
    pub snapshots: Vec<f32>,
    pub apply: Vec<bool>,
}

/// What [`Engine::record_snapshot`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordOutcome {
    pub result: RecordResult,
    /// The key's newest version afterwards (0 while counted).
    pub version: i32,
}

/// A suffix key as the engine's keyer makes it ([`Engine::suffix_key`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SuffixKey {
    /// "QUERY-ORDER-789-STATUS", "NOT-QUERY-ORDER-789", "GREETING", ...
    pub key: String,
    /// FNV-1a 64 of `key`.
    pub fingerprint: u64,
}

fn char_ptr(s: &str) -> *const c_char {
    s.as_ptr() as *const c_char
}

impl Engine {
    /// `snapshot_dim` of the engine's snapshot store; `None` without one.
    pub fn snapshot_dim(&self) -> Option<usize> {
        if self.snapshot_dim == 0 {
            None
        } else {
            Some(self.snapshot_dim)
        }
    }

    /// `snapshot` must hold snapshot_dim floats (checked when there is a store;
    /// without one the library answers FailedPrecondition).
    fn check_snapshot_len(&self, function: &str, name: &str, len: usize) -> Result<()> {
        match self.snapshot_dim() {
            Some(dim) => expect_len(function, name, len, dim, "snapshot_dim"),
            None => Ok(()),
        }
    }

    /// The key the engine's keyer makes of `text` (`clm_suffix_key`):
    /// paraphrases share one ("Please check the status of order 789" and
    /// "What's the status of order #789?" both give
    /// "QUERY-ORDER-789-STATUS"; "Don't check order 789" gives another,
    /// "NOT-QUERY-ORDER-789"). Text the keyer cannot pin down (a greeting, an
    /// action with no object or entity, a word its lexicons lack) still gets
    /// a key ("GREETING", ...), but it is low-information: never stored, never
    /// served at levels 1 and 2, only by a fallback
    /// ([`Engine::set_fallback_snapshot`]). Text with no content or invalid
    /// UTF-8 is `InvalidArgument`.
    pub fn suffix_key(&self, text: &str) -> Result<SuffixKey> {
        let mut buffer = vec![0 as c_char; 64];
        loop {
            let (mut len, mut fingerprint) = (0usize, 0u64);
            // SAFETY: buffer is writable for its length; text is borrowed for
            // the call with its length; the engine is live.
            let status = unsafe {
                sys::clm_suffix_key(
                    buffer.as_mut_ptr(),
                    buffer.len(),
                    &mut len,
                    &mut fingerprint,
                    self.as_raw(),
                    char_ptr(text),
                    text.len(),
                )
            };
            if status == sys::CLM_ERR_INVALID_ARGUMENT && len >= buffer.len() {
                // Too small (nothing was written): retry with the size needed.
                buffer.resize(len + 1, 0);
                continue;
            }
            check(status)?;
            let bytes: Vec<u8> = buffer[..len].iter().map(|&c| c as u8).collect();
            let key = String::from_utf8(bytes)
                .map_err(|_| Error::new(ErrorCode::Internal, "clm_suffix_key returned a key that is not UTF-8"))?;
            return Ok(SuffixKey { key, fingerprint });
        }
    }

    /// Looks up a snapshot for each running sequence `seqs[i]` under its
    /// tenant (`clm_engine_lookup_snapshots`): `suffixes[i]` names its suffix
    /// (all of one kind: text or keys), `queries` `[seqs.len()][snapshot_dim]`
    /// its query snapshots (`None`: level 2 is skipped). Each lookup is also
    /// reported to the SRC breaker (found = hit), so don't
    /// [`Engine::report_retrieval`] it again. Nothing changes on error.
    pub fn lookup_snapshots(
        &self,
        seqs: &[&Sequence],
        suffixes: &[Suffix<'_>],
        queries: Option<&[f32]>,
    ) -> Result<SnapshotLookup> {
        const F: &str = "clm_engine_lookup_snapshots";
        expect_len(F, "suffixes", suffixes.len(), seqs.len(), "one per sequence")?;
        let kind = suffixes.first().map_or(sys::CLM_SUFFIX_TEXT, Suffix::kind);
        if suffixes.iter().any(|s| s.kind() != kind) {
            return Err(invalid(F, "suffixes mix text and keys; one call takes one kind".to_string()));
        }
        let n_floats = product(F, seqs.len(), self.snapshot_dim)?;
        if let (Some(q), Some(_)) = (queries, self.snapshot_dim()) {
            expect_len(F, "queries", q.len(), n_floats, "[seqs.len()][snapshot_dim]")?;
        }
        let handles = handles(seqs);
        let texts: Vec<*const c_char> = suffixes.iter().map(|s| char_ptr(s.text())).collect();
        let text_lens: Vec<usize> = suffixes.iter().map(|s| s.text().len()).collect();
        let groups: Vec<*const c_char> = suffixes.iter().map(|s| char_ptr(s.group())).collect();
        let group_lens: Vec<usize> = suffixes.iter().map(|s| s.group().len()).collect();
        let keys = kind == sys::CLM_SUFFIX_KEY;
        let mut hits = vec![sys::clm_snapshot_hit::default(); seqs.len()];
        let mut snapshots = vec![0.0f32; n_floats];
        let mut apply = vec![0u8; seqs.len()];
        let (q_ptr, q_len) = match queries {
            Some(q) => (q.as_ptr(), q.len()),
            None => (ptr::null(), 0),
        };
        // SAFETY: hits, apply, handles, the suffix and group arrays hold
        // seqs.len() entries, each pointer with its length borrowed for the
        // call; snapshots holds n * snapshot_dim floats and queries q_len (the
        // library checks both against the store); the sequences are live and,
        // being !Sync, used by no other thread meanwhile.
        check(unsafe {
            sys::clm_engine_lookup_snapshots(
                hits.as_mut_ptr(),
                snapshots.as_mut_ptr(),
                snapshots.len(),
                apply.as_mut_ptr(),
                self.as_raw(),
                null_if_empty(&handles),
                handles.len(),
                null_if_empty(&texts),
                null_if_empty(&text_lens),
                if keys { null_if_empty(&groups) } else { ptr::null() },
                if keys { null_if_empty(&group_lens) } else { ptr::null() },
                kind,
                q_ptr,
                q_len,
            )
        })?;
        Ok(SnapshotLookup {
            hits: hits.iter().map(SnapshotHit::from_raw).collect::<Result<Vec<_>>>()?,
            snapshots,
            apply: apply.into_iter().map(|a| a != 0).collect(),
        })
    }

    /// Records `snapshot` `[snapshot_dim]` of a running sequence's suffix
    /// under its tenant (`clm_engine_record_snapshot`): counts the suffix
    /// and, once it has been seen `snapshot_min_usage` times, stores it (as a
    /// new version when it disagrees with the newest). A NaN/Inf or zero
    /// snapshot is `InvalidArgument`; nothing is stored on error.
    pub fn record_snapshot(&self, seq: &Sequence, suffix: Suffix<'_>, snapshot: &[f32]) -> Result<RecordOutcome> {
        const F: &str = "clm_engine_record_snapshot";
        self.check_snapshot_len(F, "snapshot", snapshot.len())?;
        let (text, group) = (suffix.text(), suffix.group());
        let (mut result, mut version) = (0i32, 0i32);
        // SAFETY: the out-parameters are writable; text, group and snapshot
        // are borrowed for the call with their lengths; the sequence is live.
        check(unsafe {
            sys::clm_engine_record_snapshot(
                &mut result,
                &mut version,
                self.as_raw(),
                seq.as_raw(),
                char_ptr(text),
                text.len(),
                if group.is_empty() { ptr::null() } else { char_ptr(group) },
                group.len(),
                suffix.kind(),
                snapshot.as_ptr(),
                snapshot.len(),
            )
        })?;
        Ok(RecordOutcome { result: known(RecordResult::from_raw(result), "record result", result)?, version })
    }

    /// Whether the snapshot the last lookup served each sequence was right
    /// (`clm_engine_report_snapshot_outcome`), counted per (key looked up,
    /// key served): a key whose accuracy falls for itself is blacklisted for
    /// its tenant; one served wrongly for another key is refused to that key
    /// only. A sequence served nothing is `FailedPrecondition`.
    pub fn report_snapshot_outcome(&self, seqs: &[&Sequence], correct: &[bool]) -> Result<()> {
        const F: &str = "clm_engine_report_snapshot_outcome";
        expect_len(F, "correct", correct.len(), seqs.len(), "one per sequence")?;
        let handles = handles(seqs);
        let correct = flags(correct);
        // SAFETY: both arrays hold n_seqs entries; the sequences are live.
        check(unsafe {
            sys::clm_engine_report_snapshot_outcome(
                self.as_raw(),
                null_if_empty(&handles),
                handles.len(),
                null_if_empty(&correct),
            )
        })
    }

    /// Sets level 3's generic snapshot `[snapshot_dim]` for the tenant of the
    /// sequences admitted with cache salt `salt` (empty: none) and
    /// `adapter_id` (`clm_engine_set_fallback_snapshot`): `name` is a
    /// greeting's key ("GREETING", "THANKS", as [`Engine::suffix_key`] gives
    /// them) or "*" for all of them. Persisted.
    pub fn set_fallback_snapshot(&self, salt: &[u8], adapter_id: i32, name: &str, snapshot: &[f32]) -> Result<()> {
        const F: &str = "clm_engine_set_fallback_snapshot";
        self.check_snapshot_len(F, "snapshot", snapshot.len())?;
        // SAFETY: each array is borrowed for the call with its length.
        check(unsafe {
            sys::clm_engine_set_fallback_snapshot(
                self.as_raw(),
                if salt.is_empty() { ptr::null() } else { salt.as_ptr() as *const c_char },
                salt.len(),
                adapter_id,
                char_ptr(name),
                name.len(),
                snapshot.as_ptr(),
                snapshot.len(),
            )
        })
    }

    /// Writes pending usage counts and saves every index file
    /// (`clm_engine_flush_snapshot_store`).
    pub fn flush_snapshot_store(&self) -> Result<()> {
        // SAFETY: the engine is live.
        check(unsafe { sys::clm_engine_flush_snapshot_store(self.as_raw()) })
    }

    /// Deletes the snapshots unused for 30 days and used fewer than 5 times
    /// (`clm_engine_evict_snapshots`); returns how many.
    pub fn evict_snapshots(&self) -> Result<i64> {
        let mut deleted = 0i64;
        // SAFETY: deleted is writable; the engine is live.
        check(unsafe { sys::clm_engine_evict_snapshots(&mut deleted, self.as_raw()) })?;
        Ok(deleted)
    }
}

//! Reading a review's JSON fast: simd-json's tape of a body.
//!
//! Most of a review's bytes are in parts the decision skips (`managedFields`, a ConfigMap's
//! `data`, `options`), and serde_json skips them a byte at a time. simd-json finds the JSON's
//! structure with SIMD instructions (picked at run time, so the binary runs on any x86-64) and
//! is used first. It is stricter than serde_json (lone surrogates, numbers beyond 64 bits, more
//! than 1,024 levels of nesting), so the caller reads whatever it refuses again with serde_json:
//! a body is accepted exactly when serde_json accepts it, and errors keep serde_json's messages.

use std::cell::RefCell;

use simd_json::tape::{Tape, Value};

/// The largest body read here, with scratch space kept per thread so that a review allocates
/// no parser buffers. Larger bodies are left to serde_json: they are mostly long strings (a
/// ConfigMap's data), which serde_json skips in place faster than simd-json copies them into
/// its buffers (1.1 MB: 0.57 ms against 1.6 ms), and they would pin their buffers' memory.
const KEEP_BYTES: usize = 64 * 1024;

/// The largest tape kept between reviews, in nodes of 16 bytes (simd-json sizes it by the
/// body's structural characters, ~2,000 for a 14 KB Deployment): a body near [`KEEP_BYTES`]
/// full of short values may need more, and is not left pinning that memory.
const KEEP_NODES: usize = 16 * 1024;

struct Scratch {
    /// The body, followed by the padding simd-json's SIMD loads may read past its end, so that
    /// simd-json reads it in place instead of copying it once more.
    input: Vec<u8>,
    buffers: simd_json::Buffers,
    /// Kept, empty, between reviews: a tape made per review (grown node by node) cost an
    /// allocation, its reallocations and their copies on every request.
    tape: Tape<'static>,
}

impl Scratch {
    fn new() -> Scratch {
        Scratch {
            input: Vec::with_capacity(KEEP_BYTES + simd_json::INPUT_PADDING),
            buffers: simd_json::Buffers::new(KEEP_BYTES),
            tape: Tape(Vec::new()),
        }
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::new());
}

/// What `read` makes of the tape of `body`, or `None` when the body is larger than
/// [`KEEP_BYTES`] or simd-json refuses it (the caller then reads it with serde_json).
pub fn with_tape<T>(body: &[u8], read: impl FnOnce(Value<'_, '_>) -> Option<T>) -> Option<T> {
    if body.len() > KEEP_BYTES {
        return None;
    }
    SCRATCH.with(|scratch| {
        // Only a re-entrant call (none today) would find it taken.
        let mut scratch = scratch.try_borrow_mut().ok()?;
        let Scratch {
            input,
            buffers,
            tape,
        } = &mut *scratch;
        input.clear();
        input.extend_from_slice(body);
        input.resize(body.len() + simd_json::INPUT_PADDING, b' ');
        let mut filled = std::mem::replace(tape, Tape(Vec::new())).reset();
        let read = match simd_json::fill_tape_padded(input, body.len(), buffers, &mut filled) {
            Ok(()) => read(filled.as_value()),
            Err(_) => None,
        };
        let filled = filled.reset();
        if filled.0.capacity() <= KEEP_NODES {
            *tape = filled;
        }
        read
    })
}

#[cfg(test)]
mod tests {
    use serde::de::IgnoredAny;
    use simd_json::prelude::*;

    use super::*;

    /// Bodies at the edges of JSON: simd-json accepts none that serde_json refuses.
    #[test]
    fn accepts_nothing_serde_json_refuses() {
        let deep = format!(r#"{{"a":{}1{}}}"#, "[".repeat(5_000), "]".repeat(5_000));
        let cases: Vec<&[u8]> = vec![
            b"{\"a\":\"x\x01y\"}",
            b"{\"a\":\"x\ny\"}",
            br#"{"a":"\ud800"}"#,
            br#"{"a":"\ud800\u0041"}"#,
            br#"{"a":1e400}"#,
            br#"{"a":-0}"#,
            br#"{"a":01}"#,
            br#"{"a":1.}"#,
            br#"{"a":18446744073709551616}"#,
            br#"{"a":-18446744073709551617}"#,
            b"{\"a\":\"\xff\"}",
            br#"{"a":1} x"#,
            br#"{"a":1,}"#,
            br#"{"a":[1,]}"#,
            br#"{"a":tru}"#,
            br#"{"a":1,"a":2}"#,
            b"\xef\xbb\xbf{\"a\":1}",
            b"{\"a\":1}\x00",
            br#"{"a":"\x"}"#,
            br#"{"a":"\/"}"#,
            b" {\"a\":1}\n\t\r ",
            b"{\"a\":1}\x0c",
            deep.as_bytes(),
        ];
        for body in cases {
            let serde_json_accepts = serde_json::from_slice::<IgnoredAny>(body).is_ok();
            let accepted = with_tape(body, |_| Some(())).is_some();
            // Stricter is fine (serde_json then reads the body), laxer is not.
            assert!(
                serde_json_accepts || !accepted,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    /// Bodies up to the limit are read here, again and again with the same scratch space;
    /// larger ones are left to serde_json.
    #[test]
    fn bodies_up_to_the_limit_are_read_here() {
        let body = |size: usize| {
            let text = "v".repeat(size - r#"{"k":""}"#.len());
            serde_json::to_vec(&serde_json::json!({ "k": text })).expect("serializes")
        };
        let read = |body: &[u8]| {
            with_tape(body, |root| {
                root.as_object()?.get("k")?.as_str().map(str::len)
            })
        };
        let small = br#"{"k":"v","n":[1,2,{"x":null}]}"#;
        assert_eq!(read(small), Some(1));
        assert_eq!(read(&body(KEEP_BYTES)), Some(KEEP_BYTES - 8));
        assert_eq!(read(&body(KEEP_BYTES + 1)), None);
        assert_eq!(read(small), Some(1));
    }

    /// The tape is kept between bodies, empty, unless a body needed more than [`KEEP_NODES`]
    /// nodes; bodies read after either are read whole.
    #[test]
    fn the_tape_is_kept_only_up_to_its_bound() {
        let kept = || SCRATCH.with(|s| s.borrow().tape.0.capacity());
        let count = |body: &[u8]| {
            with_tape(body, |root| {
                root.as_object()?.get("n")?.as_array().map(|a| a.len())
            })
        };
        let list = |n: usize| format!(r#"{{"n":[{}0]}}"#, "0,".repeat(n - 1)).into_bytes();
        assert_eq!(count(&list(100)), Some(100));
        let after_small = kept();
        assert!((100..=KEEP_NODES).contains(&after_small), "{after_small}");
        // 20,000 nodes in 40 KB: read, then not kept.
        assert_eq!(count(&list(20_000)), Some(20_000));
        assert!(kept() <= KEEP_NODES, "{} nodes kept", kept());
        assert_eq!(count(&list(3)), Some(3));
        assert_eq!(count(&list(3_000)), Some(3_000));
        assert!(kept() >= 3_000, "a tape within the bound is kept");
    }
}

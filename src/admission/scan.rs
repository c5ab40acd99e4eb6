//! Reading a review's fields in one pass over the body, validating what it skips.
//!
//! Most of a review's bytes are in parts the decision skips (`managedFields`, a ConfigMap's
//! `data`, `options`). A parser that builds anything of them (a tape, a DOM, owned strings)
//! pays for every node; this reader walks the bytes once, checks the JSON grammar of
//! everything it passes over (strings, escapes, numbers, literals, nesting) without keeping any
//! of it, and takes only the fields the decision reads, borrowed from the body. It runs about as
//! many instructions as simd-json's tape and walk did, but it touches only the body where
//! simd-json filled a tape and index of every node, and under load the webhook spends about a
//! tenth less CPU per request with it (BENCHMARKS.md).
//!
//! It is held to serde_json, the reference: it mirrors what serde's derive makes of the types in
//! [`super::request`] and gives up (`None`) on anything it does not plainly accept: a body that
//! is not UTF-8, a duplicate field, a value of an unexpected type, a struct written as an array,
//! an unknown operation, nesting deeper than [`MAX_DEPTH`]. The caller then reads the body with
//! serde_json, which answers exactly as before, errors included. Escaped strings among the
//! fields read are decoded by serde_json itself.

use std::borrow::Cow;
use std::collections::BTreeMap;

use super::request::{AdmissionRequest, Object, ObjectMeta, Operation, Resource, UserInfo};
use super::review::IncomingReview;

/// Deeper nesting is left to serde_json (a review nests about ten levels).
const MAX_DEPTH: u32 = 100;

/// Reads a review from a whole body, or `None` to leave it to serde_json.
pub(super) fn review(body: &[u8]) -> Option<IncomingReview> {
    let mut reader = Reader::new(body)?;
    let mut api_version = None;
    let mut kind = None;
    let mut request = None;
    reader.object(|r, key| match &*key {
        "apiVersion" => set(&mut api_version, r.string()?),
        "kind" => set(&mut kind, r.string()?),
        "request" => set(&mut request, r.optional(admission_request)?),
        _ => r.skip(),
    })?;
    reader.end()?;
    Some(IncomingReview {
        api_version: api_version.map(Cow::into_owned).unwrap_or_default(),
        kind: kind.map(Cow::into_owned).unwrap_or_default(),
        request: request.flatten(),
    })
}

fn admission_request(r: &mut Reader<'_>) -> Option<AdmissionRequest> {
    let mut uid = None;
    let mut resource = None;
    let mut sub_resource = None;
    let mut name = None;
    let mut namespace = None;
    let mut operation = None;
    let mut user_info = None;
    let mut object = None;
    let mut old_object = None;
    let mut dry_run = None;
    r.object(|r, key| match &*key {
        "uid" => set(&mut uid, r.owned()?),
        "resource" => set(&mut resource, group_version_resource(r)?),
        "subResource" => set(&mut sub_resource, r.optional(Reader::owned)?),
        "name" => set(&mut name, r.optional(Reader::owned)?),
        "namespace" => set(&mut namespace, r.optional(Reader::owned)?),
        "operation" => set(&mut operation, self::operation(r)?),
        "userInfo" => set(&mut user_info, self::user_info(r)?),
        "object" => set(&mut object, r.optional(self::object)?),
        "oldObject" => set(&mut old_object, r.optional(self::object)?),
        "dryRun" => set(&mut dry_run, r.optional(Reader::bool)?),
        _ => r.skip(),
    })?;
    Some(AdmissionRequest {
        uid: uid?,
        resource: resource?,
        sub_resource: sub_resource.flatten(),
        name: name.flatten(),
        namespace: namespace.flatten(),
        operation: operation?,
        user_info: user_info?,
        object: object.flatten(),
        old_object: old_object.flatten(),
        dry_run: dry_run.flatten(),
    })
}

fn group_version_resource(r: &mut Reader<'_>) -> Option<Resource> {
    let mut group = None;
    let mut version = None;
    let mut resource = None;
    r.object(|r, key| match &*key {
        "group" => set(&mut group, r.owned()?),
        "version" => set(&mut version, r.owned()?),
        "resource" => set(&mut resource, r.owned()?),
        _ => r.skip(),
    })?;
    Some(Resource {
        group: group.unwrap_or_default(),
        version: version.unwrap_or_default(),
        resource: resource?,
    })
}

fn operation(r: &mut Reader<'_>) -> Option<Operation> {
    match &*r.string()? {
        "CREATE" => Some(Operation::Create),
        "UPDATE" => Some(Operation::Update),
        "DELETE" => Some(Operation::Delete),
        "CONNECT" => Some(Operation::Connect),
        _ => None,
    }
}

fn user_info(r: &mut Reader<'_>) -> Option<UserInfo> {
    let mut username = None;
    let mut groups = None;
    r.object(|r, key| match &*key {
        "username" => set(&mut username, r.owned()?),
        "groups" => {
            let mut list = Vec::new();
            r.array(|r| {
                list.push(r.owned()?);
                Some(())
            })?;
            set(&mut groups, list)
        }
        _ => r.skip(),
    })?;
    Some(UserInfo {
        username: username.unwrap_or_default(),
        groups: groups.unwrap_or_default(),
    })
}

fn object(r: &mut Reader<'_>) -> Option<Object> {
    let mut metadata = None;
    r.object(|r, key| match &*key {
        "metadata" => set(&mut metadata, object_meta(r)?),
        _ => r.skip(),
    })?;
    Some(Object {
        metadata: metadata.unwrap_or_default(),
    })
}

fn object_meta(r: &mut Reader<'_>) -> Option<ObjectMeta> {
    let mut name = None;
    let mut deletion_timestamp = None;
    let mut labels = None;
    r.object(|r, key| match &*key {
        "name" => set(&mut name, r.optional(Reader::owned)?),
        "deletionTimestamp" => set(&mut deletion_timestamp, r.optional(Reader::owned)?),
        "labels" => set(&mut labels, r.optional(string_map)?),
        _ => r.skip(),
    })?;
    Some(ObjectMeta {
        name: name.flatten(),
        deletion_timestamp: deletion_timestamp.flatten(),
        labels: labels.flatten(),
    })
}

/// A map of strings; a repeated key keeps its last value, as serde's map does.
fn string_map(r: &mut Reader<'_>) -> Option<BTreeMap<String, String>> {
    let mut map = BTreeMap::new();
    r.object(|r, key| {
        map.insert(key.into_owned(), r.owned()?);
        Some(())
    })?;
    Some(map)
}

/// Sets a field once; a second time is serde's "duplicate field" error, so `None`.
fn set<T>(field: &mut Option<T>, value: T) -> Option<()> {
    match field {
        Some(_) => None,
        None => {
            *field = Some(value);
            Some(())
        }
    }
}

/// A cursor over a body; every method consumes one value (or fails), leading whitespace
/// included.
struct Reader<'a> {
    text: &'a str,
    at: usize,
    depth: u32,
}

impl<'a> Reader<'a> {
    /// A reader of `body`, if it is UTF-8 (checked with SIMD instructions where the processor
    /// has them). Every string boundary is an ASCII quote, so each string taken is UTF-8 too.
    fn new(body: &'a [u8]) -> Option<Reader<'a>> {
        let text = simdutf8::basic::from_utf8(body).ok()?;
        Some(Reader {
            text,
            at: 0,
            depth: 0,
        })
    }

    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    /// The next byte after whitespace, not consumed.
    fn peek(&mut self) -> Option<u8> {
        while let Some(&b) = self.bytes().get(self.at) {
            if !matches!(b, b' ' | b'\n' | b'\t' | b'\r') {
                return Some(b);
            }
            self.at += 1;
        }
        None
    }

    fn eat(&mut self, expected: u8) -> Option<()> {
        (self.peek()? == expected).then(|| self.at += 1)
    }

    /// Nothing but whitespace is left.
    fn end(&mut self) -> Option<()> {
        self.peek().is_none().then_some(())
    }

    /// `null` as `None`, anything else read by `read`.
    fn optional<T>(&mut self, read: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        if self.peek()? == b'n' {
            self.literal(b"null")?;
            Some(None)
        } else {
            read(self).map(Some)
        }
    }

    fn bool(&mut self) -> Option<bool> {
        match self.peek()? {
            b't' => self.literal(b"true").map(|()| true),
            b'f' => self.literal(b"false").map(|()| false),
            _ => None,
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.at + word.len();
        (self.bytes().get(self.at..end)? == word).then(|| self.at = end)
    }

    /// An object, each member's value read (or skipped) by `member`.
    fn object(
        &mut self,
        mut member: impl FnMut(&mut Self, Cow<'a, str>) -> Option<()>,
    ) -> Option<()> {
        self.container(b'{', b'}', |r| {
            let key = r.string()?;
            r.eat(b':')?;
            member(r, key)
        })
    }

    /// An array, each item read (or skipped) by `item`.
    fn array(&mut self, item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.container(b'[', b']', item)
    }

    /// `open`, then elements read by `element` and separated by commas, then `close`.
    fn container(
        &mut self,
        open: u8,
        close: u8,
        mut element: impl FnMut(&mut Self) -> Option<()>,
    ) -> Option<()> {
        self.eat(open)?;
        self.enter()?;
        if self.peek()? == close {
            self.at += 1;
        } else {
            loop {
                element(self)?;
                match self.peek()? {
                    b',' => self.at += 1,
                    b if b == close => {
                        self.at += 1;
                        break;
                    }
                    _ => return None,
                }
            }
        }
        self.depth -= 1;
        Some(())
    }

    fn enter(&mut self) -> Option<()> {
        self.depth += 1;
        (self.depth <= MAX_DEPTH).then_some(())
    }

    /// Any value, checked and thrown away.
    fn skip(&mut self) -> Option<()> {
        match self.peek()? {
            // Keys of skipped objects are checked, not decoded.
            b'{' => self.container(b'{', b'}', |r| {
                r.raw_string()?;
                r.eat(b':')?;
                r.skip()
            }),
            b'[' => self.container(b'[', b']', Reader::skip),
            b'"' => self.raw_string().map(drop),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    /// A number as JSON writes it: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
    fn number(&mut self) -> Option<()> {
        if self.bytes().get(self.at) == Some(&b'-') {
            self.at += 1;
        }
        match self.bytes().get(self.at)? {
            b'0' => self.at += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.bytes().get(self.at) == Some(&b'.') {
            self.at += 1;
            self.bytes().get(self.at)?.is_ascii_digit().then_some(())?;
            self.digits();
        }
        if matches!(self.bytes().get(self.at), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.bytes().get(self.at), Some(b'+' | b'-')) {
                self.at += 1;
            }
            self.bytes().get(self.at)?.is_ascii_digit().then_some(())?;
            self.digits();
        }
        Some(())
    }

    fn digits(&mut self) {
        while self.bytes().get(self.at).is_some_and(u8::is_ascii_digit) {
            self.at += 1;
        }
    }

    /// A string, borrowed from the body when it has no escapes.
    fn string(&mut self) -> Option<Cow<'a, str>> {
        let start = self.at;
        let (content, escaped) = self.raw_string()?;
        if escaped {
            // The quotes included: serde_json decodes the escapes as it would have.
            let quoted = self.text.get(start..self.at)?;
            serde_json::from_str::<String>(quoted).ok().map(Cow::Owned)
        } else {
            self.text.get(content).map(Cow::Borrowed)
        }
    }

    fn owned(&mut self) -> Option<String> {
        self.string().map(Cow::into_owned)
    }

    /// Where a string's content lies (between its quotes), and whether it holds escapes; its
    /// escapes are checked and it may hold no control character, as serde_json requires.
    fn raw_string(&mut self) -> Option<(std::ops::Range<usize>, bool)> {
        self.eat(b'"')?;
        let start = self.at;
        let mut escaped = false;
        loop {
            self.at = special(self.bytes(), self.at)?;
            match self.bytes()[self.at] {
                b'"' => {
                    self.at += 1;
                    return Some((start..self.at - 1, escaped));
                }
                b'\\' => {
                    escaped = true;
                    self.at += 1;
                    match self.bytes().get(self.at)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.at += 1,
                        b'u' => {
                            let hex = self.bytes().get(self.at + 1..self.at + 5)?;
                            hex.iter().all(u8::is_ascii_hexdigit).then_some(())?;
                            self.at += 5;
                        }
                        _ => return None,
                    }
                }
                _ => return None,
            }
        }
    }
}

/// The first `"`, `\\` or control character in `bytes` from `at` on: where a string's content
/// stops (JSON allows no control character in a string). Eight bytes at a time, read from the
/// rest of the body rather than the string alone, so that a short string takes one step.
fn special(bytes: &[u8], mut at: usize) -> Option<usize> {
    const ONES: u64 = u64::MAX / 255;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let chars = u64::from_le_bytes(chunk.try_into().ok()?);
        // Mycroft's test for a zero byte, as serde_json's string scan does: the lowest flagged
        // byte is exact (only bytes above a true match can be flagged falsely).
        let control = chars.wrapping_sub(ONES * 0x20) & !chars;
        let quote = chars ^ (ONES * u64::from(b'"'));
        let quote = quote.wrapping_sub(ONES) & !quote;
        let backslash = chars ^ (ONES * u64::from(b'\\'));
        let backslash = backslash.wrapping_sub(ONES) & !backslash;
        let found = (control | quote | backslash) & (ONES << 7);
        if found != 0 {
            return Some(at + found.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    let rest = bytes.get(at..)?;
    rest.iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
        .map(|offset| at + offset)
}

#[cfg(test)]
mod tests {
    use serde::de::IgnoredAny;

    use super::*;

    fn skips(body: &[u8]) -> bool {
        let Some(mut reader) = Reader::new(body) else {
            return false;
        };
        reader.skip().is_some() && reader.end().is_some()
    }

    /// Bodies at the edges of JSON: the reader accepts none that serde_json refuses, and the
    /// plain ones it accepts.
    #[test]
    fn accepts_nothing_serde_json_refuses() {
        let deep = format!(r#"{{"a":{}1{}}}"#, "[".repeat(5_000), "]".repeat(5_000));
        let refused: Vec<&[u8]> = vec![
            b"{\"a\":\"x\x01y\"}",
            b"{\"a\":\"x\ny\"}",
            b"{\"a\":\"\xff\"}",
            br#"{"a":01}"#,
            br#"{"a":1.}"#,
            br#"{"a":.5}"#,
            br#"{"a":1e}"#,
            br#"{"a":1e+}"#,
            br#"{"a":-}"#,
            br#"{"a":+1}"#,
            br#"{"a":1} x"#,
            br#"{"a":1,}"#,
            br#"{"a":[1,]}"#,
            br#"{"a":[,1]}"#,
            br#"{,"a":1}"#,
            br#"{"a" 1}"#,
            br#"{"a":1 "b":2}"#,
            br#"{"a":tru}"#,
            br#"{"a":nul}"#,
            br#"{"a":True}"#,
            br#"{a:1}"#,
            br#"{"a":'x'}"#,
            b"\xef\xbb\xbf{\"a\":1}",
            b"{\"a\":1}\x00",
            b"{\"a\":1}\x0c",
            br#"{"a":"\x"}"#,
            br#"{"a":"\u12"}"#,
            br#"{"a":"\u12G4"}"#,
            br#"{"a":"abc"#,
            br#"{"a":"abc\"#,
            br#"{"a":[1"#,
            br#"{"a":{"b":1}"#,
            br#"{"a":1}}"#,
            b"",
            b"  ",
            deep.as_bytes(),
        ];
        for body in refused {
            let serde_json_accepts = serde_json::from_slice::<IgnoredAny>(body).is_ok();
            assert!(
                serde_json_accepts || !skips(body),
                "accepted what serde_json refuses: {}",
                String::from_utf8_lossy(body)
            );
        }
        let accepted: Vec<&[u8]> = vec![
            br#"{"a":"\ud800"}"#,
            br#"{"a":"\u00e9\/\b\f\n\r\t\"\\"}"#,
            br#"{"a":1e400,"b":-0,"c":-0.5E-3,"d":18446744073709551616,"e":0}"#,
            br#"{"a":[true,false,null,{},[],"",{"b":[{"c":"d"}]}]}"#,
            b" {\"a\":1}\n\t\r ",
            br#"{"a":1,"a":2}"#,
            r#"{"é":"ü ✓ 😀","long string past eight bytes":"abcdefghijklmnopq\"rstu"}"#.as_bytes(),
            br#"[1,2]"#,
            br#""x""#,
            br#"7"#,
        ];
        for body in accepted {
            assert!(
                serde_json::from_slice::<IgnoredAny>(body).is_ok(),
                "{}",
                String::from_utf8_lossy(body)
            );
            assert!(skips(body), "refused: {}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn special_finds_the_first_quote_backslash_or_control_character() {
        for (text, from, expected) in [
            (&b"abc\"def"[..], 0, Some(3)),
            (b"abcdefgh\\", 0, Some(8)),
            (b"abcdefghijklmnop\x1fq", 0, Some(16)),
            (b"abcdefghijklmnop\x1fq", 17, None),
            (b"\"", 0, Some(0)),
            (b"a\"b\"", 2, Some(3)),
            (b"abcdefghijklmnopqrstuvwxyz", 0, None),
            (b"\xc3\xa9\xe2\x9c\x93abcdefgh\x7f\x80\xff\"", 0, Some(16)),
            (b"\x01\"\\", 0, Some(0)),
            (b"ab\\\x01\"", 0, Some(2)),
            (b"", 0, None),
        ] {
            assert_eq!(
                special(text, from),
                expected,
                "{}",
                String::from_utf8_lossy(text)
            );
        }
    }

    #[test]
    fn escaped_strings_are_decoded_by_serde_json() {
        let body = br#"{"kind":"Admission\u0052eview","apiVersion":"admission.k8s.io\/v1"}"#;
        let read = review(body).expect("read");
        assert_eq!(read.kind, "AdmissionReview");
        assert_eq!(read.api_version, "admission.k8s.io/v1");
        // A lone surrogate is no string for serde_json: left to it, to refuse.
        assert!(review(br#"{"kind":"\ud800"}"#).is_none());
    }
}

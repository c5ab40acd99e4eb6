//! Reads a review's fields in one pass over the body, validating the JSON it skips.
//!
//! Invariant: it answers as serde_json would, or gives up (`None`) and the caller reads the body
//! with serde_json.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Range;

use wide::u8x16;

use super::request::{
    AdmissionRequest, IncomingReview, Object, ObjectMeta, Operation, Resource, UserInfo,
};

/// Deeper nesting is left to serde_json (a review nests about ten levels).
const MAX_DEPTH: u32 = 100;

/// Reads a review from a whole body, or `None` to leave it to serde_json.
pub(super) fn review(body: &[u8]) -> Option<IncomingReview<'_>> {
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
        api_version: api_version.unwrap_or_default(),
        kind: kind.unwrap_or_default(),
        request: request.flatten(),
    })
}

fn admission_request<'a>(r: &mut Reader<'a>) -> Option<AdmissionRequest<'a>> {
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
        "uid" => set(&mut uid, r.string()?),
        "resource" => set(&mut resource, group_version_resource(r)?),
        "subResource" => set(&mut sub_resource, r.optional(Reader::string)?),
        "name" => set(&mut name, r.optional(Reader::string)?),
        "namespace" => set(&mut namespace, r.optional(Reader::string)?),
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

fn group_version_resource<'a>(r: &mut Reader<'a>) -> Option<Resource<'a>> {
    let mut group = None;
    let mut version = None;
    let mut resource = None;
    r.object(|r, key| match &*key {
        "group" => set(&mut group, r.string()?),
        "version" => set(&mut version, r.string()?),
        "resource" => set(&mut resource, r.string()?),
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

fn user_info<'a>(r: &mut Reader<'a>) -> Option<UserInfo<'a>> {
    let mut username = None;
    let mut groups = None;
    r.object(|r, key| match &*key {
        "username" => set(&mut username, r.string()?),
        "groups" => {
            let mut list = Vec::new();
            r.array(|r| {
                list.push(r.string()?);
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

fn object<'a>(r: &mut Reader<'a>) -> Option<Object<'a>> {
    let mut metadata = None;
    r.object(|r, key| match &*key {
        "metadata" => set(&mut metadata, object_meta(r)?),
        _ => r.skip(),
    })?;
    Some(Object {
        metadata: metadata.unwrap_or_default(),
    })
}

fn object_meta<'a>(r: &mut Reader<'a>) -> Option<ObjectMeta<'a>> {
    let mut name = None;
    let mut deletion_timestamp = None;
    let mut labels = None;
    r.object(|r, key| match &*key {
        "name" => set(&mut name, r.optional(Reader::string)?),
        "deletionTimestamp" => set(&mut deletion_timestamp, r.optional(Reader::string)?),
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
        map.insert(key.into_owned(), r.string()?.into_owned());
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
    /// The 64-byte block last looked at by [`Reader::special`], and its [`special_bytes`].
    block: usize,
    specials: u64,
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
            block: usize::MAX,
            specials: 0,
        })
    }

    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    /// The next byte after whitespace, not consumed. The API server sends reviews compact, so
    /// the next byte is usually it: anything above a space is no whitespace.
    #[inline(always)]
    fn peek(&mut self) -> Option<u8> {
        match self.bytes().get(self.at) {
            Some(&b) if b > b' ' => Some(b),
            _ => self.peek_past_whitespace(),
        }
    }

    #[inline(never)]
    fn peek_past_whitespace(&mut self) -> Option<u8> {
        while let Some(&b) = self.bytes().get(self.at) {
            if !matches!(b, b' ' | b'\n' | b'\t' | b'\r') {
                return Some(b);
            }
            self.at += 1;
        }
        None
    }

    #[inline(always)]
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

    /// Any value, checked and thrown away. A loop over its tokens rather than a call per value
    /// (most of a review is skipped): the open containers are kept as bits, 1 for an object.
    fn skip(&mut self) -> Option<()> {
        let mut objects: u128 = 0;
        let mut open = 0u32;
        loop {
            // A value.
            match self.peek()? {
                open_byte @ (b'{' | b'[') => {
                    self.at += 1;
                    self.enter()?;
                    open += 1;
                    let object = open_byte == b'{';
                    objects = objects << 1 | u128::from(object);
                    let close = if object { b'}' } else { b']' };
                    if self.peek()? != close {
                        if object {
                            self.key()?;
                        }
                        continue;
                    }
                    self.at += 1;
                    self.depth -= 1;
                    open -= 1;
                    objects >>= 1;
                }
                b'"' => self.skip_string()?,
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                b'-' | b'0'..=b'9' => self.number()?,
                _ => return None,
            }
            // What follows a value: a comma and the next member, or the end of its container.
            loop {
                if open == 0 {
                    return Some(());
                }
                let object = objects & 1 == 1;
                match self.peek()? {
                    b',' => {
                        self.at += 1;
                        if object {
                            self.key()?;
                        }
                        break;
                    }
                    b'}' if object => {}
                    b']' if !object => {}
                    _ => return None,
                }
                self.at += 1;
                self.depth -= 1;
                open -= 1;
                objects >>= 1;
            }
        }
    }

    /// A key of a skipped object and its colon, checked, not decoded.
    #[inline(always)]
    fn key(&mut self) -> Option<()> {
        if self.peek()? != b'"' {
            return None;
        }
        self.skip_string()?;
        self.eat(b':')
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
        self.eat(b'"')?;
        let start = self.at - 1;
        let (content, escaped) = self.string_content()?;
        if escaped {
            // The quotes included: serde_json decodes the escapes as it would have.
            let quoted = self.text.get(start..self.at)?;
            serde_json::from_str::<String>(quoted).ok().map(Cow::Owned)
        } else {
            self.text.get(content).map(Cow::Borrowed)
        }
    }

    /// A string checked and thrown away; `peek` has seen its opening quote.
    #[inline(always)]
    fn skip_string(&mut self) -> Option<()> {
        self.at += 1;
        self.string_content().map(drop)
    }

    /// Where the content of a string whose opening quote was just consumed lies, and whether it
    /// holds escapes; its escapes are checked and it may hold no control character, as
    /// serde_json requires. Inlined for the common case, a string without escapes; the rest is
    /// [`Self::escaped`].
    #[inline(always)]
    fn string_content(&mut self) -> Option<(Range<usize>, bool)> {
        let start = self.at;
        let end = self.special(start)?;
        if self.bytes()[end] == b'"' {
            self.at = end + 1;
            Some((start..end, false))
        } else {
            self.escaped(start, end)
        }
    }

    /// The rest of a string from its first special byte at `at` (not a closing quote) on.
    #[inline(never)]
    fn escaped(&mut self, start: usize, mut at: usize) -> Option<(Range<usize>, bool)> {
        loop {
            match self.bytes()[at] {
                b'"' => {
                    self.at = at + 1;
                    return Some((start..at, true));
                }
                b'\\' => {
                    at += 1;
                    match self.bytes().get(at)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => at += 1,
                        b'u' => {
                            let hex = self.bytes().get(at + 1..at + 5)?;
                            hex.iter().all(u8::is_ascii_hexdigit).then_some(())?;
                            at += 5;
                        }
                        _ => return None,
                    }
                }
                _ => return None,
            }
            at = self.special(at)?;
        }
    }

    /// The first `"`, `\\` or control character from `at` on, found in the bitmask of its
    /// 64-byte block; a block's mask is computed once, as strings are read front to back.
    #[inline(always)]
    fn special(&mut self, mut at: usize) -> Option<usize> {
        loop {
            let block = at / 64;
            if block != self.block {
                self.load_block(block)?;
            }
            let found = self.specials >> (at % 64);
            if found != 0 {
                return Some(at + found.trailing_zeros() as usize);
            }
            at = (block + 1) * 64;
        }
    }

    /// Makes `block` the one [`Self::special`] looks at, if the body reaches it.
    #[inline(never)]
    fn load_block(&mut self, block: usize) -> Option<()> {
        if block * 64 >= self.text.len() {
            return None;
        }
        self.block = block;
        self.specials = special_bytes(self.bytes(), block * 64);
        Some(())
    }
}

/// Which bytes of the 64 from `start` on are a `"`, a `\\` or a control character (bit `i` for
/// byte `start + i`): where a string's content may stop, since JSON allows no control character
/// in a string. Sixteen bytes at a time with SIMD instructions (SSE2 on x86-64, NEON on
/// aarch64); bytes past the end of `bytes` count as none of these.
fn special_bytes(bytes: &[u8], start: usize) -> u64 {
    let block: [u8; 64] = match bytes.get(start..start + 64) {
        Some(block) => block.try_into().expect("a slice of 64 bytes"),
        None => {
            let mut padded = [b' '; 64];
            let rest = bytes.get(start..).unwrap_or_default();
            padded[..rest.len()].copy_from_slice(rest);
            padded
        }
    };
    let quote = u8x16::splat(b'"');
    let backslash = u8x16::splat(b'\\');
    let control = u8x16::splat(0x1f);
    let mut found = 0;
    for (i, lane) in block.chunks_exact(16).enumerate() {
        let chars = u8x16::from(<[u8; 16]>::try_from(lane).expect("chunks of 16 bytes"));
        // Unsigned: `min(c, 0x1f) == c` is `c <= 0x1f`.
        let hits = chars.cmp_eq(quote) | chars.cmp_eq(backslash) | chars.min(control).cmp_eq(chars);
        found |= u64::from(hits.move_mask() as u16) << (16 * i);
    }
    found
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

    fn is_special(b: u8) -> bool {
        b == b'"' || b == b'\\' || b < 0x20
    }

    /// Every byte value, at every position of a block, the last block cut short included:
    /// bytes above 0x7f are no control characters (an unsigned comparison).
    #[test]
    fn special_bytes_flags_quotes_backslashes_and_control_characters() {
        for byte in 0..=255u8 {
            for len in [1, 17, 64, 100, 128] {
                for at in 0..len {
                    let mut bytes = vec![b'a'; len];
                    bytes[at] = byte;
                    for start in (0..len).step_by(64) {
                        let expected = (start..len.min(start + 64))
                            .filter(|&i| is_special(bytes[i]))
                            .fold(0u64, |mask, i| mask | 1 << (i - start));
                        assert_eq!(
                            special_bytes(&bytes, start),
                            expected,
                            "byte {byte:#x} at {at} of {len}, block from {start}"
                        );
                    }
                }
            }
        }
    }

    /// The reader's search, block by block, against a byte-at-a-time one, from every start.
    #[test]
    fn special_finds_the_first_quote_backslash_or_control_character() {
        let long = format!(
            "{}\"{}\\{}\u{1}{}",
            "é".repeat(40),
            "x".repeat(70),
            "✓".repeat(30),
            "y".repeat(63)
        );
        for text in [
            "",
            "\"",
            "abc\"def",
            "abcdefghijklmnopqrstuvwxyz",
            long.as_str(),
            &"z".repeat(128),
        ] {
            let mut reader = Reader::new(text.as_bytes()).expect("UTF-8");
            for from in 0..=text.len() {
                let expected = (from..text.len()).find(|&i| is_special(text.as_bytes()[i]));
                assert_eq!(reader.special(from), expected, "from {from} in {text:?}");
            }
            // Backwards too: a block looked at earlier is looked at again.
            for from in (0..=text.len()).rev() {
                let expected = (from..text.len()).find(|&i| is_special(text.as_bytes()[i]));
                assert_eq!(reader.special(from), expected, "from {from} in {text:?}");
            }
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

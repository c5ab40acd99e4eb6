//! Captured AdmissionReviews made slightly wrong, reproducibly: the inputs on which the one-pass
//! review reader and serde_json are compared (`tests/differential.rs`, `tests/properties.rs`).
//!
//! A body is a captured review (`tests/fixtures/`), indented as captured or compacted as the API
//! server sends it, with one to four mutations drawn from a seeded generator: bytes overwritten,
//! inserted or removed, and edits that keep it near valid JSON, found by a tolerant tokenizer
//! (the fields the reader reads given values right and nearly right for them, strings
//! re-escaped, unicode escapes inserted, numbers changed, keys duplicated or renamed, values of
//! another type, members dropped, closing brackets dropped or doubled, nesting deepened around
//! the reader's and serde_json's depth limits, raw bytes in strings). The same seed gives the
//! same bodies on every machine: the generator is defined here, not taken from a crate.
#![allow(dead_code)]

use std::path::Path;

/// SplitMix64: small, fast, and fixed by its definition.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The generator of body `index` of a run with `seed`, so that one body can be replayed
    /// without the ones before it.
    pub fn for_body(seed: u64, index: u64) -> Rng {
        let mut mix = Rng(seed ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03));
        Rng(mix.next() ^ index)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n`; `n` must not be 0.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True `percent` times in a hundred.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// The captured reviews, by name, sorted.
pub fn fixtures() -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("fixtures dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| {
            let name = p.file_name().expect("a file name").to_string_lossy();
            (name.into_owned(), std::fs::read(p).expect("fixture"))
        })
        .collect()
}

/// What bodies start from: every captured review as captured (indented) and compacted.
pub fn bases() -> Vec<(String, Vec<u8>)> {
    let mut bases = Vec::new();
    for (name, body) in fixtures() {
        bases.push((format!("{name} (compact)"), compact(&body)));
        bases.push((name, body));
    }
    bases
}

/// `body` without the whitespace between its tokens, as the API server sends a review; the
/// strings are kept byte for byte (escapes, key order and all).
pub fn compact(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len());
    let mut in_string = false;
    let mut escaped = false;
    for &b in body {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
        } else if b == b'"' {
            in_string = true;
        } else if matches!(b, b' ' | b'\n' | b'\t' | b'\r') {
            continue;
        }
        out.push(b);
    }
    out
}

/// `base` with one to four mutations.
pub fn mutate(base: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut body = base.to_vec();
    let edits = match rng.below(10) {
        0..=4 => 1,
        5..=7 => 2,
        8 => 3,
        _ => 4,
    };
    for _ in 0..edits {
        mutate_once(&mut body, rng);
    }
    body
}

/// Bytes JSON gives a meaning to, and bytes it refuses, for byte-level edits.
const INTERESTING_BYTES: &[u8] =
    b"{}[]\":,\\ \n\t\r0123456789-+.eEntfrulsa/\x00\x01\x0c\x1f\x7f\x80\xbf\xc3\xed\xf0\xff";

/// Field names the reader looks for, anywhere: renaming a key to one of them makes duplicates
/// and fields of the wrong type where the reader reads.
const FIELD_NAMES: &[&str] = &[
    "apiVersion",
    "kind",
    "request",
    "uid",
    "resource",
    "subResource",
    "name",
    "namespace",
    "operation",
    "userInfo",
    "username",
    "groups",
    "object",
    "oldObject",
    "dryRun",
    "group",
    "version",
    "metadata",
    "deletionTimestamp",
    "labels",
];

/// For each field the reader reads, values right and nearly right for it.
const FIELD_VALUES: &[(&str, &[&str])] = &[
    (
        "apiVersion",
        &[
            "\"admission.k8s.io/v1\"",
            "\"admission.k8s.io/v1beta1\"",
            "\"admission.k8s.io\\/v1\"",
            "\"admission.k8s.io/v2\"",
            "\"\"",
            "null",
        ],
    ),
    (
        "kind",
        &[
            "\"AdmissionReview\"",
            "\"Admission\\u0052eview\"",
            "\"AdmissionReviewList\"",
            "\"\"",
            "null",
            "{}",
        ],
    ),
    ("request", &["null", "{}", "[]", "\"\"", "{\"uid\":\"u\"}"]),
    (
        "uid",
        &["\"\"", "\"u\"", "\"\\u0075\"", "\"\\ud800\"", "null", "1"],
    ),
    (
        "resource",
        &[
            "{\"resource\":\"pods\"}",
            "{\"group\":\"\",\"resource\":\"pods\"}",
            "{}",
            "[\"\",\"v1\",\"pods\"]",
            "\"pods\"",
            "null",
            "{\"resource\":null}",
            "{\"resource\":\"locks\",\"group\":\"objectlock.dev\"}",
        ],
    ),
    (
        "subResource",
        &[
            "null",
            "\"\"",
            "\"status\"",
            "\"eviction\"",
            "\"st\\u0061tus\"",
            "1",
        ],
    ),
    (
        "name",
        &[
            "null",
            "\"\"",
            "\"locked-a\"",
            "\"web\"",
            "\"w\\u0065b\"",
            "5",
            "[]",
        ],
    ),
    (
        "namespace",
        &[
            "null",
            "\"\"",
            "\"lock-demo\"",
            "\"demo-015226\"",
            "\"prod\"",
            "false",
        ],
    ),
    (
        "operation",
        &[
            "\"CREATE\"",
            "\"UPDATE\"",
            "\"DELETE\"",
            "\"CONNECT\"",
            "\"PATCH\"",
            "\"delete\"",
            "\"DEL\\u0045TE\"",
            "\"\"",
            "null",
            "{\"DELETE\":null}",
            "0",
        ],
    ),
    (
        "userInfo",
        &[
            "{}",
            "null",
            "{\"username\":null}",
            "{\"groups\":null}",
            "{\"groups\":[\"a\",\"b\"]}",
            "[]",
        ],
    ),
    (
        "username",
        &["\"\"", "null", "\"system:admin\"", "\"\\u00e9\"", "[]"],
    ),
    (
        "groups",
        &[
            "[]",
            "null",
            "[\"\"]",
            "[\"a\",null]",
            "[\"a\",\"a\"]",
            "\"g\"",
            "{}",
        ],
    ),
    (
        "object",
        &[
            "null",
            "{}",
            "[]",
            "{\"metadata\":null}",
            "{\"metadata\":{}}",
            "{\"metadata\":{\"name\":\"web\"}}",
            "\"\"",
        ],
    ),
    (
        "oldObject",
        &[
            "null",
            "{}",
            "[]",
            "{\"metadata\":null}",
            "{\"metadata\":{}}",
            "{\"metadata\":{\"name\":\"locked-a\"}}",
            "1",
        ],
    ),
    ("dryRun", &["true", "false", "null", "\"true\"", "0", "[]"]),
    (
        "group",
        &["\"\"", "null", "\"apps\"", "\"objectlock.dev\"", "1"],
    ),
    ("version", &["\"\"", "null", "\"v1\"", "{}"]),
    (
        "metadata",
        &[
            "{}",
            "null",
            "[]",
            "{\"name\":null}",
            "{\"name\":\"x\",\"name\":\"y\"}",
            "{\"labels\":{}}",
        ],
    ),
    (
        "deletionTimestamp",
        &["null", "\"\"", "\"2026-11-22T01:52:29Z\"", "5", "{}"],
    ),
    (
        "labels",
        &[
            "{}",
            "null",
            "[]",
            "{\"a\":\"1\",\"a\":\"2\"}",
            "{\"a\":null}",
            "{\"a\":1}",
            "{\"\\u0061\":\"\\u0062\"}",
            "{\"a\":\"\\ud800\"}",
        ],
    ),
];

/// Values of every type, some nearly right where the reader reads a string.
const VALUES: &[&str] = &[
    "null",
    "true",
    "false",
    "0",
    "-1.5e3",
    "18446744073709551616",
    "\"\"",
    "\"x\"",
    "[]",
    "{}",
    "[\"\"]",
    "[null]",
    "{\"a\":null}",
    "{\"name\":\"x\"}",
    "\"CREATE\"",
    "\"UPDATE\"",
    "\"DELETE\"",
    "\"CONNECT\"",
    "\"PATCH\"",
    "\"delete\"",
    "\"admission.k8s.io/v1\"",
    "\"admission.k8s.io/v1beta1\"",
    "\"admission.k8s.io/v2\"",
    "\"AdmissionReview\"",
    "\"AdmissionReviewList\"",
    "\"locked-a\"",
    "\"status\"",
    "\"2026-11-22T01:52:29Z\"",
    "\"DEL\\u0045TE\"",
    "\"Admission\\u0052eview\"",
];

/// Numbers, valid and not.
const NUMBERS: &[&str] = &[
    "0",
    "-0",
    "1",
    "-1",
    "0.5",
    "-0.0",
    "1e5",
    "1E+5",
    "2.5e-3",
    "1e400",
    "-1e400",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775809",
    "123456789012345678901234567890",
    "01",
    "00",
    "1.",
    ".5",
    "-",
    "+1",
    "1e",
    "1e+",
    "1.e5",
    "0x10",
    "NaN",
    "Infinity",
    "1_000",
];

/// Escapes inserted into strings: valid ones (which serde_json decodes), and broken ones.
const ESCAPES: &[&str] = &[
    "\\u00e9",
    "\\u0041",
    "\\u002F",
    "\\u0000",
    "\\u001f",
    "\\u007f",
    "\\u2713",
    "\\ud83d\\ude00",
    "\\uD834\\uDD1E",
    "\\ud800",
    "\\udc00",
    "\\ud800\\u0041",
    "\\ud800\\ud800",
    "\\u12G4",
    "\\u12",
    "\\u",
    "\\x41",
    "\\/",
    "\\\"",
    "\\\\",
    "\\b",
    "\\f",
    "\\n",
    "\\r",
    "\\t",
    "\\a",
    "\\",
];

/// Raw text inserted into strings: UTF-8 of one to four bytes, control characters, and bytes
/// that are not UTF-8.
const RAW_IN_STRINGS: &[&[u8]] = &[
    "é".as_bytes(),
    "✓".as_bytes(),
    "😀".as_bytes(),
    b"\x7f",
    b"\x00",
    b"\x01",
    b"\t",
    b"\n",
    b"\x1f",
    b"\xff",
    b"\xc3",
    b"\xe2\x9c",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\xc0\xaf",
    b"\"",
];

/// Whitespace of JSON and not of JSON, inserted between tokens.
const SPACES: &[&[u8]] = &[
    b" ",
    b"\n",
    b"\t",
    b"\r",
    b"\r\n",
    b"  \n  ",
    b"\x0c",
    b"\x0b",
    b"\x00",
    b"\xc2\xa0",
    b"\xef\xbb\xbf",
];

/// Literals mangled.
const LITERALS: &[&str] = &[
    "nul",
    "nulll",
    "Null",
    "NULL",
    "tru",
    "True",
    "truee",
    "fals",
    "False",
    "nan",
    "undefined",
];

/// How deep a value is wrapped: around the reader's limit (100 open containers) and
/// serde_json's (128).
const DEPTHS: &[usize] = &[
    1, 2, 50, 90, 95, 96, 97, 98, 99, 100, 101, 126, 127, 128, 129, 200,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A string, quotes included (an unterminated one runs to the end).
    Str,
    /// A run of number-ish bytes.
    Num,
    /// A run of letters: `true`, `null`, garbage.
    Word,
    /// Any other single byte: `{`, `]`, `:`, `,`, and stray bytes.
    Punct,
}

#[derive(Debug, Clone, Copy)]
struct Token {
    kind: Kind,
    start: usize,
    end: usize,
}

/// The tokens of `body`, read tolerantly: whatever it holds, every non-whitespace byte is in
/// one token.
fn tokens(body: &[u8]) -> Vec<Token> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < body.len() {
        let start = i;
        let kind = match body[i] {
            b' ' | b'\n' | b'\t' | b'\r' => {
                i += 1;
                continue;
            }
            b'"' => {
                i += 1;
                while i < body.len() {
                    match body[i] {
                        b'\\' => i += 2,
                        b'"' => {
                            i += 1;
                            break;
                        }
                        _ => i += 1,
                    }
                }
                i = i.min(body.len());
                Kind::Str
            }
            b'-' | b'0'..=b'9' => {
                while i < body.len()
                    && matches!(body[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                Kind::Num
            }
            b'a'..=b'z' | b'A'..=b'Z' => {
                while i < body.len() && body[i].is_ascii_alphanumeric() {
                    i += 1;
                }
                Kind::Word
            }
            _ => {
                i += 1;
                Kind::Punct
            }
        };
        out.push(Token {
            kind,
            start,
            end: i,
        });
    }
    out
}

fn is_punct(body: &[u8], t: &Token, byte: u8) -> bool {
    t.kind == Kind::Punct && body[t.start] == byte
}

/// The token after which the value starting at token `i` ends: its matching bracket (by
/// count, tolerantly), or itself.
fn value_end(body: &[u8], toks: &[Token], i: usize) -> usize {
    if !(is_punct(body, &toks[i], b'{') || is_punct(body, &toks[i], b'[')) {
        return i;
    }
    let mut depth = 0usize;
    for (j, t) in toks.iter().enumerate().skip(i) {
        if is_punct(body, t, b'{') || is_punct(body, t, b'[') {
            depth += 1;
        } else if is_punct(body, t, b'}') || is_punct(body, t, b']') {
            depth -= 1;
            if depth == 0 {
                return j;
            }
        }
    }
    toks.len() - 1
}

/// The members of objects: `(key token, value's first token, value's last token)`.
fn members(body: &[u8], toks: &[Token]) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    for i in 0..toks.len().saturating_sub(2) {
        if toks[i].kind == Kind::Str && is_punct(body, &toks[i + 1], b':') {
            out.push((i, i + 2, value_end(body, toks, i + 2)));
        }
    }
    out
}

/// The members of objects, or half the time only those of the fields the reader reads (by
/// their keys), where it and serde_json could differ.
fn some_members(body: &[u8], toks: &[Token], rng: &mut Rng) -> Vec<(usize, usize, usize)> {
    let all = members(body, toks);
    if rng.percent(50) {
        let read: Vec<_> = all
            .iter()
            .copied()
            .filter(|&(key, _, _)| {
                let t = toks[key];
                body.get(t.start + 1..t.end.saturating_sub(1))
                    .is_some_and(|name| FIELD_NAMES.iter().any(|f| f.as_bytes() == name))
            })
            .collect();
        if !read.is_empty() {
            return read;
        }
    }
    all
}

/// The values that follow a `:` or sit in an array: `(first token, last token)`.
fn values(body: &[u8], toks: &[Token]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for i in 1..toks.len() {
        let after = [b':', b'[', b',']
            .iter()
            .any(|&p| is_punct(body, &toks[i - 1], p));
        let is_key =
            toks[i].kind == Kind::Str && toks.get(i + 1).is_some_and(|t| is_punct(body, t, b':'));
        if after && !is_key {
            out.push((i, value_end(body, toks, i)));
        }
    }
    out
}

fn splice(body: &mut Vec<u8>, start: usize, end: usize, with: &[u8]) {
    body.splice(start..end, with.iter().copied());
}

/// The tokens of one kind.
fn of_kind(toks: &[Token], kind: Kind) -> Vec<Token> {
    toks.iter().copied().filter(|t| t.kind == kind).collect()
}

/// A string's content re-escaped: some characters (or all) as `\uXXXX` (surrogate pairs
/// beyond the BMP), `/` as `\/`; what it means is unchanged.
fn escape_string(content: &str, rng: &mut Rng) -> String {
    let all = rng.percent(30);
    let mut out = String::new();
    for c in content.chars() {
        if !(all || rng.percent(25)) {
            push_plain(&mut out, c);
            continue;
        }
        match c {
            '/' if rng.percent(50) => out.push_str("\\/"),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    if rng.percent(50) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    } else {
                        out.push_str(&format!("\\u{unit:04X}"));
                    }
                }
            }
        }
    }
    out
}

/// A character as JSON writes it without `\u` escapes.
fn push_plain(out: &mut String, c: char) {
    match c {
        '"' => out.push_str("\\\""),
        '\\' => out.push_str("\\\\"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\u{8}' => out.push_str("\\b"),
        '\u{c}' => out.push_str("\\f"),
        c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
        c => out.push(c),
    }
}

/// A position inside a string's content, or `None` when `body` has no string.
fn inside_a_string(toks: &[Token], rng: &mut Rng) -> Option<usize> {
    let strings = of_kind(toks, Kind::Str);
    if strings.is_empty() {
        return None;
    }
    let s = rng.pick(&strings);
    // Between the quotes, ends included (a string of two bytes has one such place).
    let room = (s.end - s.start).saturating_sub(1).max(1);
    Some(s.start + 1 + rng.below(room))
}

fn mutate_once(body: &mut Vec<u8>, rng: &mut Rng) {
    if body.is_empty() {
        body.extend_from_slice(rng.pick(VALUES).as_bytes());
        return;
    }
    let toks = tokens(body);
    if toks.is_empty() {
        body.push(*rng.pick(INTERESTING_BYTES));
        return;
    }
    let byte = |rng: &mut Rng| {
        if rng.percent(60) {
            *rng.pick(INTERESTING_BYTES)
        } else {
            rng.next() as u8
        }
    };
    match rng.below(23) {
        // Byte level: overwrite, insert, remove one or a few.
        0 => {
            let at = rng.below(body.len());
            body[at] = byte(rng);
        }
        1 => {
            let at = rng.below(body.len() + 1);
            body.insert(at, byte(rng));
        }
        2 => {
            let at = rng.below(body.len());
            let len = (1 + rng.below(8)).min(body.len() - at);
            body.drain(at..at + len);
        }
        // A string re-escaped, meaning the same.
        3 | 4 => {
            let mut strings: Vec<Token> = some_members(body, &toks, rng)
                .into_iter()
                .filter(|&(_, first, last)| first == last && toks[first].kind == Kind::Str)
                .map(|(_, first, _)| toks[first])
                .collect();
            if strings.is_empty() || rng.percent(30) {
                strings = of_kind(&toks, Kind::Str);
            }
            if strings.is_empty() {
                return;
            }
            let s = rng.pick(&strings);
            let Some(quoted) = body.get(s.start..s.end) else {
                return;
            };
            let Ok(content) = serde_json::from_slice::<String>(quoted) else {
                return;
            };
            let escaped = format!("\"{}\"", escape_string(&content, rng));
            splice(body, s.start, s.end, escaped.as_bytes());
        }
        // An escape inserted into a string.
        5 => {
            if let Some(at) = inside_a_string(&toks, rng) {
                splice(body, at, at, rng.pick(ESCAPES).as_bytes());
            }
        }
        // Raw bytes inserted into a string.
        6 => {
            if let Some(at) = inside_a_string(&toks, rng) {
                let raw = rng.pick(RAW_IN_STRINGS);
                splice(body, at, at, raw);
            }
        }
        // A number changed.
        7 => {
            let numbers = of_kind(&toks, Kind::Num);
            let with = rng.pick(NUMBERS).as_bytes();
            match numbers.is_empty() {
                false => {
                    let n = rng.pick(&numbers);
                    splice(body, n.start, n.end, with);
                }
                true => replace_value(body, &toks, rng, with),
            }
        }
        // A member repeated, right after itself or at the end of its object, with its value or
        // another.
        8 | 9 => {
            let all = some_members(body, &toks, rng);
            if all.is_empty() {
                return;
            }
            let &(key, _, last) = rng.pick(&all);
            let (start, end) = (toks[key].start, toks[last].end);
            let mut copy = body[start..end].to_vec();
            if rng.percent(30) {
                let colon = toks[key + 1].end;
                copy.truncate(colon - start);
                copy.extend_from_slice(rng.pick(VALUES).as_bytes());
            }
            let mut member = b",".to_vec();
            member.extend_from_slice(&copy);
            splice(body, end, end, &member);
        }
        // A key renamed to a field the reader reads, or re-escaped.
        10 => {
            let all = members(body, &toks);
            if all.is_empty() {
                return;
            }
            let &(key, _, _) = rng.pick(&all);
            let name = rng.pick(FIELD_NAMES);
            let new = if rng.percent(25) {
                format!("\"{}\"", escape_string(name, rng))
            } else {
                format!("\"{name}\"")
            };
            splice(body, toks[key].start, toks[key].end, new.as_bytes());
        }
        // A value of another type, or nearly right.
        11 | 12 => {
            let with = rng.pick(VALUES).as_bytes();
            let all = some_members(body, &toks, rng);
            if all.is_empty() || rng.percent(30) {
                replace_value(body, &toks, rng, with);
            } else {
                let &(_, first, last) = rng.pick(&all);
                splice(body, toks[first].start, toks[last].end, with);
            }
        }
        // A field the reader reads given a value right or nearly right for it.
        20..=22 => {
            let all = some_members(body, &toks, rng);
            let fitting: Vec<(usize, usize, &[&str])> = all
                .iter()
                .filter_map(|&(key, first, last)| {
                    let t = toks[key];
                    let name = body.get(t.start + 1..t.end.saturating_sub(1))?;
                    let (_, values) = FIELD_VALUES.iter().find(|(f, _)| f.as_bytes() == name)?;
                    Some((first, last, *values))
                })
                .collect();
            if fitting.is_empty() {
                return;
            }
            let &(first, last, values) = rng.pick(&fitting);
            let with = rng.pick(values).as_bytes();
            splice(body, toks[first].start, toks[last].end, with);
        }
        // A member dropped, with its comma.
        13 => {
            let all = some_members(body, &toks, rng);
            if all.is_empty() {
                return;
            }
            let &(key, _, last) = rng.pick(&all);
            let (mut start, mut end) = (toks[key].start, toks[last].end);
            if key > 0 && is_punct(body, &toks[key - 1], b',') {
                start = toks[key - 1].start;
            } else if toks.get(last + 1).is_some_and(|t| is_punct(body, t, b',')) {
                end = toks[last + 1].end;
            }
            body.drain(start..end);
        }
        // Brackets and separators: one dropped, doubled, or swapped for another.
        14 => {
            let puncts: Vec<Token> = toks
                .iter()
                .copied()
                .filter(|t| t.kind == Kind::Punct && b"{}[]:,".contains(&body[t.start]))
                .collect();
            if puncts.is_empty() {
                return;
            }
            let p = rng.pick(&puncts);
            match rng.below(3) {
                0 => {
                    body.remove(p.start);
                }
                1 => body.insert(p.start, body[p.start]),
                _ => body[p.start] = *rng.pick(b"{}[]:,"),
            }
        }
        // A value wrapped in arrays or objects, around the depth limits.
        15 => {
            let all = values(body, &toks);
            if all.is_empty() {
                return;
            }
            let &(first, last) = rng.pick(&all);
            let depth = *rng.pick(DEPTHS);
            let (open, close): (&[u8], &[u8]) = if rng.percent(50) {
                (b"[", b"]")
            } else {
                (b"{\"a\":", b"}")
            };
            let (start, end) = (toks[first].start, toks[last].end);
            splice(body, end, end, &close.repeat(depth));
            splice(body, start, start, &open.repeat(depth));
        }
        // Whitespace, JSON's and not, between tokens.
        16 => {
            let t = rng.pick(&toks);
            let at = if rng.percent(50) { t.start } else { t.end };
            let space = rng.pick(SPACES);
            splice(body, at, at, space);
        }
        // A literal mangled.
        17 => {
            let words = of_kind(&toks, Kind::Word);
            let with = rng.pick(LITERALS).as_bytes();
            match words.is_empty() {
                false => {
                    let w = rng.pick(&words);
                    splice(body, w.start, w.end, with);
                }
                true => replace_value(body, &toks, rng, with),
            }
        }
        // The body cut short, or something before or after it.
        18 => {
            let at = rng.below(body.len());
            body.truncate(at);
        }
        _ => {
            let extra: &[&[u8]] = &[
                b"x",
                b"}",
                b"]",
                b"{}",
                b",",
                b"\x00",
                b" ",
                b"\n",
                b"null",
                b"\xef\xbb\xbf",
            ];
            let extra = *rng.pick(extra);
            if rng.percent(50) {
                body.extend_from_slice(extra);
            } else {
                splice(body, 0, 0, extra);
            }
        }
    }
}

/// One value (a member's or an array item) replaced with `with`.
fn replace_value(body: &mut Vec<u8>, toks: &[Token], rng: &mut Rng, with: &[u8]) {
    let all = values(body, toks);
    if all.is_empty() {
        return;
    }
    let &(first, last) = rng.pick(&all);
    splice(body, toks[first].start, toks[last].end, with);
}

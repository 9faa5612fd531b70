//! BERT tokenisation as Hugging Face's `BertTokenizer` does it: text
//! cleaning, CJK characters split out, optional lower-casing with accent
//! stripping, splitting on whitespace and punctuation, then greedy
//! longest-match WordPiece against `vocab.txt`, wrapped in `[CLS]`/`[SEP]`
//! and truncated to a maximum length. Pure Rust: the same crate runs in the
//! `bert_tokenizer` plugin (wasm32-wasip2) and natively (benchmarks).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use unicode_normalization::UnicodeNormalization;
use unicode_properties::{GeneralCategory, GeneralCategoryGroup, UnicodeGeneralCategory};

/// Words longer than this (in characters) become `[UNK]`, as in BERT.
const MAX_WORD_CHARS: usize = 100;

/// Fx-style multiplicative hash: the vocabulary is fixed at load, so
/// collision resistance buys nothing and SipHash costs a lot per lookup.
#[derive(Default, Clone, Copy)]
struct FxHasher(u64);

impl FxHasher {
    fn add(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        // Byte by byte rather than `copy_from_slice`: a variable-length copy
        // is a call out of the sandbox in WebAssembly (`memory.copy`).
        let mut tail = 0u64;
        for (i, &b) in chunks.remainder().iter().enumerate() {
            tail |= (b as u64) << (8 * i);
        }
        self.add(tail ^ bytes.len() as u64);
    }
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

type Vocab = HashMap<String, i64, BuildHasherDefault<FxHasher>>;

/// A WordPiece vocabulary with BERT's special tokens.
#[derive(Debug)]
pub struct Tokenizer {
    /// Word-initial pieces.
    vocab: Vocab,
    /// Continuation pieces (`##xyz` in vocab.txt), stored without the `##`
    /// so that lookups borrow the word instead of building each candidate.
    continuations: Vocab,
    unk: i64,
    cls: i64,
    sep: i64,
    lowercase: bool,
}

impl Tokenizer {
    /// Builds a tokenizer from `vocab.txt` (one token per line, id = line number).
    pub fn from_vocab(text: &str, lowercase: bool) -> Result<Tokenizer, String> {
        let mut vocab = Vocab::default();
        let mut continuations = Vocab::default();
        for (i, t) in text.lines().enumerate() {
            let t = t.trim_end_matches('\r');
            match t.strip_prefix("##") {
                Some(rest) if !rest.is_empty() => continuations.insert(rest.to_string(), i as i64),
                _ => vocab.insert(t.to_string(), i as i64),
            };
        }
        let special = |t: &str| {
            vocab
                .get(t)
                .copied()
                .ok_or_else(|| format!("vocab.txt has no '{t}' token"))
        };
        Ok(Tokenizer {
            unk: special("[UNK]")?,
            cls: special("[CLS]")?,
            sep: special("[SEP]")?,
            lowercase,
            vocab,
            continuations,
        })
    }

    /// Id of the padding token (`[PAD]`, 0 when absent).
    pub fn pad_id(&self) -> i64 {
        self.vocab.get("[PAD]").copied().unwrap_or(0)
    }

    /// Token ids of one text: `[CLS] pieces... [SEP]`, at most `max_len` ids (>= 2).
    pub fn encode(&self, text: &str, max_len: usize) -> Vec<i64> {
        let limit = max_len.max(2) - 1;
        let mut ids = Vec::with_capacity(limit.min(text.len() + 2) + 1);
        ids.push(self.cls);
        let mut word = String::new();
        let bytes = text.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            if ids.len() >= limit {
                break;
            }
            let b = bytes[i];
            if b.is_ascii() {
                // Fast path with the same result as the Unicode rules below,
                // a run of word characters at a time.
                match b {
                    b' ' | b'\t' | b'\n' | b'\r' => self.flush(&mut word, &mut ids, limit),
                    b'\0'..=b'\x1f' | b'\x7f' => {}
                    b if b.is_ascii_punctuation() => {
                        self.flush(&mut word, &mut ids, limit);
                        self.piece_ids(&text[i..i + 1], &mut ids, limit);
                    }
                    _ => {
                        let start = i;
                        while i < bytes.len() && is_ascii_word_byte(bytes[i]) {
                            i += 1;
                        }
                        let run = &text[start..i];
                        let lower = self.lowercase && run.bytes().any(|b| b.is_ascii_uppercase());
                        // The word ends here unless a control character (dropped) or
                        // a non-ASCII character follows.
                        let ends = bytes.get(i).is_none_or(|&n| {
                            matches!(n, b' ' | b'\t' | b'\n' | b'\r') || n.is_ascii_punctuation()
                        });
                        if word.is_empty() && ends && !lower {
                            self.piece_ids(run, &mut ids, limit);
                        } else {
                            let from = word.len();
                            word.push_str(run);
                            if lower {
                                word[from..].make_ascii_lowercase();
                            }
                        }
                        continue;
                    }
                }
                i += 1;
                continue;
            }
            let c = text[i..].chars().next().expect("a character starts here");
            i += c.len_utf8();
            let cp = c as u32;
            if cp == 0xFFFD || is_control(c) {
                continue;
            }
            if is_whitespace(c) {
                self.flush(&mut word, &mut ids, limit);
                continue;
            }
            if is_cjk(cp) {
                self.flush(&mut word, &mut ids, limit);
                word.push(c);
                self.flush(&mut word, &mut ids, limit);
                continue;
            }
            let push = |d: char, word: &mut String, ids: &mut Vec<i64>| {
                if is_punctuation(d) {
                    self.flush(word, ids, limit);
                    word.push(d);
                    self.flush(word, ids, limit);
                } else {
                    word.push(d);
                }
            };
            if self.lowercase {
                for l in c.to_lowercase() {
                    for d in std::iter::once(l).nfd() {
                        if d.general_category() != GeneralCategory::NonspacingMark {
                            push(d, &mut word, &mut ids);
                        }
                    }
                }
            } else {
                push(c, &mut word, &mut ids);
            }
        }
        self.flush(&mut word, &mut ids, limit);
        ids.truncate(limit);
        ids.push(self.sep);
        ids
    }

    /// Ends the current word: its WordPiece ids go to `ids` (while under `limit`).
    fn flush(&self, word: &mut String, ids: &mut Vec<i64>, limit: usize) {
        if !word.is_empty() {
            self.piece_ids(word, ids, limit);
        }
        word.clear();
    }

    /// WordPiece ids of a complete word, while `ids` is under `limit`.
    fn piece_ids(&self, word: &str, ids: &mut Vec<i64>, limit: usize) {
        if ids.len() < limit {
            self.wordpiece(word, ids);
        }
    }

    /// Greedy longest-match-first WordPiece of one word, appended to `out`.
    fn wordpiece(&self, word: &str, out: &mut Vec<i64>) {
        if word.len() > MAX_WORD_CHARS && word.chars().count() > MAX_WORD_CHARS {
            out.push(self.unk);
            return;
        }
        let mark = out.len();
        let mut start = 0;
        while start < word.len() {
            let table = if start == 0 {
                &self.vocab
            } else {
                &self.continuations
            };
            let mut end = word.len();
            let found = loop {
                if let Some(&id) = table.get(&word[start..end]) {
                    break Some(id);
                }
                match word[start..end].char_indices().next_back() {
                    Some((last, _)) if last > 0 => end = start + last,
                    _ => break None,
                }
            };
            match found {
                Some(id) => out.push(id),
                None => {
                    out.truncate(mark);
                    out.push(self.unk);
                    return;
                }
            }
            start = end;
        }
    }
}

/// ASCII bytes that continue a word: not whitespace, control or punctuation.
fn is_ascii_word_byte(b: u8) -> bool {
    b > b' ' && b != b'\x7f' && b.is_ascii() && !b.is_ascii_punctuation()
}

fn is_whitespace(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r') || c.general_category() == GeneralCategory::SpaceSeparator
}

fn is_control(c: char) -> bool {
    if matches!(c, '\t' | '\n' | '\r') {
        return false;
    }
    matches!(
        c.general_category(),
        GeneralCategory::Control | GeneralCategory::Format
    )
}

fn is_punctuation(c: char) -> bool {
    let cp = c as u32;
    (33..=47).contains(&cp)
        || (58..=64).contains(&cp)
        || (91..=96).contains(&cp)
        || (123..=126).contains(&cp)
        || c.general_category_group() == GeneralCategoryGroup::Punctuation
}

fn is_cjk(cp: u32) -> bool {
    (0x4E00..=0x9FFF).contains(&cp)
        || (0x3400..=0x4DBF).contains(&cp)
        || (0x20000..=0x2A6DF).contains(&cp)
        || (0x2A700..=0x2B73F).contains(&cp)
        || (0x2B740..=0x2B81F).contains(&cp)
        || (0x2B820..=0x2CEAF).contains(&cp)
        || (0xF900..=0xFAFF).contains(&cp)
        || (0x2F800..=0x2FA1F).contains(&cp)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VOCAB: &str =
        "[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n,\nworld\n!\nun\n##aff\n##able\ncafe\n中\n";

    fn tok() -> Tokenizer {
        Tokenizer::from_vocab(VOCAB, true).unwrap()
    }

    #[test]
    fn basic_and_wordpiece() {
        let t = tok();
        assert_eq!(t.encode("Hello, World!", 16), vec![2, 4, 5, 6, 7, 3]);
        assert_eq!(t.encode("unaffable", 16), vec![2, 8, 9, 10, 3]);
        // Accents stripped when lower-casing; unknown words are [UNK]; CJK split.
        assert_eq!(t.encode("Café xyz 中", 16), vec![2, 11, 1, 12, 3]);
        // Control characters dropped, odd whitespace splits.
        assert_eq!(t.encode("hello\u{0007}\u{00A0}world", 16), vec![2, 4, 6, 3]);
        // ASCII runs: upper case folded, a dropped control character joins
        // the halves, a non-ASCII letter continues the word.
        assert_eq!(t.encode("HeLLo,WORLD!", 16), vec![2, 4, 5, 6, 7, 3]);
        assert_eq!(t.encode("un\u{0001}affable", 16), vec![2, 8, 9, 10, 3]);
        assert_eq!(t.encode("CAFÉ caf\u{00E9}", 16), vec![2, 11, 11, 3]);
        assert_eq!(t.encode("xyzé hello", 16), vec![2, 1, 4, 3]);
    }

    #[test]
    fn truncation_keeps_cls_and_sep() {
        let t = tok();
        assert_eq!(t.encode("hello world hello world", 4), vec![2, 4, 6, 3]);
        assert_eq!(t.encode("", 8), vec![2, 3]);
        assert_eq!(t.encode("unaffable", 3), vec![2, 8, 3]);
    }

    #[test]
    fn vocab_without_specials_is_an_error() {
        assert!(Tokenizer::from_vocab("a\nb\n", true)
            .unwrap_err()
            .contains("[UNK]"));
    }
}

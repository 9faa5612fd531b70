//! BERT tokenisation as Hugging Face's `BertTokenizer` does it: text
//! cleaning, CJK characters split out, optional lower-casing with accent
//! stripping, splitting on whitespace and punctuation, then greedy
//! longest-match WordPiece against `vocab.txt`, wrapped in `[CLS]`/`[SEP]`
//! and truncated to a maximum length. Pure Rust: the same crate runs in the
//! `bert_tokenizer` plugin (wasm32-wasip2) and natively (benchmarks).

mod table;

use unicode_normalization::UnicodeNormalization;
use unicode_properties::{GeneralCategory, GeneralCategoryGroup, UnicodeGeneralCategory};

use table::Table;

/// Words longer than this (in characters) become `[UNK]`, as in BERT.
const MAX_WORD_CHARS: usize = 100;

/// Classes of ASCII bytes ([`CLASS`]); 0 for bytes >= 0x80.
const WORD: u8 = 1;
const SPACE: u8 = 2;
const PUNCT: u8 = 4;
const DROPPED: u8 = 8;
const UPPER: u8 = 16;

/// What BERT's basic tokenizer does with each ASCII byte, one load per byte.
const CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 128 {
        let c = b as u8;
        t[b] = match c {
            b' ' | b'\t' | b'\n' | b'\r' => SPACE,
            b'\0'..=b'\x1f' | b'\x7f' => DROPPED,
            _ if c.is_ascii_punctuation() => PUNCT,
            _ if c.is_ascii_uppercase() => WORD | UPPER,
            _ => WORD,
        };
        b += 1;
    }
    t
};

/// A WordPiece vocabulary with BERT's special tokens.
#[derive(Debug)]
pub struct Tokenizer {
    /// Word-initial pieces.
    vocab: Table,
    /// Continuation pieces (`##xyz` in vocab.txt), stored without the `##`
    /// so that lookups borrow the word instead of building each candidate.
    continuations: Table,
    /// The id of each ASCII punctuation character as a word of its own.
    punct: [i64; 128],
    /// [`Action`] of U+0080..U+07FF (Latin, Greek, Cyrillic, Hebrew,
    /// Arabic...), computed once instead of per character.
    common: Vec<Action>,
    unk: i64,
    cls: i64,
    sep: i64,
    pad: i64,
    lowercase: bool,
}

impl Tokenizer {
    /// Builds a tokenizer from `vocab.txt` (one token per line, id = line number).
    pub fn from_vocab(text: &str, lowercase: bool) -> Result<Tokenizer, String> {
        let lines: Vec<&str> = text.lines().map(|t| t.trim_end_matches('\r')).collect();
        if lines.len() > u32::MAX as usize {
            return Err("vocab.txt has too many lines".into());
        }
        let mut vocab = Vec::new();
        let mut continuations = Vec::new();
        for (i, t) in lines.iter().enumerate() {
            match t.strip_prefix("##") {
                Some(rest) if !rest.is_empty() => continuations.push((rest, i as u32)),
                _ => vocab.push((*t, i as u32)),
            }
        }
        let vocab = Table::build(&vocab)?;
        let continuations = Table::build(&continuations)?;
        let special = |t: &str| {
            vocab
                .get(t.as_bytes())
                .map(i64::from)
                .ok_or_else(|| format!("vocab.txt has no '{t}' token"))
        };
        let unk = special("[UNK]")?;
        let mut punct = [unk; 128];
        for (b, id) in punct.iter_mut().enumerate() {
            if CLASS[b] & PUNCT != 0 {
                if let Some(v) = vocab.get(&[b as u8]) {
                    *id = v.into();
                }
            }
        }
        Ok(Tokenizer {
            unk,
            cls: special("[CLS]")?,
            sep: special("[SEP]")?,
            pad: special("[PAD]").unwrap_or(0),
            punct,
            common: (0x80..0x800u32)
                .map(|cp| char::from_u32(cp).map_or(Action::Drop, |c| Action::of(c, lowercase)))
                .collect(),
            lowercase,
            vocab,
            continuations,
        })
    }

    /// Id of the padding token (`[PAD]`, 0 when absent).
    pub fn pad_id(&self) -> i64 {
        self.pad
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
            let class = CLASS[bytes[i] as usize];
            if class != 0 {
                // ASCII: the same result as the Unicode rules below, a run of
                // word characters at a time.
                if class & WORD == 0 {
                    if class & (SPACE | PUNCT) != 0 {
                        self.flush(&mut word, &mut ids, limit);
                    }
                    if class & PUNCT != 0 && ids.len() < limit {
                        ids.push(self.punct[bytes[i] as usize]);
                    }
                    i += 1;
                    continue;
                }
                let start = i;
                let mut seen = 0;
                while i < bytes.len() && CLASS[bytes[i] as usize] & WORD != 0 {
                    seen |= CLASS[bytes[i] as usize];
                    i += 1;
                }
                let run = &text[start..i];
                let lower = self.lowercase && seen & UPPER != 0;
                // The word ends here unless a control character (dropped) or
                // a non-ASCII character follows.
                let ends = bytes
                    .get(i)
                    .is_none_or(|&n| CLASS[n as usize] & (SPACE | PUNCT) != 0);
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
            let c = text[i..].chars().next().expect("a character starts here");
            i += c.len_utf8();
            let action = match self.common.get(c as usize - 0x80) {
                Some(&a) => a,
                None => Action::of(c, self.lowercase),
            };
            match action {
                Action::Drop => {}
                Action::Space => self.flush(&mut word, &mut ids, limit),
                Action::Alone => self.push(c, true, &mut word, &mut ids, limit),
                Action::Chars { n, punct, chars } => {
                    for (k, &d) in chars[..n as usize].iter().enumerate() {
                        self.push(d, punct & (1 << k) != 0, &mut word, &mut ids, limit);
                    }
                }
                Action::Many => {
                    for d in normalised(c, self.lowercase) {
                        self.push(d, is_punctuation(d), &mut word, &mut ids, limit);
                    }
                }
            }
        }
        self.flush(&mut word, &mut ids, limit);
        ids.truncate(limit);
        ids.push(self.sep);
        ids
    }

    /// Adds `c` to the current word, or as a word of its own when `alone`
    /// (punctuation, CJK).
    fn push(&self, c: char, alone: bool, word: &mut String, ids: &mut Vec<i64>, limit: usize) {
        if alone {
            self.flush(word, ids, limit);
            word.push(c);
            self.flush(word, ids, limit);
        } else {
            word.push(c);
        }
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
        let bytes = word.as_bytes();
        let mark = out.len();
        let mut start = 0;
        while start < bytes.len() {
            let table = if start == 0 {
                &self.vocab
            } else {
                &self.continuations
            };
            // No piece is longer than the table's longest key: start there.
            let mut end = bytes.len().min(start + table.max_key());
            while !word.is_char_boundary(end) {
                end -= 1;
            }
            let found = loop {
                if end == start {
                    break None;
                }
                if let Some(id) = table.get(&bytes[start..end]) {
                    break Some(id);
                }
                end -= 1;
                while !word.is_char_boundary(end) {
                    end -= 1;
                }
            };
            match found {
                Some(id) => out.push(id.into()),
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

/// What the basic tokenizer does with one non-ASCII character.
#[derive(Debug, Clone, Copy)]
enum Action {
    /// Control characters and U+FFFD are dropped.
    Drop,
    /// Whitespace ends the word.
    Space,
    /// CJK ideographs are words of their own.
    Alone,
    /// The character after lower-casing and accent stripping (when
    /// lower-casing): up to three characters, bit k of `punct` set when
    /// `chars[k]` is punctuation (a word of its own).
    Chars { n: u8, punct: u8, chars: [char; 3] },
    /// More than three characters: [`normalised`] each time.
    Many,
}

impl Action {
    fn of(c: char, lowercase: bool) -> Action {
        let cp = c as u32;
        if cp == 0xFFFD || is_control(c) {
            return Action::Drop;
        }
        if is_whitespace(c) {
            return Action::Space;
        }
        if is_cjk(cp) {
            return Action::Alone;
        }
        let (mut n, mut punct, mut chars) = (0u8, 0u8, [c; 3]);
        for d in normalised(c, lowercase) {
            if n == 3 {
                return Action::Many;
            }
            chars[n as usize] = d;
            if is_punctuation(d) {
                punct |= 1 << n;
            }
            n += 1;
        }
        Action::Chars { n, punct, chars }
    }
}

/// `c` lower-cased and without accents (non-spacing marks after NFD) when
/// `lowercase`, else `c` itself.
fn normalised(c: char, lowercase: bool) -> impl Iterator<Item = char> {
    let (lower, keep) = if lowercase {
        (Some(c.to_lowercase()), None)
    } else {
        (None, Some(c))
    };
    lower
        .into_iter()
        .flatten()
        .flat_map(|l| std::iter::once(l).nfd())
        .filter(|d| d.general_category() != GeneralCategory::NonspacingMark)
        .chain(keep)
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

//! BERT tokenisation as Hugging Face's `BertTokenizer` does it: text
//! cleaning, CJK characters split out, optional lower-casing with accent
//! stripping, splitting on whitespace and punctuation, then greedy
//! longest-match WordPiece against `vocab.txt`, wrapped in `[CLS]`/`[SEP]`
//! and truncated to a maximum length. Pure Rust: the same crate runs in the
//! `bert_tokenizer` plugin (wasm32-wasip2) and natively (benchmarks).

use std::collections::HashMap;

use unicode_normalization::UnicodeNormalization;
use unicode_properties::{GeneralCategory, GeneralCategoryGroup, UnicodeGeneralCategory};

/// Words longer than this (in characters) become `[UNK]`, as in BERT.
const MAX_WORD_CHARS: usize = 100;

/// A WordPiece vocabulary with BERT's special tokens.
#[derive(Debug)]
pub struct Tokenizer {
    vocab: HashMap<String, i64>,
    unk: i64,
    cls: i64,
    sep: i64,
    lowercase: bool,
}

impl Tokenizer {
    /// Builds a tokenizer from `vocab.txt` (one token per line, id = line number).
    pub fn from_vocab(text: &str, lowercase: bool) -> Result<Tokenizer, String> {
        let vocab: HashMap<String, i64> = text
            .lines()
            .enumerate()
            .map(|(i, t)| (t.trim_end_matches('\r').to_string(), i as i64))
            .collect();
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
        })
    }

    /// Id of the padding token (`[PAD]`, 0 when absent).
    pub fn pad_id(&self) -> i64 {
        self.vocab.get("[PAD]").copied().unwrap_or(0)
    }

    /// Token ids of one text: `[CLS] pieces... [SEP]`, at most `max_len` ids (>= 2).
    pub fn encode(&self, text: &str, max_len: usize) -> Vec<i64> {
        let max_len = max_len.max(2);
        let mut ids = vec![self.cls];
        for word in self.words(text) {
            if ids.len() >= max_len - 1 {
                break;
            }
            self.wordpiece(&word, &mut ids);
        }
        ids.truncate(max_len - 1);
        ids.push(self.sep);
        ids
    }

    /// Basic tokenisation: cleaned, normalised words and punctuation marks.
    fn words(&self, text: &str) -> Vec<String> {
        let mut words = Vec::new();
        let mut current = String::new();
        let flush = |current: &mut String, words: &mut Vec<String>| {
            if !current.is_empty() {
                words.push(std::mem::take(current));
            }
        };
        for c in text.chars() {
            let cp = c as u32;
            if cp == 0 || cp == 0xFFFD || is_control(c) {
                continue;
            }
            if is_whitespace(c) {
                flush(&mut current, &mut words);
                continue;
            }
            if is_cjk(cp) {
                flush(&mut current, &mut words);
                words.push(c.to_string());
                continue;
            }
            let push_normalised = |current: &mut String, words: &mut Vec<String>, c: char| {
                if is_punctuation(c) {
                    flush(current, words);
                    words.push(c.to_string());
                } else {
                    current.push(c);
                }
            };
            if self.lowercase {
                for l in c.to_lowercase() {
                    for d in std::iter::once(l).nfd() {
                        if d.general_category() != GeneralCategory::NonspacingMark {
                            push_normalised(&mut current, &mut words, d);
                        }
                    }
                }
            } else {
                push_normalised(&mut current, &mut words, c);
            }
        }
        flush(&mut current, &mut words);
        words
    }

    /// Greedy longest-match-first WordPiece of one word, appended to `out`.
    fn wordpiece(&self, word: &str, out: &mut Vec<i64>) {
        let chars: Vec<(usize, char)> = word.char_indices().collect();
        if chars.len() > MAX_WORD_CHARS {
            out.push(self.unk);
            return;
        }
        let mark = out.len();
        let mut start = 0;
        let mut piece = String::new();
        while start < chars.len() {
            let mut end = chars.len();
            let mut found = None;
            while start < end {
                piece.clear();
                if start > 0 {
                    piece.push_str("##");
                }
                let from = chars[start].0;
                let to = chars.get(end).map_or(word.len(), |c| c.0);
                piece.push_str(&word[from..to]);
                if let Some(&id) = self.vocab.get(piece.as_str()) {
                    found = Some(id);
                    break;
                }
                end -= 1;
            }
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

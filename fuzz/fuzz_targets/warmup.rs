//! Warmup: a config's `model_warmup` samples and the files under the model's
//! `warmup/` folder they name, through the server's
//! `scheduler::warmup::samples` (after the repository's parse, normalise
//! and validate).
//!
//! Input: two bytes (little-endian) give the length of the config text that
//! follows; the rest is the content of every `input_data_file` it names.
//!
//! Invariants: every sample's tensors have data of the size their shape and
//! type say, no larger than the 1 GiB warmup limit. Samples over 16 MiB are
//! not built (slow by design, not a finding: their refusal is still run).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tern::scheduler::warmup::samples;
use tern_core::config::parse_pbtxt;
use tern_core::tensor::element_count;
use tern_core::DataType;
use tern_fuzz::take_u16;

const BUILT: usize = 16 << 20;
const LIMIT: usize = 1 << 30;

fuzz_target!(|data: &[u8]| {
    let (n, rest) = take_u16(data);
    let n = usize::from(n).min(rest.len());
    let Ok(text) = std::str::from_utf8(&rest[..n]) else {
        return;
    };
    let file = &rest[n..];
    let Ok(cfg) = parse_pbtxt(text) else { return };
    let Some(cfg) = tern_fuzz::check_config(cfg, 0) else {
        return;
    };
    // Sizes as `sample_input` computes them.
    for w in &cfg.model_warmup {
        for input in w.inputs.values() {
            let mut shape = input.dims.clone();
            if cfg.max_batch_size > 0 {
                shape.insert(0, i64::from(w.batch_size));
            }
            let bytes = element_count(&shape).saturating_mul(
                4.max(
                    DataType::from_config(input.data_type)
                        .ok()
                        .and_then(|d| d.size())
                        .unwrap_or(4),
                ),
            );
            if bytes > BUILT && bytes <= LIMIT {
                return;
            }
        }
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let warmup = dir.path().join("warmup");
    std::fs::create_dir(&warmup).expect("warmup dir");
    for w in &cfg.model_warmup {
        for input in w.inputs.values() {
            if let Some(tern_core::config::pb::model_warmup::input::InputDataType::InputDataFile(
                f,
            )) = &input.input_data_type
            {
                let simple = !f.is_empty()
                    && f != "."
                    && f != ".."
                    && f.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
                if simple {
                    let _ = std::fs::write(warmup.join(f), file);
                }
            }
        }
    }
    let Ok(samples) = samples(&cfg, dir.path()) else {
        return;
    };
    assert_eq!(samples.len(), cfg.model_warmup.len());
    for s in &samples {
        assert!(s.count >= 1);
        for t in &s.request.inputs {
            t.check_data_size()
                .unwrap_or_else(|e| panic!("sample '{}': {}", s.name, e.message));
            assert!(t.data.len() <= LIMIT);
        }
    }
});

//! `config.pbtxt` text (a model folder may come from anywhere once models
//! are delivered remotely) through the server's `parse_pbtxt`, then what the
//! repository does with it: `normalize`, `validate`, `check_supported`
//! (`tern_fuzz::check_config`, with its invariants).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tern_core::config::parse_pbtxt;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(cfg) = parse_pbtxt(text) {
        tern_fuzz::check_config(cfg, data.len() % 2);
    }
});

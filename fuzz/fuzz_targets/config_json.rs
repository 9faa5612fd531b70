//! JSON model configs, as the load API's `config` parameter carries them,
//! through the server's `config::json::from_json`, then what the repository
//! does with a config (`tern_fuzz::check_config`, with its invariants).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tern_core::config::json::from_json;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(cfg) = from_json(text) {
        tern_fuzz::check_config(cfg, data.len() % 2);
    }
});

#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| cachet_api::fuzz::tool_calls(data));

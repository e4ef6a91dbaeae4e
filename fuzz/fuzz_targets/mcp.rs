#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| model_gateway::fuzz::mcp(data));

#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| gateway_control_plane::fuzz::request_bodies(data));

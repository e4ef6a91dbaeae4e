//! The benchmark's two requests served again and again, for counting what the core allocates
//! (issue 48): `bench/allocations.py` runs this under valgrind's dhat twice, with two request
//! counts, and gives the allocations per request by the code that made them. Ignored in the
//! suite: it is a profile, though it checks each request is served as the benchmark's is.

use super::*;
use crate::unit_tests::test;

/// The benchmark's chat request and its mock provider's answer (bench/bench.py).
const BENCH_REQUEST: &[u8] = br#"{"model": "bench-model", "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]}"#;
const BENCH_ANSWER: &[u8] = br#"{"id": "chatcmpl-bench", "object": "chat.completion", "created": 1700000000, "model": "bench-model", "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello from the mock."}, "logprobs": null, "finish_reason": "stop"}], "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}}"#;

/// `ALLOCATIONS_REQUESTS` requests (default 100), each with provider headers, or with
/// `ALLOCATIONS_CACHE_HIT` set a one-target config with the cache on (every request after the
/// first answered from the cache), with the control plane on (records queued).
#[test]
#[ignore = "a profile for bench/allocations.py"]
fn the_benchmarks_requests_served_for_counting_allocations() {
    let cache_hit = std::env::var_os("ALLOCATIONS_CACHE_HIT").is_some();
    let requests: u32 = std::env::var("ALLOCATIONS_REQUESTS").ok().and_then(|n| n.parse().ok()).unwrap_or(100);
    let mut gw = Gateway::new(
        r#"{"api_keys": ["gw-key"], "cache": {"byte_budget": 1048576, "max_entry_bytes": 65536},
            "control_plane": {"cluster": "gateway_control_plane", "authority": "127.0.0.1:8790", "token": "t"}}"#,
    );
    let target = json!({"provider": "openai", "api_key": "sk-bench", "custom_host": "http://127.0.0.1:9000/v1",
                        "cache": {"mode": "simple"}});
    let length = BENCH_ANSWER.len().to_string();
    for id in 1..=requests {
        let headers = if cache_hit { chat_with_config("gw-key", &target) } else { openai_chat() };
        let routed = gw.post(id, headers, BENCH_REQUEST).action == Action::Continue;
        assert_eq!(routed, !cache_hit || id == 1, "request {id}: routed only when not in the cache");
        if routed {
            let head = [("content-type", "application/json"), ("content-length", length.as_str())];
            gw.response_headers(id, 200, &head, "via_upstream");
            gw.response_body(id, BENCH_ANSWER, true);
        }
        assert_eq!(gw.finished(id).map(|record| record.status), Some(200));
        gw.io.writes.clear();
        gw.io.sent.clear();
        gw.io.streams.clear();
    }
}

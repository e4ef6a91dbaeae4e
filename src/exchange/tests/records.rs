//! Request logs as the control plane gets them: finished requests' records queued per worker
//! and shipped in batches from the root's timer, retried when the control plane is down,
//! dropped (and counted) past the bound or when refused, never delaying an answer.

use super::*;
use crate::unit_tests::test;

const CP: &str = r#"{"api_keys": ["gw-key"],
    "control_plane": {"cluster": "gateway_control_plane", "authority": "127.0.0.1:8790", "token": "cp-secret",
                      "fresh_ms": 5000, "grace_ms": 600000, "timeout_ms": 3000}}"#;

/// The root context's id in these stories.
const ROOT: u32 = 0;

/// Request `id` is served straight through (its answer never waits for anything), then ends.
fn served(gw: &mut Gateway, id: u32, trace: &str) -> Record {
    let mut headers = openai_chat();
    headers.push(("x-gateway-trace-id".to_string(), trace.as_bytes().to_vec()));
    let calls = gw.io.sent.len();
    let length = COMPLETION.len().to_string();
    assert_eq!(gw.post(id, headers, CHAT), Output::proceed(), "the request goes on at once");
    assert_eq!(
        gw.response_headers(
            id,
            200,
            &[("content-type", "application/json"), ("content-length", &length)],
            "via_upstream"
        ),
        Output::proceed()
    );
    assert_eq!(gw.response_body(id, COMPLETION, true), Output::proceed());
    assert_eq!(gw.client_body(id), COMPLETION, "the answer is the provider's");
    assert_eq!(gw.io.sent.len(), calls, "no call on the request's way");
    gw.finished(id).unwrap()
}

/// Record batches sent so far: (token, the records shipped).
fn batches(gw: &Gateway) -> Vec<(u32, Vec<Value>)> {
    gw.io
        .sent
        .iter()
        .filter(|s| s.header(":path") == Some("/internal/v1/records"))
        .map(|s| {
            let body: Value = serde_json::from_slice(&s.call.body).unwrap();
            (s.token, body["records"].as_array().unwrap().clone())
        })
        .collect()
}

fn traces(records: &[Value]) -> Vec<&str> {
    records.iter().map(|r| r["trace_id"].as_str().unwrap()).collect()
}

fn dropped(gw: &Gateway) -> u64 {
    gw.io.metrics.iter().filter(|(_, name, _)| name == metrics::RECORDS_DROPPED).map(|(_, _, v)| v).sum()
}

#[test]
fn records_wait_a_second_then_go_in_one_batch_with_the_token_and_the_timer_stops() {
    let mut gw = Gateway::new(CP);
    let start = gw.io.host.now_ms.get();
    let record = served(&mut gw, 1, "t-1");
    assert_eq!(record.workspace, "default");
    assert_eq!(gw.io.ticks, vec![1000], "the first record waiting sets the timer");
    gw.advance_clock(300);
    served(&mut gw, 2, "t-2");
    assert_eq!(gw.io.ticks.len(), 1, "a second record needs no host call");
    assert!(batches(&gw).is_empty());

    gw.advance_clock(700);
    assert_eq!(gw.tick(), Output::proceed());
    let [(token, records)] = batches(&gw).try_into().unwrap();
    assert_eq!(traces(&records), ["t-1", "t-2"]);
    let call = gw.io.sent.last().unwrap();
    assert_eq!(call.id, ROOT, "dispatched on the root context");
    assert_eq!(call.call.cluster, "gateway_control_plane");
    assert_eq!(call.header(":method"), Some("POST"));
    assert_eq!(call.header(":authority"), Some("127.0.0.1:8790"));
    assert_eq!(call.header("authorization"), Some("Bearer cp-secret"));
    assert_eq!(call.header("content-type"), Some("application/json"));
    assert_eq!(call.header("content-length"), Some(call.call.body.len().to_string().as_str()));
    assert_eq!(call.call.timeout_ms, 3000);
    // Each record is the access-log object plus its arrival time and id (two random u64s).
    let mut expected: Value = serde_json::from_slice(&record.to_json()).unwrap();
    expected["timestamp_ms"] = json!(start);
    expected["record_id"] = json!("0000000f42400000000000000007");
    assert_eq!(records[0], expected);
    assert_eq!(
        (records[0]["workspace"].clone(), records[1]["timestamp_ms"].clone()),
        (json!("default"), json!(start + 300))
    );
    assert_eq!(gw.io.ticks.last(), Some(&0), "in flight, nothing else waits: no ticks");

    assert_eq!(gw.answer(token, 202, &[], br#"{"accepted": 2}"#), Output::proceed());
    assert_eq!(gw.io.ticks.last(), Some(&0), "idle: no ticks");
    gw.advance_clock(5000);
    gw.tick();
    assert_eq!(batches(&gw).len(), 1, "nothing sent twice");
    assert_eq!(dropped(&gw), 0);
    let defined = gw.io.metrics.iter().filter(|(_, name, _)| name == metrics::RECORDS_DROPPED).count();
    assert_eq!(defined, 1, "the drop counter shows at 0 once records are shipped");
}

#[test]
fn five_hundred_waiting_records_leave_at_the_next_tick_and_one_batch_at_a_time() {
    let mut gw = Gateway::new(CP);
    for id in 1..=500 {
        served(&mut gw, id, &format!("t-{id}"));
    }
    assert_eq!(gw.io.ticks, vec![1000, 1], "the 500th record asks for a tick at once");
    gw.advance_clock(1);
    gw.tick();
    let [(token, records)] = batches(&gw).try_into().unwrap();
    assert_eq!(records.len(), 500);

    // More finish while the batch is in flight: they wait for its answer.
    for id in 501..=650 {
        served(&mut gw, id, &format!("t-{id}"));
    }
    gw.advance_clock(2000);
    gw.tick();
    assert_eq!(batches(&gw).len(), 1, "one batch in flight per worker");
    gw.answer(token, 200, &[], b"{}");
    assert_eq!(gw.io.ticks.last(), Some(&1), "150 wait and are overdue: a tick at once");
    gw.tick();
    let batches = batches(&gw);
    assert_eq!((batches.len(), batches[1].1.len()), (2, 150));
    assert_eq!(batches[1].1[0]["trace_id"], json!("t-501"));
}

#[test]
fn a_worker_gone_idle_makes_a_copy_of_the_records_not_acknowledged_and_they_stay_queued() {
    // The native host's timer rides on its streams: when the last one ends, nothing ticks
    // until the next request. The host sends the calls its timer would make if no request
    // comes soon; making them changes nothing.
    let mut gw = Gateway::new(CP);
    gw.io.host.random = 7;
    served(&mut gw, 1, "t-1");
    let now_ms = gw.io.host.now_ms.get();
    let [copy]: [Dispatch; 1] = gw.idle_calls(now_ms).try_into().unwrap();
    assert_eq!(copy.cluster, "gateway_control_plane");
    let body: Value = serde_json::from_slice(&copy.body).unwrap();
    assert_eq!(traces(body["records"].as_array().unwrap()), ["t-1"], "without the second's wait");
    assert!(batches(&gw).is_empty(), "nothing was sent");
    // Idle calls that went change nothing either: the records go again with the timer's
    // batch, under the same record id (the control plane stores each once).
    gw.idle_sent(now_ms, false);
    gw.advance_clock(1000);
    gw.tick();
    let [(token, records)]: [(u32, Vec<Value>); 1] = batches(&gw).try_into().unwrap();
    assert_eq!(traces(&records), ["t-1"]);
    assert!(records[0]["record_id"].is_string());
    assert_eq!(records[0]["record_id"], body["records"][0]["record_id"]);

    // A batch in flight is not acknowledged yet (its answer may wait in an idle worker's
    // mailbox): its records are copied too, first.
    served(&mut gw, 2, "t-2");
    let copied = |gw: &mut Gateway| {
        let [copy]: [Dispatch; 1] = gw.idle_calls(now_ms).try_into().unwrap();
        let body: Value = serde_json::from_slice(&copy.body).unwrap();
        traces(body["records"].as_array().unwrap()).into_iter().map(str::to_string).collect::<Vec<_>>()
    };
    assert_eq!(copied(&mut gw), ["t-1", "t-2"]);
    gw.answer(token, 200, &[], b"{}");
    assert_eq!(copied(&mut gw), ["t-2"], "t-1 is acknowledged");
    // Every idle call answered: the records copied are the control plane's, and leave.
    gw.idle_sent(now_ms, true);
    assert!(gw.idle_calls(now_ms).is_empty(), "nothing is left to copy");
    gw.advance_clock(1000);
    gw.tick();
    assert_eq!(batches(&gw).len(), 1, "t-2 is not sent again");
}

#[test]
fn a_worker_gone_idle_copies_every_record_not_acknowledged_a_batch_at_a_time() {
    // 501 queued and none in flight yet: two copies, a full batch then the last record. Left
    // to one batch, the rest waited in an idle worker until its next request.
    let mut gw = Gateway::new(CP);
    for i in 1..=501 {
        served(&mut gw, i, &format!("t-{i}"));
    }
    let now_ms = gw.io.host.now_ms.get();
    let copies: Vec<Vec<String>> = gw
        .idle_calls(now_ms)
        .iter()
        .map(|copy| {
            let body: Value = serde_json::from_slice(&copy.body).unwrap();
            traces(body["records"].as_array().unwrap()).into_iter().map(str::to_string).collect()
        })
        .collect();
    assert_eq!(copies.iter().map(Vec::len).collect::<Vec<_>>(), [500, 1]);
    assert_eq!((copies[0][0].as_str(), copies[1][0].as_str()), ("t-1", "t-501"));
    // Both stored: none is left to copy or to send.
    gw.idle_sent(now_ms, true);
    assert!(gw.idle_calls(now_ms).is_empty());
    gw.advance_clock(2000);
    gw.tick();
    assert!(batches(&gw).is_empty());
}

#[test]
fn a_batch_that_fails_is_tried_again_later_and_past_the_bound_records_are_dropped_and_counted() {
    let mut gw = Gateway::new(CP);
    served(&mut gw, 1, "t-1");
    gw.io.host.random = 8;
    served(&mut gw, 2, "t-2");
    gw.advance_clock(1000);
    gw.tick();
    let (token, first) = batches(&gw)[0].clone();
    let ids = |records: &[Value]| records.iter().map(|r| r["record_id"].clone()).collect::<Vec<_>>();
    assert_eq!(ids(&first), [json!("0000000f42400000000000000007"), json!("0000000f42400000000000000008")]);
    // The control plane is down: no answer (a timeout or a reset comes back as status 0).
    assert_eq!(gw.answer(token, 0, &[], b""), Output::proceed());
    assert_eq!(dropped(&gw), 0);
    assert_eq!(gw.io.ticks.last(), Some(&1000), "tried again after a backoff");
    gw.advance_clock(999);
    gw.tick();
    assert_eq!(batches(&gw).len(), 1, "not before the backoff is over");
    gw.advance_clock(1);
    gw.tick();
    let (token, records) = batches(&gw)[1].clone();
    assert_eq!(traces(&records), ["t-1", "t-2"], "the same records again");
    assert_eq!(ids(&records), ids(&first), "under the same ids: the control plane stores them once");
    gw.answer(token, 503, &[], b"");
    assert_eq!(gw.io.ticks.last(), Some(&2000), "the backoff doubles");

    // Still down while the queue fills past its bound: what does not fit is dropped.
    let max = 2000; // the default records.max_queued
    for id in 3..=max + 5 {
        served(&mut gw, id, &format!("t-{id}"));
    }
    assert_eq!(dropped(&gw), 5, "t-1, t-2 and 1998 more wait; the last five are dropped");
    gw.advance_clock(2000);
    gw.tick();
    let (token, records) = batches(&gw)[2].clone();
    assert_eq!((records.len(), records[0]["trace_id"].clone()), (500, json!("t-1")));
    // 500 more finish while the batch is in flight; then it fails and finds no room.
    for id in max + 6..max + 506 {
        served(&mut gw, id, &format!("t-{id}"));
    }
    assert_eq!(dropped(&gw), 5);
    gw.answer(token, 0, &[], b"");
    assert_eq!(dropped(&gw), 505, "the failed batch did not fit back");

    // The control plane is back: the oldest waiting record goes first.
    gw.advance_clock(4000);
    gw.tick();
    let (token, records) = batches(&gw)[3].clone();
    assert_eq!(records[0]["trace_id"], json!("t-501"));
    gw.answer(token, 200, &[], b"{}");
    assert_eq!(dropped(&gw), 505);
    assert_eq!(gw.io.ticks.last(), Some(&1), "1500 still wait: at once, no backoff after a success");
}

#[test]
fn a_refused_batch_is_dropped_and_counted_and_not_sent_again() {
    let mut gw = Gateway::new(CP);
    served(&mut gw, 1, "t-1");
    served(&mut gw, 2, "t-2");
    gw.advance_clock(1000);
    gw.tick();
    let (token, _) = batches(&gw)[0].clone();
    gw.answer(token, 400, &[], br#"{"error":{"message":"bad batch"}}"#);
    assert_eq!(dropped(&gw), 2);
    assert_eq!(gw.io.ticks.last(), Some(&0), "nothing waits");
    gw.advance_clock(10_000);
    gw.tick();
    assert_eq!(batches(&gw).len(), 1);
}

#[test]
fn a_batch_that_cannot_be_dispatched_waits_like_a_failed_one() {
    let mut gw = Gateway::new(CP);
    served(&mut gw, 1, "t-1");
    gw.advance_clock(1000);
    gw.io.dispatch_fails = true;
    gw.tick();
    assert_eq!((batches(&gw).len(), dropped(&gw)), (0, 0));
    assert_eq!(gw.io.ticks.last(), Some(&1000));
    gw.io.dispatch_fails = false;
    gw.advance_clock(1000);
    gw.tick();
    assert_eq!(traces(&batches(&gw)[0].1), ["t-1"]);
}

#[test]
fn a_request_without_a_workspace_is_not_shipped() {
    let mut gw = Gateway::new(CP);
    let out = gw.request_headers(1, request("POST", "/v1/chat/completions", &[]), true);
    assert_eq!(reply(&out).1, 401);
    let record = gw.finished(1).unwrap();
    assert_eq!(record.workspace, "");
    assert!(gw.io.ticks.is_empty(), "nothing queued, no timer");
    gw.advance_clock(5000);
    gw.tick();
    assert!(batches(&gw).is_empty());
}

#[test]
fn without_a_control_plane_nothing_is_queued() {
    let mut gw = Gateway::new(r#"{"api_keys": ["gw-key"]}"#);
    let record = served(&mut gw, 1, "t-1");
    assert_eq!(record.workspace, "");
    assert!(gw.io.ticks.is_empty());
    gw.advance_clock(5000);
    gw.tick();
    assert!(gw.io.sent.is_empty());
    assert_eq!(dropped(&gw), 0);
}

#[test]
fn control_plane_reads_are_counted_by_result_and_warm_hits_are_not() {
    let mut gw = Gateway::new(CP);
    let lookups = |gw: &Gateway| -> Vec<String> {
        gw.io
            .metrics
            .iter()
            .filter(|(_, name, _)| name.starts_with(metrics::CONTROL_PLANE_LOOKUPS))
            .map(|(_, name, value)| format!("{name} {value}"))
            .collect()
    };
    let with_config = |config: &str| {
        let mut headers = openai_chat();
        headers.push(("x-gateway-config".to_string(), config.as_bytes().to_vec()));
        headers
    };
    gw.post(1, with_config("saved"), CHAT);
    let token = gw.io.sent.last().unwrap().token;
    let config = json!({"id": "c", "slug": "saved", "version_id": "v", "value": {"provider": "openai",
        "custom_host": "http://127.0.0.1:9000/v1", "api_key": "sk"}});
    gw.answer(token, 200, &[], config.to_string().as_bytes());
    gw.post(2, with_config("saved"), CHAT);
    gw.post(3, with_config("missing"), CHAT);
    gw.answer(gw.io.sent.last().unwrap().token, 404, &[], b"");
    gw.post(4, with_config("down"), CHAT);
    gw.answer(gw.io.sent.last().unwrap().token, 0, &[], b"");
    gw.io.dispatch_fails = true;
    gw.post(5, with_config("unsent"), CHAT);
    assert_eq!(
        lookups(&gw),
        [
            "gen_ai_gateway_control_plane_lookups_total.result.found 1",
            "gen_ai_gateway_control_plane_lookups_total.result.absent 1",
            "gen_ai_gateway_control_plane_lookups_total.result.failed 1",
            "gen_ai_gateway_control_plane_lookups_total.result.failed 1",
        ]
    );
}

/// `CP` with `records` settings.
fn with_records(records: &str) -> String {
    CP.replacen(r#"{"api_keys""#, &format!(r#"{{"records": {records}, "api_keys""#), 1)
}

/// The records of the first batch, once it left.
fn first_batch(gw: &mut Gateway) -> Vec<Value> {
    gw.advance_clock(1000);
    gw.tick();
    batches(gw).remove(0).1
}

#[test]
fn bodies_are_off_by_default_and_never_in_the_access_log() {
    let mut gw = Gateway::new(CP);
    served(&mut gw, 1, "t-1");
    let [record] = first_batch(&mut gw).try_into().unwrap();
    assert_eq!((record.get("request_body"), record.get("response_body")), (None, None));

    let mut gw = Gateway::new(&with_records(r#"{"bodies": true}"#));
    let record = served(&mut gw, 1, "t-1");
    assert!(!String::from_utf8_lossy(&record.to_json()).contains("hi"), "no prompt in the access log");
    let [shipped] = first_batch(&mut gw).try_into().unwrap();
    assert_eq!(shipped["request_body"], json!(String::from_utf8_lossy(CHAT)));
    assert_eq!(shipped["response_body"], json!(String::from_utf8_lossy(COMPLETION)));
    assert_eq!((shipped.get("request_body_truncated"), shipped.get("response_body_truncated")), (None, None));
}

#[test]
fn bodies_are_cut_to_max_body_bytes_and_a_local_answer_is_what_the_client_received() {
    let mut gw = Gateway::new(&with_records(r#"{"bodies": true, "max_body_bytes": 10}"#));
    served(&mut gw, 1, "t-1");
    let [shipped] = first_batch(&mut gw).try_into().unwrap();
    assert_eq!(shipped["request_body"], json!(String::from_utf8_lossy(&CHAT[..10])));
    assert_eq!(shipped["response_body"], json!(String::from_utf8_lossy(&COMPLETION[..10])));
    assert_eq!((&shipped["request_body_truncated"], &shipped["response_body_truncated"]), (&json!(true), &json!(true)));

    let mut gw = Gateway::new(&with_records(r#"{"bodies": true}"#));
    let (_, status, _, body) = reply(&gw.post(1, openai_chat(), b"{not json"));
    assert_eq!(status, 400);
    gw.finished(1).unwrap();
    let [shipped] = first_batch(&mut gw).try_into().unwrap();
    assert_eq!(serde_json::from_str::<Value>(shipped["response_body"].as_str().unwrap()).unwrap(), body);
    assert_eq!(shipped["request_body"], json!("{not json"));
}

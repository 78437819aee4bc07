//! Limits and metrics over real loopback sockets: a slow sled filled to its limit refuses the
//! next call at once with a retry hint, delays no call to another sled, and `/metrics` shows
//! all of it.

use std::time::Duration;

use gateway_server::ServerOptions;
use serde_json::{json, Value};
use sled_sim::{Fleet, McpClient, SledOptions, TokioConnect};

use gateway_tests::{metric_series as series, scrape_metrics as scrape};

async fn call(url: &str, id: i64, project: &str) -> (Value, Duration) {
    let mut c = McpClient::connect(TokioConnect, url).await.unwrap();
    let started = tokio::time::Instant::now();
    let r = c
        .tools_call(json!(id), "whoami", json!({ "project": project }))
        .await
        .unwrap();
    (r, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_sled_at_its_limit_refuses_at_once_and_delays_no_other_sled() {
    gateway_tests::init_tracing();
    let registry = gateway_tests::registry(&["alpha", "beta"], Some("alpha"));
    let mut opts = ServerOptions::new(registry, [5; 32]);
    opts.core.max_calls_per_sled = 2;
    let gateway = gateway_tests::Gateway::start(opts).await;
    let (addr, base, url) = (gateway.addr, gateway.base(), gateway.url());
    let slow = Fleet::spawn(
        &base,
        &["alpha".to_owned()],
        SledOptions {
            latency: Duration::from_secs(3),
            ..SledOptions::default()
        },
    );
    let fast = Fleet::spawn(&base, &["beta".to_owned()], SledOptions::default());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while series(&scrape(addr).await.1, "gateway_uplinks_live") != Some(2.0) {
        assert!(tokio::time::Instant::now() < deadline, "sleds not live");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // ... and alpha's tools listed (its tools/list takes 3 s too), so calls are labelled by tool.
    let mut c = McpClient::connect(TokioConnect, &url).await.unwrap();
    loop {
        let tools = c.tools_list(json!(1), None).await.unwrap();
        if tools["result"]["tools"].as_array().map_or(0, Vec::len)
            > gateway_core::GATEWAY_TOOLS.len()
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "alpha's tools not listed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Two calls occupy alpha (each takes 3 s there).
    let stuck: Vec<_> = (0..2)
        .map(|i| tokio::spawn(call_owned(url.clone(), i, "alpha")))
        .collect();
    while series(&scrape(addr).await.1, "gateway_calls_pending") != Some(2.0) {
        assert!(tokio::time::Instant::now() < deadline, "calls not pending");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // The third is refused at once, with the limit and a retry hint.
    let (r, took) = call(&url, 10, "alpha").await;
    assert!(took < Duration::from_secs(1), "refused in {took:?}");
    assert_eq!(r["error"]["data"]["kind"], "too_many_calls", "{r}");
    assert_eq!(r["error"]["data"]["limit"], "max_calls_per_sled");
    assert_eq!(r["error"]["data"]["retry_after_ms"], 1000);

    // beta answers without waiting for alpha.
    for i in 0..5 {
        let (r, took) = call(&url, 20 + i, "beta").await;
        assert!(r["result"].is_object(), "{r}");
        assert!(took < Duration::from_secs(1), "beta took {took:?}");
    }

    let (head, body) = scrape(addr).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    assert_eq!(
        series(
            &body,
            r#"gateway_calls_total{tool="whoami",project="beta",outcome="ok"}"#
        ),
        Some(5.0),
        "{body}"
    );
    assert_eq!(
        series(
            &body,
            r#"gateway_calls_total{tool="whoami",project="alpha",outcome="refused"}"#
        ),
        Some(1.0),
        "{body}"
    );
    assert_eq!(series(&body, "gateway_calls_pending"), Some(2.0));
    assert_eq!(series(&body, "gateway_calls_refused_total"), Some(1.0));
    assert_eq!(
        series(
            &body,
            r#"gateway_call_duration_seconds_count{project="beta"}"#
        ),
        Some(5.0),
        "{body}"
    );
    assert_eq!(
        series(
            &body,
            r#"gateway_call_duration_seconds_bucket{le="+Inf",project="beta"}"#
        ),
        Some(5.0)
    );
    assert_eq!(
        series(&body, r#"gateway_responses_dropped_total{reason="late"}"#),
        Some(0.0)
    );
    assert_eq!(series(&body, "gateway_frames_invalid_total"), Some(0.0));

    // alpha's calls finish in their own time.
    for t in stuck {
        let (r, took) = t.await.unwrap();
        assert!(r["result"].is_object(), "{r}");
        assert!(took >= Duration::from_secs(2), "alpha was slow: {took:?}");
    }
    let body = scrape(addr).await.1;
    assert_eq!(
        series(
            &body,
            r#"gateway_calls_total{tool="whoami",project="alpha",outcome="ok"}"#
        ),
        Some(2.0),
        "{body}"
    );
    assert_eq!(
        series(
            &body,
            r#"gateway_call_duration_seconds_bucket{le="1.0",project="alpha"}"#
        ),
        Some(0.0),
        "{body}"
    );

    slow.shutdown().await;
    fast.shutdown().await;
    gateway.stop().await;
}

async fn call_owned(url: String, id: i64, project: &'static str) -> (Value, Duration) {
    call(&url, id, project).await
}

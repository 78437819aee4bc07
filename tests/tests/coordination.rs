//! Coordination over sockets: the real gateway, a real fleet, real HTTP sessions racing for
//! one lease. Exactly one wins each round; the gateway refuses the loser's write; the
//! holder's fenced write reaches the sled and is applied.

use std::time::Duration;

use gateway_tests::Stack;
use serde_json::{json, Value};
use sled_sim::{McpClient, SledOptions, TokioConnect};

async fn session(url: &str) -> McpClient<TokioConnect> {
    let mut c = McpClient::connect(TokioConnect, url).await.unwrap();
    c.initialize().await.unwrap();
    c
}

async fn call(c: &mut McpClient<TokioConnect>, name: &str, arguments: Value) -> Value {
    c.tools_call(json!(1), name, arguments).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_race_one_claim_and_only_the_holder_writes() {
    let registry = gateway_tests::registry(&["alpha", "beta"], Some("alpha"));
    let stack = Stack::start(registry, &["alpha", "beta"], SledOptions::default()).await;
    let url = stack.url();
    let (mut a, mut b) = (session(&url).await, session(&url).await);
    let created = call(
        &mut a,
        "create_story",
        json!({"project":"beta","name":"Contended","acceptance_criteria":["x"]}),
    )
    .await;
    let story = created["result"]["structuredContent"]["story"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let resource = format!("story:{story}");
    let claim = json!({"project":"beta","resource":resource,"ttl_s":60});
    let stages = ["in_progress", "review"];
    let mut wins = [0u32; 2];
    let mut last_fence = 0;
    for round in 0..100 {
        let (ra, rb) = tokio::join!(
            call(&mut a, "claim", claim.clone()),
            call(&mut b, "claim", claim.clone())
        );
        let (ra, rb) = (
            &ra["result"]["structuredContent"],
            &rb["result"]["structuredContent"],
        );
        let won = [ra["acquired"] == true, rb["acquired"] == true];
        assert_eq!(
            won.iter().filter(|w| **w).count(),
            1,
            "round {round}: exactly one wins: {ra} {rb}"
        );
        let (winner, loser, w) = if won[0] {
            (&mut a, &mut b, 0)
        } else {
            (&mut b, &mut a, 1)
        };
        wins[w] += 1;
        let held = if won[0] { ra } else { rb };
        let fence = held["fence"].as_u64().unwrap();
        assert!(
            fence > last_fence,
            "round {round}: fences only grow ({fence} after {last_fence})"
        );
        last_fence = fence;
        let lost = if won[0] { rb } else { ra };
        assert!(
            lost["holder"].is_string(),
            "round {round}: the refusal names the holder: {lost}"
        );
        // The loser's write is refused by the gateway, naming the holder.
        let stage = stages[round % 2];
        let mv = json!({"project":"beta","story_id":story,"stage":stage});
        let r = call(loser, "move_story", mv.clone()).await;
        assert_eq!(
            r["error"]["data"]["kind"], "lease_held",
            "round {round}: {r}"
        );
        assert_eq!(r["error"]["data"]["holder"], lost["holder"]);
        // The holder's write goes through under its fence.
        let r = call(winner, "move_story", mv).await;
        assert_eq!(r["result"]["isError"], Value::Null, "round {round}: {r}");
        let show = call(winner, "show", json!({"project":"beta","story_id":story})).await;
        assert_eq!(
            show["result"]["structuredContent"]["story"]["stage"], stage,
            "{show}"
        );
        let r = call(
            winner,
            "release",
            json!({"project":"beta","resource":resource}),
        )
        .await;
        assert_eq!(r["result"]["structuredContent"]["released"], true, "{r}");
    }
    println!(
        "100 rounds: session a won {}, session b won {}; last fence {last_fence}",
        wins[0], wins[1]
    );
    stack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_wait_across_projects_within_a_second() {
    let registry = gateway_tests::registry(&["alpha", "beta"], Some("alpha"));
    let stack = Stack::start(registry, &["alpha", "beta"], SledOptions::default()).await;
    let url = stack.url();
    let (mut a, mut b) = (session(&url).await, session(&url).await);
    let res = json!({"project":"beta","resource":"story:beta-1"});
    assert_eq!(
        call(&mut a, "claim", res.clone()).await["result"]["structuredContent"]["acquired"],
        true
    );
    assert_eq!(
        call(&mut b, "claim", res.clone()).await["result"]["structuredContent"]["acquired"],
        false
    );
    let waiter = tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        let r = call(&mut b, "wait", json!({"projects":["alpha","beta"]})).await;
        (r, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released_at = tokio::time::Instant::now();
    call(&mut a, "release", res).await;
    let (r, _) = waiter.await.unwrap();
    let woke_after = released_at.elapsed();
    let s = &r["result"]["structuredContent"];
    assert_eq!(s["woke"], true, "{r}");
    assert_eq!(s["reasons"][0]["kind"], "released");
    assert!(
        woke_after < Duration::from_secs(1),
        "woken {woke_after:?} after the release"
    );
    stack.stop().await;
}

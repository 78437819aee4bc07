//! The coordination rules, on a fake clock.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;

/// The fake clock's origin: the one real reading, made once.
#[allow(clippy::disallowed_methods)]
fn t0() -> Instant {
    Instant::now()
}

fn s(n: u64) -> Duration {
    Duration::from_secs(n)
}

const NS: Duration = Duration::from_nanos(1);

fn coord() -> (Coord, Instant) {
    (Coord::new(Limits::default()), t0())
}

fn fence(c: Claim) -> u64 {
    match c {
        Claim::Acquired { fence, .. } => fence,
        held => panic!("expected a grant, got {held:?}"),
    }
}

fn lost(project: &str, resource: &str, fence: u64, reason: LostReason) -> LostLease {
    LostLease {
        project: project.into(),
        resource: resource.into(),
        fence,
        reason,
    }
}

fn ids(inbox: &Inbox) -> Vec<u64> {
    inbox.messages.iter().map(|m| m.id).collect()
}

fn projects(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| n.to_string()).collect()
}

#[test]
fn names_and_ttls_are_checked() {
    let (mut c, t) = coord();
    let long = "r".repeat(257);
    for (resource, reason) in [
        ("", "empty"),
        (&long[..], "too long"),
        ("a\nb", "has control characters"),
    ] {
        assert_eq!(
            c.claim(t, "p", "a", resource, None),
            Err(CoordError::BadName {
                what: "resource",
                reason
            })
        );
    }
    assert_eq!(
        c.claim(t, "p", "a", &"r".repeat(256), None).map(fence),
        Ok(1)
    );
    assert_eq!(
        c.claim(t, "p", "a", "r", Some(Duration::ZERO)),
        Err(CoordError::BadTtl { what: "lease" })
    );
    assert_eq!(
        c.send(
            t,
            "p",
            "a",
            Recipient::Channel,
            "x".into(),
            Some(Duration::ZERO)
        ),
        Err(CoordError::BadTtl { what: "message" })
    );
    assert!(matches!(
        c.board_set(t, "", "a", "k", "1".into(), None, None),
        Err(CoordError::BadName {
            what: "project",
            ..
        })
    ));
}

#[test]
fn one_holder_at_a_time_and_expiry_is_at_expires_at() {
    let (mut c, t) = coord();
    assert_eq!(
        c.claim(t, "p", "a", "db", Some(s(10))),
        Ok(Claim::Acquired {
            fence: 1,
            expires_in: s(10),
            reentrant: false,
            ttl_clamped: None
        })
    );
    assert_eq!(
        c.claim(t + s(10) - NS, "p", "b", "db", None),
        Ok(Claim::Held {
            holder: "a".into(),
            holder_name: None,
            expires_in: NS
        })
    );
    assert_eq!(c.claim(t + s(10), "p", "b", "db", None).map(fence), Ok(2));
    // The old holder hears of it once, though someone else holds it now.
    assert_eq!(
        c.take_lost(t + s(11), "a", None),
        vec![lost("p", "db", 1, LostReason::Expired)]
    );
    assert_eq!(c.take_lost(t + s(11), "a", None), vec![]);
    assert_eq!(
        c.check_write(t + s(11), "p", "a", "db", true),
        WriteCheck::Refused {
            holder: "b".into(),
            holder_name: None,
            expires_in: s(299),
        }
    );
}

#[test]
fn fences_only_grow_per_project() {
    let (mut c, t) = coord();
    assert_eq!(c.claim(t, "p", "a", "x", None).map(fence), Ok(1));
    assert_eq!(c.claim(t, "p", "a", "y", None).map(fence), Ok(2));
    assert_eq!(c.release(t, "p", "a", "x"), Ok(Released { fence: 1 }));
    assert_eq!(
        c.claim(t, "p", "a", "x", None).map(fence),
        Ok(3),
        "never reused after release"
    );
    assert_eq!(
        c.claim(t + s(1), "p", "a", "x", Some(s(50))),
        Ok(Claim::Acquired {
            fence: 3,
            expires_in: s(50),
            reentrant: true,
            ttl_clamped: None
        })
    );
    assert_eq!(
        c.claim(t, "q", "a", "x", None).map(fence),
        Ok(1),
        "another project counts apart"
    );
    // The first report of a sled's high-water mark re-fences the live leases not above it
    // (granted before the sled redialled a restarted gateway), in resource order.
    assert_eq!(c.raise_fence_floor("p", 100), Ok(102));
    let fences: Vec<(String, u64)> = c
        .claims(t, "p")
        .into_iter()
        .map(|l| (l.resource, l.fence))
        .collect();
    assert_eq!(fences, [("x".into(), 101), ("y".into(), 102)]);
    assert_eq!(
        c.raise_fence_floor("p", 102),
        Ok(102),
        "later reports re-fence nothing"
    );
    assert_eq!(c.claims(t, "p")[0].fence, 101);
    assert_eq!(
        c.raise_fence_floor("p", 7),
        Ok(102),
        "a floor never lowers the counter"
    );
    assert_eq!(c.claim(t, "p", "b", "z", None).map(fence), Ok(103));
    assert_eq!(c.raise_fence_floor("p", u64::MAX), Ok(u64::MAX));
    assert_eq!(
        c.claim(t, "p", "b", "w", None),
        Err(CoordError::Exhausted { what: "fence" })
    );
}

#[test]
fn renew_keeps_the_fence_and_refuses_what_is_not_held() {
    let (mut c, t) = coord();
    c.claim(t, "p", "a", "x", Some(s(10))).unwrap();
    assert_eq!(
        c.renew(t + s(5), "p", "a", "x", None),
        Ok(Renewed {
            fence: 1,
            expires_in: s(10),
            ttl_clamped: None
        })
    );
    assert_eq!(c.claims(t + s(14), "p")[0].expires_in, s(1));
    let not_holder = CoordError::NotHolder {
        resource: "x".into(),
        holder: Some("a".into()),
    };
    assert_eq!(
        c.renew(t + s(6), "p", "b", "x", None),
        Err(not_holder.clone())
    );
    assert_eq!(c.release(t + s(6), "p", "b", "x"), Err(not_holder));
    let never = CoordError::NoLease {
        resource: "y".into(),
        expired: false,
    };
    assert_eq!(c.release(t, "p", "a", "y"), Err(never.clone()));
    assert_eq!(c.renew(t, "p", "a", "y", None), Err(never));
    let expired = CoordError::NoLease {
        resource: "x".into(),
        expired: true,
    };
    assert_eq!(
        c.renew(t + s(15), "p", "a", "x", None),
        Err(expired.clone())
    );
    assert_eq!(c.release(t + s(15), "p", "a", "x"), Err(expired));
    assert_eq!(
        c.claim(t + s(16), "p", "a", "x", None).map(fence),
        Ok(2),
        "a new grant after one's own expiry"
    );
    assert_eq!(
        c.release(t + s(16), "p", "a", "x"),
        Ok(Released { fence: 2 })
    );
    assert_eq!(
        c.release(t + s(16), "p", "a", "x"),
        Err(CoordError::NoLease {
            resource: "x".into(),
            expired: false
        })
    );
}

#[test]
fn clamped_ttls_say_so() {
    let (mut c, t) = coord();
    assert_eq!(
        c.claim(t, "p", "a", "x", Some(s(7200))),
        Ok(Claim::Acquired {
            fence: 1,
            expires_in: s(3600),
            reentrant: false,
            ttl_clamped: Some(s(3600))
        })
    );
    assert_eq!(
        c.renew(t, "p", "a", "x", Some(s(9999)))
            .map(|r| r.ttl_clamped),
        Ok(Some(s(3600)))
    );
    let sent = c
        .send(
            t,
            "p",
            "a",
            Recipient::Channel,
            "hi".into(),
            Some(s(100_000)),
        )
        .unwrap();
    assert_eq!(
        (sent.expires_in, sent.ttl_clamped),
        (s(86400), Some(s(86400)))
    );
    let set = c
        .board_set(t, "p", "a", "k", "1".into(), None, Some(s(8 * 86400)))
        .unwrap();
    assert_eq!(set.ttl_clamped, Some(s(7 * 86400)));
    let checkin = c.checkin(t, "p", "a", None, None, Some(s(5000))).unwrap();
    assert_eq!(
        (checkin.expires_in, checkin.ttl_clamped),
        (s(3600), Some(s(3600)))
    );
    assert_eq!(
        c.checkin(t, "p", "a", None, None, None)
            .unwrap()
            .ttl_clamped,
        None
    );
}

#[test]
fn force_release_bumps_the_fence_and_is_lost_to_the_holder_once() {
    let (mut c, t) = coord();
    c.claim(t, "p", "a", "x", None).unwrap();
    assert_eq!(c.force_release(t, "p", "x"), Ok(Released { fence: 1 }));
    assert_eq!(
        c.claim(t, "p", "b", "x", None).map(fence),
        Ok(3),
        "above the bump"
    );
    assert_eq!(
        c.renew(t, "p", "a", "x", None),
        Err(CoordError::NotHolder {
            resource: "x".into(),
            holder: Some("b".into())
        })
    );
    assert_eq!(
        c.take_lost(t, "a", Some("p")),
        vec![lost("p", "x", 1, LostReason::ForcedRelease)]
    );
    assert_eq!(c.take_lost(t, "a", Some("p")), vec![]);
    assert_eq!(
        c.force_release(t, "p", "free"),
        Err(CoordError::NoLease {
            resource: "free".into(),
            expired: false
        })
    );
    assert_eq!(c.stats().forced, 1);
}

#[test]
fn check_write_answers_all_four_ways() {
    let (mut c, t) = coord();
    c.checkin(t, "p", "b", Some("Bea".into()), None, None)
        .unwrap();
    assert_eq!(c.check_write(t, "p", "a", "x", false), WriteCheck::Unfenced);
    assert_eq!(
        c.check_write(t, "p", "a", "x", true),
        WriteCheck::LeaseRequired
    );
    c.claim(t, "p", "a", "x", Some(s(10))).unwrap();
    assert_eq!(
        c.check_write(t, "p", "a", "x", true),
        WriteCheck::Fenced { fence: 1 }
    );
    c.claim(t, "p", "b", "y", Some(s(10))).unwrap();
    assert_eq!(
        c.check_write(t + s(4), "p", "a", "y", false),
        WriteCheck::Refused {
            holder: "b".into(),
            holder_name: Some("Bea".into()),
            expires_in: s(6)
        }
    );
    assert_eq!(
        c.check_write(t + s(10), "p", "a", "x", true),
        WriteCheck::LeaseRequired,
        "own lease expired"
    );
}

#[test]
fn checkin_renews_leases_and_reports_messages_and_losses() {
    let (mut c, t) = coord();
    c.claim(t, "p", "a", "x", Some(s(10))).unwrap();
    c.claim(t, "p", "a", "y", Some(s(20))).unwrap();
    c.claim(t, "p", "a", "z", Some(s(5))).unwrap();
    c.send(
        t,
        "p",
        "b",
        Recipient::Agent("a".into()),
        "hello".into(),
        None,
    )
    .unwrap();
    let got = c
        .checkin(
            t + s(8),
            "p",
            "a",
            Some("Ann".into()),
            Some("tests".into()),
            None,
        )
        .unwrap();
    let renewed: Vec<_> = got
        .renewed
        .iter()
        .map(|l| (l.resource.as_str(), l.fence, l.expires_in))
        .collect();
    assert_eq!(renewed, [("x", 1, s(10)), ("y", 2, s(20))]);
    assert_eq!(got.lost, [lost("p", "z", 3, LostReason::Expired)]);
    assert_eq!(ids(&got.inbox), [1]);
    assert_eq!(
        (got.inbox.messages[0].body.as_str(), got.inbox.unread),
        ("hello", 0)
    );
    assert_eq!(c.take_lost(t + s(8), "a", None), vec![]);
    assert_eq!(c.claims(t + s(17), "p").len(), 2);
}

#[test]
fn roster_shows_present_agents_active_then_stale_then_gone() {
    let (mut c, t) = coord();
    c.checkin(
        t,
        "p",
        "a",
        Some("Ann".into()),
        Some("docs".into()),
        Some(s(100)),
    )
    .unwrap();
    c.claim(t, "p", "a", "x", Some(s(1000))).unwrap();
    c.claim(t + s(30), "p", "b", "y", None).unwrap();
    let roster = c.roster(t + s(70), "p");
    assert_eq!(roster.len(), 2);
    assert_eq!(
        roster[0],
        RosterEntry {
            agent: "a".into(),
            name: Some("Ann".into()),
            task: Some("docs".into()),
            last_seen_ago: s(70),
            status: PresenceStatus::Stale,
            held: vec!["x".into()],
        }
    );
    assert_eq!(
        (roster[1].name.clone(), roster[1].status),
        (None, PresenceStatus::Active)
    );
    let names: Vec<_> = c
        .roster(t + s(100), "p")
        .into_iter()
        .map(|r| r.agent)
        .collect();
    assert_eq!(
        names,
        ["b"],
        "a's presence ended at t+100; its lease did not"
    );
    assert_eq!(c.claims(t + s(100), "p").len(), 2);
    assert!(c.roster(t, "other").is_empty());
}

#[test]
fn inbox_pages_neither_skip_nor_repeat() {
    let (mut c, t) = coord();
    c.checkin(t, "p", "a", None, None, None).unwrap();
    for i in 0..5 {
        let to = if i % 2 == 0 {
            Recipient::Channel
        } else {
            Recipient::Agent("a".into())
        };
        c.send(t, "p", "b", to, format!("m{i}"), None).unwrap();
    }
    let peek = c.inbox(t, "p", "a", true, 2).unwrap();
    assert_eq!((ids(&peek), peek.more, peek.unread), (vec![1, 2], true, 5));
    let page = c.inbox(t, "p", "a", false, 2).unwrap();
    assert_eq!((ids(&page), page.more, page.unread), (vec![1, 2], true, 3));
    assert_eq!(page.messages[1].to, MessageTo::Agent);
    assert_eq!(
        c.inbox(t, "p", "a", true, 0).unwrap(),
        Inbox {
            messages: vec![],
            more: true,
            unread: 3
        }
    );
    let page = c.inbox(t, "p", "a", false, 2).unwrap();
    assert_eq!((ids(&page), page.more), (vec![3, 4], true));
    let page = c.inbox(t + s(3), "p", "a", false, 10).unwrap();
    assert_eq!((ids(&page), page.more, page.unread), (vec![5], false, 0));
    assert_eq!(page.messages[0].sent_ago, s(3));
    assert_eq!(c.unread(t, "a", "p"), 0);
    assert_eq!(c.inbox(t, "p", "a", false, 10).unwrap(), Inbox::default());
}

#[test]
fn the_channel_reaches_others_who_were_there() {
    let (mut c, t) = coord();
    c.checkin(t, "p", "a", None, None, None).unwrap();
    c.send(t, "p", "a", Recipient::Channel, "early".into(), None)
        .unwrap();
    c.send(
        t,
        "p",
        "a",
        Recipient::Agent("late".into()),
        "for you".into(),
        None,
    )
    .unwrap();
    c.checkin(t, "p", "b", None, None, None).unwrap();
    c.send(t, "p", "a", Recipient::Channel, "later".into(), None)
        .unwrap();
    assert_eq!(c.unread(t, "a", "p"), 0, "not one's own channel message");
    assert_eq!(
        ids(&c.inbox(t, "p", "b", false, 10).unwrap()),
        [3],
        "not from before it came"
    );
    let late = c.checkin(t, "p", "late", None, None, None).unwrap();
    assert_eq!(
        ids(&late.inbox),
        [2],
        "a direct message waits for an absent agent"
    );
    assert_eq!(late.inbox.messages[0].to, MessageTo::Agent);
}

#[test]
fn expired_messages_are_skipped() {
    let (mut c, t) = coord();
    c.checkin(t, "p", "a", None, None, None).unwrap();
    c.send(
        t,
        "p",
        "b",
        Recipient::Agent("a".into()),
        "short".into(),
        Some(s(10)),
    )
    .unwrap();
    c.send(
        t,
        "p",
        "b",
        Recipient::Agent("a".into()),
        "long".into(),
        Some(s(100)),
    )
    .unwrap();
    assert_eq!(c.unread(t + s(9), "a", "p"), 2);
    assert_eq!(ids(&c.inbox(t + s(10), "p", "a", false, 10).unwrap()), [2]);
}

#[test]
fn message_limits_refuse_with_typed_errors() {
    let limits = Limits {
        max_inbox: 2,
        max_messages_per_project: 3,
        ..Limits::default()
    };
    let (mut c, t) = (Coord::new(limits), t0());
    let to_a = || Recipient::Agent("a".into());
    c.send(t, "p", "b", to_a(), "1".into(), None).unwrap();
    c.send(t, "p", "b", to_a(), "2".into(), None).unwrap();
    assert_eq!(
        c.send(t, "p", "b", to_a(), "3".into(), None),
        Err(CoordError::InboxFull { to: to_a(), max: 2 })
    );
    c.send(t, "p", "b", Recipient::Channel, "c".into(), None)
        .unwrap();
    assert_eq!(
        c.send(t, "p", "b", Recipient::Agent("z".into()), "4".into(), None),
        Err(CoordError::Limit {
            which: CoordLimit::MessagesPerProject,
            max: 3
        })
    );
    c.inbox(t, "p", "a", false, 1).unwrap();
    c.send(t, "p", "b", to_a(), "5".into(), None).unwrap();
    let big = "x".repeat(16 * 1024 + 1);
    assert_eq!(
        c.send(t, "p", "b", Recipient::Channel, big, None),
        Err(CoordError::TooLarge {
            what: "message",
            max_bytes: 16 * 1024,
            got: 16 * 1024 + 1
        })
    );
    assert_eq!(c.stats().messages_refused, 3);
}

#[test]
fn board_revisions_are_never_reused() {
    let (mut c, t) = coord();
    let set = |c: &mut Coord, at, key: &str, if_rev, ttl| {
        c.board_set(at, "p", "a", key, "{}".into(), if_rev, ttl)
            .map(|b| b.revision)
    };
    assert_eq!(set(&mut c, t, "k", Some(0), None), Ok(1));
    assert_eq!(
        set(&mut c, t, "k", Some(0), None),
        Err(CoordError::RevisionMismatch {
            key: "k".into(),
            current: Some(1)
        })
    );
    assert_eq!(set(&mut c, t, "k", Some(1), None), Ok(2));
    assert_eq!(
        set(&mut c, t, "k", Some(1), None),
        Err(CoordError::RevisionMismatch {
            key: "k".into(),
            current: Some(2)
        })
    );
    assert_eq!(
        c.board_delete(t, "p", "a", "k", Some(1)),
        Err(CoordError::RevisionMismatch {
            key: "k".into(),
            current: Some(2)
        })
    );
    assert_eq!(c.board_delete(t, "p", "a", "k", Some(2)), Ok(2));
    assert_eq!(
        c.board_delete(t, "p", "a", "k", None),
        Err(CoordError::NoKey { key: "k".into() })
    );
    assert_eq!(
        set(&mut c, t, "k", Some(2), None),
        Err(CoordError::RevisionMismatch {
            key: "k".into(),
            current: None
        })
    );
    assert_eq!(
        set(&mut c, t, "k", Some(0), Some(s(10))),
        Ok(3),
        "after a delete, not 1"
    );
    assert_eq!(
        c.board_get(t + s(10) - NS, "p", "k").map(|e| e.expires_in),
        Some(Some(NS))
    );
    assert_eq!(c.board_get(t + s(10), "p", "k"), None);
    assert_eq!(
        set(&mut c, t + s(10), "k", Some(3), None),
        Err(CoordError::RevisionMismatch {
            key: "k".into(),
            current: None
        }),
        "a stale writer's CAS fails"
    );
    assert_eq!(
        set(&mut c, t + s(10), "k", Some(0), None),
        Ok(4),
        "expired counts as absent"
    );
    assert_eq!(c.stats().board_cas_failures, 5);
}

#[test]
fn board_lists_by_prefix_and_bounds_keys_and_values() {
    let limits = Limits {
        max_board_keys: 3,
        max_board_value_bytes: 4,
        ..Limits::default()
    };
    let (mut c, t) = (Coord::new(limits), t0());
    for key in ["job/2", "job/1", "other"] {
        c.board_set(t, "p", "a", key, "1".into(), None, None)
            .unwrap();
    }
    let keys: Vec<_> = c
        .board_list(t, "p", Some("job/"))
        .into_iter()
        .map(|e| (e.key, e.revision))
        .collect();
    assert_eq!(keys, [("job/1".to_string(), 2), ("job/2".to_string(), 1)]);
    assert_eq!(c.board_list(t, "p", None).len(), 3);
    assert_eq!(
        c.board_set(t, "p", "a", "more", "1".into(), None, None),
        Err(CoordError::Limit {
            which: CoordLimit::BoardKeys,
            max: 3
        })
    );
    assert_eq!(
        c.board_set(t, "p", "a", "other", "2".into(), None, None)
            .map(|b| b.revision),
        Ok(4)
    );
    assert_eq!(
        c.board_set(t, "p", "a", "other", "12345".into(), None, None),
        Err(CoordError::TooLarge {
            what: "board value",
            max_bytes: 4,
            got: 5
        })
    );
    let e = c.board_get(t, "p", "other").unwrap();
    assert_eq!(
        (e.value.as_str(), e.set_by.as_str(), e.expires_in),
        ("2", "a", None)
    );
}

#[test]
fn wait_is_ready_at_once_when_something_is_pending() {
    let (mut c, t) = coord();
    c.checkin(t, "p", "a", None, None, None).unwrap();
    c.send(t, "p", "b", Recipient::Agent("a".into()), "hi".into(), None)
        .unwrap();
    let ready = WaitReady {
        project: Some("p".into()),
        reasons: vec![WaitReason::Message {
            id: 1,
            from: "b".into(),
            to: MessageTo::Agent,
        }],
    };
    let start = c.wait(t, "a", &projects(&["q", "p"]), WaitToken(1), t + s(20));
    assert_eq!(start, Ok(WaitStart::Ready(ready.clone())));
    // Level-triggered: the message is still unread until the inbox is read.
    assert_eq!(
        c.wait(t, "a", &projects(&["p"]), WaitToken(2), t + s(20)),
        Ok(WaitStart::Ready(ready))
    );
    c.inbox(t, "p", "a", false, 10).unwrap();
    assert_eq!(
        c.wait(t, "a", &projects(&["p"]), WaitToken(3), t + s(20)),
        Ok(WaitStart::Parked {
            deadline: t + s(20)
        })
    );
    assert_eq!(c.poll_woken(), None);
}

#[test]
fn a_send_wakes_a_parked_wait_exactly_once() {
    let (mut c, t) = coord();
    let start = c.wait(t, "a", &projects(&["p"]), WaitToken(7), t + s(60));
    assert_eq!(
        start,
        Ok(WaitStart::Parked {
            deadline: t + s(25)
        }),
        "clamped to max_wait"
    );
    assert_eq!(c.poll_timeout(), Some(t + s(25)));
    c.send(t + s(1), "p", "b", Recipient::Channel, "all".into(), None)
        .unwrap();
    let woken = c.poll_woken().unwrap();
    assert_eq!(
        woken,
        (
            WaitToken(7),
            WaitReady {
                project: Some("p".into()),
                reasons: vec![WaitReason::Message {
                    id: 1,
                    from: "b".into(),
                    to: MessageTo::Channel
                }],
            }
        )
    );
    c.send(t + s(2), "p", "b", Recipient::Channel, "again".into(), None)
        .unwrap();
    c.handle_timeout(t + s(30));
    assert_eq!(c.poll_woken(), None);
    assert!(!c.cancel_wait(WaitToken(7)));
    assert_eq!((c.stats().waits_woken, c.stats().parked_waiters), (1, 0));
}

#[test]
fn the_deadline_wakes_with_no_reasons() {
    let (mut c, t) = coord();
    c.wait(t, "a", &projects(&["p"]), WaitToken(1), t + s(5))
        .unwrap();
    c.wait(t, "a", &projects(&["p"]), WaitToken(2), t + s(9))
        .unwrap();
    assert_eq!(
        c.wait(t, "a", &projects(&["p"]), WaitToken(2), t + s(9)),
        Err(CoordError::DuplicateToken(WaitToken(2)))
    );
    assert!(c.cancel_wait(WaitToken(2)));
    c.handle_timeout(t + s(5) - NS);
    assert_eq!(c.poll_woken(), None);
    c.handle_timeout(t + s(5));
    assert_eq!(
        c.poll_woken(),
        Some((
            WaitToken(1),
            WaitReady {
                project: None,
                reasons: vec![]
            }
        ))
    );
    c.handle_timeout(t + s(10));
    assert_eq!(c.poll_woken(), None, "a cancelled wait never comes out");
    assert_eq!(
        c.wait(t + s(10), "a", &projects(&["p"]), WaitToken(3), t),
        Ok(WaitStart::Ready(WaitReady {
            project: None,
            reasons: vec![]
        })),
        "a deadline already past"
    );
    assert_eq!(c.stats().waits_timed_out, 2);
}

#[test]
fn a_lost_lease_is_reported_once_by_wait_or_by_take_lost() {
    let (mut c, t) = coord();
    c.claim(t, "p", "a", "x", Some(s(10))).unwrap();
    c.claim(t, "p", "a", "y", Some(s(10))).unwrap();
    c.wait(t, "a", &projects(&["p"]), WaitToken(1), t + s(25))
        .unwrap();
    assert_eq!(c.poll_timeout(), Some(t + s(10)));
    c.handle_timeout(t + s(10));
    let (token, ready) = c.poll_woken().unwrap();
    assert_eq!(token, WaitToken(1));
    assert_eq!(
        ready.reasons,
        [
            WaitReason::LeaseLost {
                resource: "x".into(),
                fence: 1,
                reason: LostReason::Expired
            },
            WaitReason::LeaseLost {
                resource: "y".into(),
                fence: 2,
                reason: LostReason::Expired
            },
        ]
    );
    assert_eq!(c.take_lost(t + s(10), "a", None), vec![]);
    // The other way round: taken first, a wait does not report it again.
    c.claim(t + s(10), "p", "a", "z", Some(s(10))).unwrap();
    assert_eq!(
        c.take_lost(t + s(20), "a", Some("p")),
        vec![lost("p", "z", 3, LostReason::Expired)]
    );
    assert_eq!(
        c.wait(t + s(20), "a", &projects(&["p"]), WaitToken(2), t + s(30)),
        Ok(WaitStart::Parked {
            deadline: t + s(30)
        })
    );
}

#[test]
fn a_second_waiter_of_the_same_agent_gets_no_repeat() {
    let (mut c, t) = coord();
    c.claim(t, "p", "a", "x", Some(s(10))).unwrap();
    c.wait(t, "a", &projects(&["p"]), WaitToken(1), t + s(20))
        .unwrap();
    c.wait(t, "a", &projects(&["p"]), WaitToken(2), t + s(20))
        .unwrap();
    c.force_release(t + s(1), "p", "x").unwrap();
    let reasons = vec![WaitReason::LeaseLost {
        resource: "x".into(),
        fence: 1,
        reason: LostReason::ForcedRelease,
    }];
    assert_eq!(
        c.poll_woken(),
        Some((
            WaitToken(1),
            WaitReady {
                project: Some("p".into()),
                reasons
            }
        ))
    );
    assert_eq!(c.poll_woken(), None);
    c.handle_timeout(t + s(20));
    assert_eq!(
        c.poll_woken(),
        Some((
            WaitToken(2),
            WaitReady {
                project: None,
                reasons: vec![]
            }
        ))
    );
}

#[test]
fn a_refused_claimant_is_woken_once_when_the_resource_is_released() {
    let (mut c, t) = coord();
    c.claim(t, "p", "a", "x", None).unwrap();
    assert!(matches!(
        c.claim(t, "p", "b", "x", None),
        Ok(Claim::Held { .. })
    ));
    assert!(matches!(
        c.wait(t, "b", &projects(&["p"]), WaitToken(1), t + s(20)),
        Ok(WaitStart::Parked { .. })
    ));
    c.release(t + s(1), "p", "a", "x").unwrap();
    let released = WaitReady {
        project: Some("p".into()),
        reasons: vec![WaitReason::Released {
            resource: "x".into(),
        }],
    };
    assert_eq!(c.poll_woken(), Some((WaitToken(1), released.clone())));
    assert!(matches!(
        c.wait(t + s(1), "b", &projects(&["p"]), WaitToken(2), t + s(20)),
        Ok(WaitStart::Parked { .. })
    ));
    // A release before the wait is pending at the wait.
    c.claim(t + s(2), "p", "a", "x", None).unwrap();
    c.claim(t + s(2), "p", "b", "x", None).unwrap();
    c.release(t + s(3), "p", "a", "x").unwrap();
    assert_eq!(c.poll_woken(), Some((WaitToken(2), released.clone())));
    c.claim(t + s(4), "p", "a", "x", Some(s(5))).unwrap();
    c.claim(t + s(4), "p", "b", "x", None).unwrap();
    c.handle_timeout(t + s(9));
    assert_eq!(
        c.wait(t + s(9), "b", &projects(&["p"]), WaitToken(3), t + s(20)),
        Ok(WaitStart::Ready(released)),
        "expiry counts"
    );
}

#[test]
fn end_agent_releases_without_reporting_and_wakes_the_refused() {
    let (mut c, t) = coord();
    c.claim(t, "p", "a", "x", None).unwrap();
    c.claim(t, "q", "a", "y", None).unwrap();
    c.claim(t, "p", "b", "x", None).unwrap();
    c.wait(t, "b", &projects(&["p"]), WaitToken(1), t + s(20))
        .unwrap();
    c.wait(t, "a", &projects(&["q"]), WaitToken(2), t + s(20))
        .unwrap();
    let ended = c.end_agent(t + s(1), "a");
    assert_eq!(
        ended.released,
        [
            ReleasedLease {
                project: "p".into(),
                resource: "x".into(),
                fence: 1
            },
            ReleasedLease {
                project: "q".into(),
                resource: "y".into(),
                fence: 1
            },
        ]
    );
    assert_eq!(ended.cancelled_waits, [WaitToken(2)]);
    let (token, ready) = c.poll_woken().unwrap();
    assert_eq!(
        (token, ready.reasons),
        (
            WaitToken(1),
            vec![WaitReason::Released {
                resource: "x".into()
            }]
        )
    );
    assert_eq!(c.poll_woken(), None);
    assert_eq!(c.take_lost(t + s(1), "a", None), vec![]);
    assert!(c.roster(t + s(1), "p").iter().all(|r| r.agent != "a"));
    assert!(c.claims(t + s(1), "q").is_empty());
    assert_eq!(c.claim(t + s(1), "p", "b", "x", None).map(fence), Ok(2));
}

#[test]
fn sled_events_concern_everyone_present_once() {
    let (mut c, t) = coord();
    c.sled_event(t, "p", "before".into(), None).unwrap();
    c.checkin(t, "p", "a", None, None, None).unwrap();
    c.wait(t, "a", &projects(&["p"]), WaitToken(1), t + s(20))
        .unwrap();
    assert_eq!(
        c.sled_event(t, "p", "deploy".into(), Some("1206".into())),
        Ok(2)
    );
    let reasons = vec![WaitReason::SledEvent {
        seq: 2,
        kind: "deploy".into(),
        story: Some("1206".into()),
    }];
    assert_eq!(
        c.poll_woken(),
        Some((
            WaitToken(1),
            WaitReady {
                project: Some("p".into()),
                reasons
            }
        ))
    );
    assert!(matches!(
        c.wait(t, "a", &projects(&["p"]), WaitToken(2), t + s(20)),
        Ok(WaitStart::Parked { .. })
    ));
    c.sled_event(t, "other", "elsewhere".into(), None).unwrap();
    assert_eq!(c.poll_woken(), None);
}

#[test]
fn lease_and_waiter_limits_refuse_with_typed_errors() {
    let limits = Limits {
        max_leases_per_agent: 2,
        max_resources_per_project: 3,
        max_waiters: 1,
        ..Limits::default()
    };
    let (mut c, t) = (Coord::new(limits), t0());
    c.claim(t, "p", "a", "1", None).unwrap();
    c.claim(t, "q", "a", "2", None).unwrap();
    let per_agent = Err(CoordError::Limit {
        which: CoordLimit::LeasesPerAgent,
        max: 2,
    });
    assert_eq!(c.claim(t, "p", "a", "3", None), per_agent);
    assert_eq!(
        c.claim(t, "p", "a", "1", None).map(fence),
        Ok(1),
        "re-entrant is not a new lease"
    );
    c.claim(t, "p", "b", "2", None).unwrap();
    c.claim(t, "p", "c", "3", None).unwrap();
    assert_eq!(
        c.claim(t, "p", "c", "4", None),
        Err(CoordError::Limit {
            which: CoordLimit::LeasesPerProject,
            max: 3
        })
    );
    c.wait(t, "a", &projects(&["p"]), WaitToken(1), t + s(20))
        .unwrap();
    assert_eq!(
        c.wait(t, "b", &projects(&["p"]), WaitToken(2), t + s(20)),
        Err(CoordError::TooManyWaiters { max: 1 })
    );
    assert_eq!(c.stats().refused_by_limit, 3);
}

#[test]
fn nothing_from_one_project_shows_in_another() {
    let (mut c, t) = coord();
    c.checkin(t, "p", "a", None, None, None).unwrap();
    c.checkin(t, "q", "a", None, None, None).unwrap();
    c.claim(t, "p", "b", "x", Some(s(5))).unwrap();
    c.send(t, "p", "b", Recipient::Channel, "p only".into(), None)
        .unwrap();
    c.send(
        t,
        "p",
        "b",
        Recipient::Agent("a".into()),
        "p only".into(),
        None,
    )
    .unwrap();
    c.board_set(t, "p", "b", "k", "1".into(), None, None)
        .unwrap();
    c.sled_event(t, "p", "deploy".into(), None).unwrap();
    assert_eq!(c.unread(t, "a", "q"), 0);
    assert_eq!(c.inbox(t, "q", "a", false, 10).unwrap(), Inbox::default());
    assert!(c.claims(t, "q").is_empty());
    assert_eq!(c.check_write(t, "q", "a", "x", false), WriteCheck::Unfenced);
    assert_eq!(c.board_get(t, "q", "k"), None);
    assert!(c.board_list(t, "q", None).is_empty());
    assert_eq!(c.roster(t, "q").len(), 1);
    assert!(matches!(
        c.wait(t, "a", &projects(&["q"]), WaitToken(1), t + s(20)),
        Ok(WaitStart::Parked { .. })
    ));
    c.handle_timeout(t + s(5));
    assert_eq!(c.take_lost(t + s(5), "b", Some("q")), vec![]);
    assert_eq!(c.poll_woken(), None);
    assert_eq!(c.take_lost(t + s(5), "b", Some("p")).len(), 1);
}

#[test]
fn the_sweep_empties_what_expired_and_absent_agents_are_forgotten() {
    let (mut c, t) = coord();
    c.checkin(t, "p", "a", None, None, Some(s(10))).unwrap();
    c.claim(t, "p", "a", "x", Some(s(20))).unwrap();
    c.send(t, "p", "a", Recipient::Channel, "m".into(), Some(s(30)))
        .unwrap();
    c.board_set(t, "p", "a", "k", "1".into(), None, Some(s(40)))
        .unwrap();
    assert_eq!(c.poll_timeout(), Some(t + s(10)));
    c.handle_timeout(t + s(10));
    assert_eq!((c.stats().present_agents, c.stats().live_leases), (0, 1));
    assert_eq!(c.poll_timeout(), Some(t + s(20)));
    c.handle_timeout(t + s(40));
    assert_eq!((c.stats().live_leases, c.stats().expiries), (0, 1));
    let p = &c.projects["p"];
    assert!(p.messages.is_empty() && p.board.is_empty());
    assert_eq!(
        c.poll_timeout(),
        Some(t + s(10) + s(3600)),
        "the forget timer"
    );
    c.handle_timeout(t + s(3610));
    assert!(c.projects["p"].members.is_empty() && c.agents.is_empty());
    assert_eq!(c.poll_timeout(), None);
    assert!(c.timers.is_empty());
}

/// The indexes agree with the state, and there is exactly one timer for each thing that expires.
fn assert_consistent(c: &Coord) {
    let has =
        |at: Instant, t: Timer| assert!(c.timers.contains(&(at, t.clone())), "no timer {t:?}");
    let mut timers = 0;
    for (name, p) in &c.projects {
        let project = name.clone();
        for (r, l) in &p.leases {
            assert!(p.members.get(&l.holder).is_some_and(|m| m.held.contains(r)));
            has(
                l.expires_at,
                Timer::Lease {
                    project: project.clone(),
                    resource: r.clone(),
                },
            );
            timers += 1;
        }
        for (a, m) in &p.members {
            assert!(m
                .held
                .iter()
                .all(|r| p.leases.get(r).is_some_and(|l| &l.holder == a)));
            for r in &m.refused_on {
                assert!(p.refused.get(r).is_some_and(|set| set.contains(a)));
                assert!(p.leases.get(r).is_some_and(|l| &l.holder != a));
            }
            assert!(c.agents.get(a).is_some_and(|ps| ps.contains(name)));
            let agent = a.clone();
            if let Some(at) = m.present_until {
                has(
                    at,
                    Timer::Presence {
                        project: project.clone(),
                        agent: agent.clone(),
                    },
                );
                timers += 1;
            }
            if let Some(at) = m.forget_at {
                has(
                    at,
                    Timer::Forget {
                        project: project.clone(),
                        agent,
                    },
                );
                timers += 1;
            }
        }
        for (id, m) in &p.messages {
            has(
                m.expires_at,
                Timer::Message {
                    project: project.clone(),
                    id: *id,
                },
            );
            timers += 1;
        }
        for (key, e) in &p.board {
            if let Some(at) = e.expires_at {
                has(
                    at,
                    Timer::Board {
                        project: project.clone(),
                        key: key.clone(),
                    },
                );
                timers += 1;
            }
        }
    }
    for (token, w) in &c.waiters {
        has(w.deadline, Timer::Wait(*token));
        timers += 1;
    }
    assert_eq!(c.timers.len(), timers, "stray timers");
}

/// Would a wait by `agent` on `project` be ready now?
fn pending(c: &Coord, project: &str, agent: &str) -> bool {
    let Some(p) = c.projects.get(project) else {
        return false;
    };
    let Some(m) = p.members.get(agent) else {
        return false;
    };
    !m.lost.is_empty()
        || !m.released.is_empty()
        || p.events.iter().any(|e| e.seq > m.event_cursor)
        || p.unread_ids(agent, m.cursor, m.joined).next().is_some()
}

/// One random step.
#[derive(Debug, Clone)]
enum Op {
    Advance(u64),
    Claim(usize, usize, usize, u64),
    Renew(usize, usize, usize),
    Release(usize, usize, usize),
    Force(usize, usize),
    Floor(usize, u64),
    Checkin(usize, usize),
    End(usize),
    Set(usize, usize, usize, Option<u64>, Option<u64>),
    Delete(usize, usize, usize, Option<u64>),
    Send(usize, usize, Option<usize>),
    Read(usize, usize, bool, usize),
    Wait(usize, usize, u64),
    Cancel(u64),
    Sled(usize),
    TakeLost(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let (p, a, r) = (0..2usize, 0..3usize, 0..3usize);
    prop_oneof![
        (0..4000u64).prop_map(Op::Advance),
        (p.clone(), a.clone(), r.clone(), 1..5000u64)
            .prop_map(|(p, a, r, ms)| Op::Claim(p, a, r, ms)),
        (p.clone(), a.clone(), r.clone()).prop_map(|(p, a, r)| Op::Renew(p, a, r)),
        (p.clone(), a.clone(), r.clone()).prop_map(|(p, a, r)| Op::Release(p, a, r)),
        (p.clone(), r.clone()).prop_map(|(p, r)| Op::Force(p, r)),
        (p.clone(), 0..40u64).prop_map(|(p, f)| Op::Floor(p, f)),
        (p.clone(), a.clone()).prop_map(|(p, a)| Op::Checkin(p, a)),
        a.clone().prop_map(Op::End),
        (
            p.clone(),
            a.clone(),
            r.clone(),
            proptest::option::of(0..6u64),
            proptest::option::of(1..3000u64)
        )
            .prop_map(|(p, a, k, rev, ttl)| Op::Set(p, a, k, rev, ttl)),
        (
            p.clone(),
            a.clone(),
            r.clone(),
            proptest::option::of(0..6u64)
        )
            .prop_map(|(p, a, k, rev)| Op::Delete(p, a, k, rev)),
        (p.clone(), a.clone(), proptest::option::of(a.clone()))
            .prop_map(|(p, a, to)| Op::Send(p, a, to)),
        (p.clone(), a.clone(), any::<bool>(), 0..3usize)
            .prop_map(|(p, a, peek, n)| Op::Read(p, a, peek, n)),
        (1..4usize, a.clone(), 0..30_000u64).prop_map(|(mask, a, ms)| Op::Wait(mask, a, ms)),
        (0..20u64).prop_map(Op::Cancel),
        p.prop_map(Op::Sled),
        a.prop_map(Op::TakeLost),
    ]
}

proptest! {
    #[test]
    fn leases_fences_revisions_and_wakes_hold_under_any_sequence(ops in proptest::collection::vec(op(), 1..100)) {
        const P: [&str; 2] = ["p", "q"];
        const A: [&str; 3] = ["a", "b", "c"];
        const R: [&str; 3] = ["x", "y", "z"];
        let ms = Duration::from_millis;
        let (mut c, mut now) = coord();
        c.persist();
        let mut top_fence = [0u64; 2];
        let mut top_rev = [0u64; 2];
        // Grants by (project, fence): (holder, resource, ended by its holder or end_agent).
        let mut grants: BTreeMap<(usize, u64), (usize, usize, bool)> = BTreeMap::new();
        let mut reported: Vec<(String, String, u64)> = Vec::new();
        let mut parked: BTreeSet<u64> = BTreeSet::new();
        let mut next_token = 0u64;
        let lost_reasons = |reported: &mut Vec<_>, project: &str, reasons: &[WaitReason]| {
            for r in reasons {
                if let WaitReason::LeaseLost { resource, fence, .. } = r {
                    reported.push((project.to_string(), resource.clone(), *fence));
                }
            }
        };
        for op in ops {
            match op {
                Op::Advance(d) => {
                    now += ms(d);
                    c.handle_timeout(now);
                }
                Op::Claim(p, a, r, ttl) => {
                    if let Ok(Claim::Acquired { fence, reentrant, .. }) = c.claim(now, P[p], A[a], R[r], Some(ms(ttl))) {
                        if reentrant {
                            prop_assert_eq!(grants.get(&(p, fence)).map(|g| (g.0, g.1)), Some((a, r)));
                        } else {
                            prop_assert!(fence > top_fence[p], "fence {} after {}", fence, top_fence[p]);
                            top_fence[p] = fence;
                            grants.insert((p, fence), (a, r, false));
                        }
                    }
                }
                Op::Renew(p, a, r) => {
                    if let Ok(renewed) = c.renew(now, P[p], A[a], R[r], None) {
                        prop_assert_eq!(c.check_write(now, P[p], A[a], R[r], true), WriteCheck::Fenced { fence: renewed.fence });
                    }
                }
                Op::Release(p, a, r) => {
                    if let Ok(Released { fence }) = c.release(now, P[p], A[a], R[r]) {
                        let g = grants.get_mut(&(p, fence));
                        prop_assert!(g.as_ref().is_some_and(|g| (g.0, g.1, g.2) == (a, r, false)));
                        if let Some(g) = g { g.2 = true; }
                    }
                }
                Op::Force(p, r) => {
                    let _ = c.force_release(now, P[p], R[r]);
                }
                Op::Floor(p, f) => {
                    let before: BTreeMap<String, u64> =
                        c.claims(now, P[p]).into_iter().map(|l| (l.resource, l.fence)).collect();
                    let counter = c.raise_fence_floor(P[p], f).unwrap();
                    // The first report re-fences the leases not above it: their grants move.
                    for l in c.claims(now, P[p]) {
                        let old = before[&l.resource];
                        if old != l.fence {
                            prop_assert!(old <= f && l.fence > f.max(top_fence[p]), "{} re-fenced {} -> {}", l.resource, old, l.fence);
                            let g = grants.remove(&(p, old));
                            prop_assert!(g.is_some());
                            if let Some(g) = g {
                                grants.insert((p, l.fence), g);
                            }
                        }
                    }
                    top_fence[p] = top_fence[p].max(counter);
                }
                Op::Checkin(p, a) => {
                    if let Ok(got) = c.checkin(now, P[p], A[a], None, None, None) {
                        reported.extend(got.lost.into_iter().map(|l| (l.project, l.resource, l.fence)));
                    }
                }
                Op::End(a) => {
                    let ended = c.end_agent(now, A[a]);
                    for l in ended.released {
                        let p = P.iter().position(|p| *p == l.project).unwrap();
                        if let Some(g) = grants.get_mut(&(p, l.fence)) { g.2 = true; }
                    }
                    // Unreported losses of an ended agent are dropped with it.
                    for ((p, fence), g) in grants.iter_mut().filter(|(_, g)| g.0 == a) {
                        let key = (P[*p].to_string(), R[g.1].to_string(), *fence);
                        if !reported.contains(&key) {
                            g.2 = true;
                        }
                    }
                    for t in ended.cancelled_waits {
                        prop_assert!(parked.remove(&t.0));
                    }
                }
                Op::Set(p, a, k, rev, ttl) => {
                    if let Ok(set) = c.board_set(now, P[p], A[a], R[k], "1".into(), rev, ttl.map(ms)) {
                        prop_assert!(set.revision > top_rev[p]);
                        top_rev[p] = set.revision;
                    }
                }
                Op::Delete(p, a, k, rev) => {
                    let _ = c.board_delete(now, P[p], A[a], R[k], rev);
                }
                Op::Send(p, a, to) => {
                    let to = to.map_or(Recipient::Channel, |t| Recipient::Agent(A[t].into()));
                    let _ = c.send(now, P[p], A[a], to, "m".into(), Some(ms(20_000)));
                }
                Op::Read(p, a, peek, n) => {
                    c.inbox(now, P[p], A[a], true, 0).unwrap(); // a member from here on
                    let before = c.unread(now, A[a], P[p]);
                    let inbox = c.inbox(now, P[p], A[a], peek, n).unwrap();
                    prop_assert!(inbox.messages.windows(2).all(|w| w[0].id < w[1].id));
                    let read = if peek { 0 } else { inbox.messages.len() };
                    prop_assert_eq!(inbox.unread, before - read);
                    prop_assert_eq!(inbox.more, before > inbox.messages.len());
                }
                Op::Wait(mask, a, d) => {
                    let names: Vec<String> = (0..2).filter(|i| mask & (1 << i) != 0).map(|i| P[i].to_string()).collect();
                    next_token += 1;
                    match c.wait(now, A[a], &names, WaitToken(next_token), now + ms(d)).unwrap() {
                        WaitStart::Ready(ready) => {
                            if let Some(project) = &ready.project {
                                lost_reasons(&mut reported, project, &ready.reasons);
                            }
                        }
                        WaitStart::Parked { .. } => {
                            prop_assert!(names.iter().all(|p| !pending(&c, p, A[a])));
                            parked.insert(next_token);
                        }
                    }
                }
                Op::Cancel(t) => {
                    prop_assert_eq!(c.cancel_wait(WaitToken(t)), parked.remove(&t));
                }
                Op::Sled(p) => {
                    c.sled_event(now, P[p], "deploy".into(), None).unwrap();
                }
                Op::TakeLost(a) => {
                    reported.extend(c.take_lost(now, A[a], None).into_iter().map(|l| (l.project, l.resource, l.fence)));
                }
            }
            while let Some((token, ready)) = c.poll_woken() {
                prop_assert!(parked.remove(&token.0), "woken twice or never parked: {:?}", token);
                if let Some(project) = &ready.project {
                    prop_assert!(!ready.reasons.is_empty());
                    lost_reasons(&mut reported, project, &ready.reasons);
                }
            }
            // No lost wakeup: nothing a parked waiter waits for is pending.
            for w in c.waiters.values() {
                prop_assert!(w.projects.iter().all(|p| !pending(&c, p, &w.agent)), "{:?} missed a wake", w);
            }
            for p in P {
                for r in R {
                    let fenced = A
                        .iter()
                        .filter(|a| matches!(c.check_write(now, p, a, r, true), WriteCheck::Fenced { .. }))
                        .count();
                    prop_assert!(fenced <= 1, "{} holders of {}/{}", fenced, p, r);
                }
                for lease in c.claims(now, p) {
                    prop_assert!(lease.expires_in > Duration::ZERO);
                }
            }
            prop_assert!(c.poll_timeout().is_none_or(|at| at > now));
            assert_consistent(&c);
            // Every change was marked where it was made: comparing every entry finds nothing
            // more to write than comparing the marked ones did.
            c.take_changes(now);
            c.mark_all();
            let missed = c.take_changes(now);
            prop_assert!(missed.is_empty(), "changes nobody marked: {:?}", missed);
        }
        // Let everything run out: every parked wait ends, every lost lease is reported once.
        now += s(60);
        c.handle_timeout(now);
        while let Some((token, ready)) = c.poll_woken() {
            prop_assert!(parked.remove(&token.0));
            if let Some(project) = &ready.project {
                lost_reasons(&mut reported, project, &ready.reasons);
            }
        }
        prop_assert!(parked.is_empty(), "never woken: {:?}", parked);
        for a in A {
            reported.extend(c.take_lost(now, a, None).into_iter().map(|l| (l.project, l.resource, l.fence)));
        }
        reported.sort();
        let mut expected: Vec<(String, String, u64)> = grants
            .iter()
            .filter(|(_, g)| !g.2)
            .map(|((p, fence), g)| (P[*p].to_string(), R[g.1].to_string(), *fence))
            .collect();
        expected.sort();
        prop_assert_eq!(reported, expected);
    }
}

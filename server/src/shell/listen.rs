//! `gateway listen [--project P]… [--until +SECONDS|TIME]`: for agent runners that can start a
//! background process and wake an agent when it exits.
//!
//! It checks in to each named project (so the agent is present there; without `--project`
//! it listens wherever the agent already is), then calls the coordination `wait` (at most
//! 25 s each) as this shell's agent, again and again until the deadline. Exit status: 0 with
//! the wake (the wait's `structuredContent`, one line of JSON) on stdout as soon as something
//! concerns the agent; 2 at the deadline; 1 on a failure that three retries (1, 2, 4 s apart)
//! did not cure, or that lasted until the deadline. Only failures that can pass are retried
//! (the gateway unreachable, shutting down, at a limit); an unknown project is final. Each `wait` touches the agent's presence, so a listening agent stays on the
//! roster. Nothing is lost between two waits: the gateway keeps the agent's cursors, and a
//! wait answers at once when something arrived since the last one. An unread message keeps
//! waking `listen` until it is read (`gateway inbox`).

use std::time::{Duration, SystemTime};

use clap::{Arg, ArgAction, ArgMatches, Command};
use serde_json::{json, Map, Value};
use tokio::time::Instant;

use super::{agent, fail, Conn, Failure};

/// The longest one `wait` may park (the gateway's limit).
const MAX_WAIT_S: u64 = 25;
/// Retries of a failed `wait` before giving up, and the first pause (doubled each time).
const RETRIES: u32 = 3;
const FIRST_BACKOFF: Duration = Duration::from_secs(1);

/// Exit statuses (a failure is 1, from [`fail`]).
const WOKE: u8 = 0;
const DEADLINE: u8 = 2;

pub(crate) fn command() -> Command {
    Command::new(super::LISTEN)
        .about("Wait for anything that concerns this shell's agent; exit 0 with it, 2 at the deadline")
        .long_about(
            "Wait for anything that concerns this shell's agent: a message to it or to a \
             project's channel, a lease it lost, a lease it was refused now released, a sled \
             event. Re-waits (25 s at a time, which keeps the agent present) until --until.\n\n\
             Exit status: 0 with the event as JSON on stdout; 2 at the deadline; 1 on a \
             failure (after 3 retries). Read messages with `gateway inbox`: an unread one \
             wakes the next listen at once.",
        )
        .arg(
            Arg::new("project")
                .long("project")
                .value_name("PROJECT")
                .action(ArgAction::Append)
                .help("A project to listen in (repeatable; checks in there first). Default: every project the agent is present in"),
        )
        .arg(
            Arg::new("until")
                .long("until")
                .value_name("+SECONDS|TIME")
                .value_parser(parse_until)
                .help("When to give up (exit 2): +SECONDS from now, or an RFC 3339 time (2026-01-31T18:00:00Z). Default: never"),
        )
}

/// A deadline as given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Until {
    In(Duration),
    At(SystemTime),
}

fn parse_until(s: &str) -> Result<Until, String> {
    if let Some(secs) = s.strip_prefix('+') {
        return secs
            .parse::<u64>()
            .map(|n| Until::In(Duration::from_secs(n)))
            .map_err(|_| format!("expected +SECONDS (a whole number), got {s:?}"));
    }
    parse_rfc3339(s).map(Until::At).ok_or_else(|| {
        format!("expected +SECONDS or an RFC 3339 time like 2026-01-31T18:00:00Z, got {s:?}")
    })
}

/// `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`.
fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut i = 19;
    let mut nanos = 0u32;
    if b[i] == b'.' {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let digits = s.get(start..i.min(start + 9))?;
        if digits.is_empty() {
            return None;
        }
        nanos = format!("{digits:0<9}").parse().ok()?;
    }
    let offset = match b.get(i)? {
        b'Z' | b'z' if i + 1 == b.len() => 0,
        sign @ (b'+' | b'-') if i + 6 == b.len() && b[i + 3] == b':' => {
            let o = num(i + 1..i + 3)? * 3600 + num(i + 4..i + 6)? * 60;
            if *sign == b'+' {
                o
            } else {
                -o
            }
        }
        _ => return None,
    };
    // Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's days_from_civil).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec - offset;
    let secs = u64::try_from(secs).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::new(secs, nanos))
}

/// The deadline on tokio's clock.
fn deadline(until: Until) -> Instant {
    let now = Instant::now();
    match until {
        Until::In(d) => now + d,
        Until::At(t) => {
            now + t
                .duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO)
        }
    }
}

/// Whether a failure may pass by itself: the gateway unreachable or shutting down, or a
/// limit that says when to retry.
fn transient(f: &Failure) -> bool {
    match f {
        Failure::Transport(_) => true,
        Failure::Tool { .. } => matches!(
            f.kind(),
            Some("shutting_down" | "limit" | "too_many_calls" | "uplink_lost")
        ),
    }
}

pub(crate) async fn run(conn: &mut Conn, m: &ArgMatches) -> u8 {
    let projects: Vec<String> = m
        .get_many::<String>("project")
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    let deadline = m.get_one::<Until>("until").copied().map(deadline);
    let hint = projects.first().cloned();
    let mut failures = 0u32;

    // No checkin first: it would read (and so take) the agent's unread messages, which this
    // wait must report. `wait` itself makes the agent present in each project it names.
    loop {
        let timeout_s = match deadline {
            None => MAX_WAIT_S,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return DEADLINE;
                }
                left.as_secs_f64().ceil().clamp(1.0, MAX_WAIT_S as f64) as u64
            }
        };
        let mut args = Map::new();
        args.insert("timeout_s".into(), json!(timeout_s));
        if !projects.is_empty() {
            args.insert("projects".into(), json!(projects));
        }
        let limit = Some(Duration::from_secs(timeout_s + 15));
        match agent::call_as_agent(conn, "wait", args, hint.as_deref(), limit).await {
            Ok(wake) if wake["woke"] == Value::Bool(true) => {
                println!("{wake}");
                return WOKE;
            }
            Ok(_) => failures = 0,
            Err(f) => {
                if let Some(code) = backoff(&f, &mut failures, deadline).await {
                    return code;
                }
            }
        }
    }
}

/// After a failure: `Some(exit status)` to stop, or `None` after pausing, to try again. A
/// failure that outlasts the retries, or the deadline, is a failure (1), not a deadline: the
/// listen was not listening.
async fn backoff(f: &Failure, failures: &mut u32, deadline: Option<Instant>) -> Option<u8> {
    let pause = FIRST_BACKOFF * 2u32.pow(*failures);
    let past_deadline = deadline.is_some_and(|d| Instant::now() + pause >= d);
    if !transient(f) || *failures >= RETRIES || past_deadline {
        return Some(fail(f));
    }
    *failures += 1;
    eprintln!(
        "gateway: {} (retry {}/{RETRIES} in {} s)",
        f.line(),
        *failures,
        pause.as_secs()
    );
    tokio::time::sleep(pause).await;
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn until_is_seconds_from_now_or_a_time() {
        assert_eq!(parse_until("+60"), Ok(Until::In(Duration::from_secs(60))));
        let at = |s| match parse_until(s) {
            Ok(Until::At(t)) => t.duration_since(SystemTime::UNIX_EPOCH).unwrap(),
            other => panic!("{s}: {other:?}"),
        };
        assert_eq!(at("1970-01-01T00:00:00Z"), Duration::ZERO);
        assert_eq!(at("2000-03-01T00:00:00Z").as_secs(), 951_868_800);
        assert_eq!(at("2026-01-31T18:00:00Z").as_secs(), 1_769_882_400);
        assert_eq!(at("2026-01-31T20:00:00+02:00").as_secs(), 1_769_882_400);
        assert_eq!(at("2026-01-31T17:00:00-01:00").as_secs(), 1_769_882_400);
        assert_eq!(
            at("2026-01-31T18:00:00.25Z"),
            Duration::new(1_769_882_400, 250_000_000)
        );
        for bad in [
            "60",
            "+x",
            "2026-01-31",
            "2026-13-01T00:00:00Z",
            "2026-01-31T18:00:00",
            "tomorrow",
        ] {
            assert!(parse_until(bad).is_err(), "{bad}");
        }
    }
}

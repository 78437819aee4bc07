//! W3C trace context (`traceparent`, `tracestate`) carried from a client's request to the sled.
//!
//! A client puts `traceparent` (and optionally `tracestate`) in a request's `params._meta`, in
//! either era. The gateway takes part in the trace as one span: the forwarded request's
//! `_meta.traceparent` keeps the client's trace id and flags and names the gateway's own span
//! (a fresh span id from its seeded generator) as the parent; `tracestate` passes through as
//! written. A `traceparent` that does not parse (version `00` only; lowercase hex; neither id
//! all zeros) is dropped with its `tracestate`, as the W3C recommendation says: nothing invalid
//! is forwarded. The trace id goes on the gateway's log lines for the call.

/// The `_meta` keys, as W3C names the headers.
pub(crate) const TRACEPARENT: &str = "traceparent";
pub(crate) const TRACESTATE: &str = "tracestate";

/// A parsed `traceparent`: `00-<trace id>-<parent id>-<flags>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TraceParent {
    /// 32 lowercase hex digits.
    pub(crate) trace_id: String,
    /// 2 hex digits.
    pub(crate) flags: String,
}

fn lower_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Parses a `traceparent` value; `None` when it is not a valid version-00 one.
pub(crate) fn parse(value: &str) -> Option<TraceParent> {
    let mut parts = value.split('-');
    let (version, trace_id, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let valid = parts.next().is_none()
        && version == "00"
        && lower_hex(trace_id, 32)
        && lower_hex(parent, 16)
        && lower_hex(flags, 2)
        && trace_id.bytes().any(|b| b != b'0')
        && parent.bytes().any(|b| b != b'0');
    valid.then(|| TraceParent {
        trace_id: trace_id.to_owned(),
        flags: flags.to_owned(),
    })
}

/// The `traceparent` of the gateway's span in `trace`: its span id from 8 random bytes (never
/// all zeros).
pub(crate) fn child(trace: &TraceParent, mut span: [u8; 8]) -> String {
    if span == [0; 8] {
        span[7] = 1;
    }
    let span: String = span.iter().map(|b| format!("{b:02x}")).collect();
    format!("00-{}-{span}-{}", trace.trace_id, trace.flags)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_and_invalid_traceparents() {
        let t = parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(t.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.flags, "01");
        assert_eq!(
            child(&t, [0xab; 8]),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-abababababababab-01"
        );
        assert_eq!(
            child(&t, [0; 8]),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000001-01"
        );
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}

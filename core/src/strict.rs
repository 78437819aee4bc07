//! What a strict JSON reader accepts, checked before anything a client wrote is forwarded.
//!
//! The gateway forwards a client's values as written (raw text, never re-serialised), and the
//! edge parser reads them as raw values, which skips what it does not need: it neither decodes
//! string escapes nor counts nesting. A sled's parser does both. A value it rejects makes the
//! whole frame unreadable, the sled cannot name the frame's id, and the call would hang until
//! its deadline. So every member the gateway may forward (`params`, a response's `result` or
//! `error`) is read once more here, by serde_json itself with its defaults, and refused at once
//! when a strict reader would reject it:
//!
//! - a string escape that is not a Unicode scalar value (a lone surrogate such as `"\ud800"`);
//! - a number outside the range of an `f64` (`1e400`);
//! - nesting deeper than [`MAX_CLIENT_DEPTH`] levels (a frame then nests at most a few levels
//!   more, well within serde_json's default limit of [`MAX_FRAME_DEPTH`]).
//!
//! Invalid UTF-8 is refused before this, for the whole body (see `jsonrpc::parse_client`).
//! The check borrows every string without escapes, so it allocates nothing for ordinary input.

use std::cell::Cell;
use std::fmt;

use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::Deserializer;

/// How deep a value a client sends may nest (the member itself is level 1).
pub const MAX_CLIENT_DEPTH: usize = 64;

/// How deep any frame on an uplink may nest: serde_json's default recursion limit, which a sled
/// reading with serde_json's defaults enforces.
pub const MAX_FRAME_DEPTH: usize = 128;

/// Why a value would not be read by a strict parser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreadable {
    /// Nested deeper than the limit.
    TooDeep { limit: usize },
    /// A string, number or structure a strict reader rejects; serde_json's words.
    Invalid { detail: String },
}

/// Checks that `raw` (already known to be JSON syntax) reads under serde_json's defaults and
/// nests at most `max_depth` levels.
pub(crate) fn check(raw: &str, max_depth: usize) -> Result<(), Unreadable> {
    let too_deep = Cell::new(false);
    let mut de = serde_json::Deserializer::from_str(raw);
    let result = Check {
        depth_left: max_depth,
        too_deep: &too_deep,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end());
    match result {
        Ok(()) => Ok(()),
        Err(_) if too_deep.get() => Err(Unreadable::TooDeep { limit: max_depth }),
        Err(e) => Err(Unreadable::Invalid {
            detail: crate::jsonrpc::clean_serde_message(&e),
        }),
    }
}

/// Reads one value and throws it away, counting depth.
#[derive(Clone, Copy)]
struct Check<'c> {
    depth_left: usize,
    too_deep: &'c Cell<bool>,
}

impl Check<'_> {
    fn enter<E: serde::de::Error>(self) -> Result<Self, E> {
        match self.depth_left.checked_sub(1) {
            Some(depth_left) => Ok(Check { depth_left, ..self }),
            None => {
                self.too_deep.set(true);
                Err(E::custom("nested too deep"))
            }
        }
    }
}

impl<'de> DeserializeSeed<'de> for Check<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Check<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<(), E> {
        if v.is_finite() {
            Ok(())
        } else {
            Err(E::custom("number out of range"))
        }
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let inner = self.enter::<A::Error>()?;
        while seq.next_element_seed(inner)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let inner = self.enter::<A::Error>()?;
        while map.next_key_seed(inner)?.is_some() {
            map.next_value_seed(inner)?;
        }
        Ok(())
    }
}

impl fmt::Display for Unreadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unreadable::TooDeep { limit } => {
                write!(f, "nested more than {limit} levels deep")
            }
            Unreadable::Invalid { detail } => f.write_str(detail),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(open: &str, close: &str, n: usize) -> String {
        format!("{}{}", open.repeat(n), close.repeat(n))
    }

    #[test]
    fn ordinary_values_pass() {
        for ok in [
            r#"{"a":[1,2.5,-3,"x\"y",true,null,{}],"b":"\ud83d\ude00"}"#,
            "123456789012345678901234567890",
            r#""é and \u00e9""#,
            "1.7976931348623157e308",
        ] {
            assert_eq!(check(ok, MAX_CLIENT_DEPTH), Ok(()), "{ok}");
        }
        assert_eq!(check(&nested("[", "]", 64), 64), Ok(()));
        let object = format!("{}1{}", r#"{"k":"#.repeat(64), "}".repeat(64));
        assert_eq!(check(&object, 64), Ok(()));
    }

    #[test]
    fn what_a_strict_reader_rejects_is_named() {
        for (bad, what) in [
            (r#"{"a":"\ud800"}"#, "hex escape"),
            (r#"["\ud800\u0041"]"#, "surrogate"),
            (r#"["\udc00x"]"#, "surrogate"),
            (r#"{"\ud800":1}"#, "hex escape"),
            (r#"[1e400]"#, "out of range"),
            (r#"{"a":-1e400}"#, "out of range"),
        ] {
            match check(bad, MAX_CLIENT_DEPTH) {
                Err(Unreadable::Invalid { detail }) => {
                    assert!(detail.contains(what), "{bad}: {detail}")
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
        assert_eq!(
            check(&nested("[", "]", 65), 64),
            Err(Unreadable::TooDeep { limit: 64 })
        );
        assert_eq!(
            check(&nested("[", "]", 100_000), 64),
            Err(Unreadable::TooDeep { limit: 64 })
        );
        let deep_object = format!("{}1{}", r#"{"k":"#.repeat(65), "}".repeat(65));
        assert_eq!(
            check(&deep_object, 64),
            Err(Unreadable::TooDeep { limit: 64 })
        );
    }

    #[test]
    fn whatever_passes_reads_as_a_value() {
        // The promise: a value that passes is one serde_json's defaults read.
        let value = r#"{"a":[{"b":"\ud83d\ude00"},1e300,-0,12345678901234567890123]}"#;
        assert_eq!(check(value, MAX_CLIENT_DEPTH), Ok(()));
        serde_json::from_str::<serde_json::Value>(value).unwrap();
    }
}

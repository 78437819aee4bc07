//! Where in a tool's arguments the resources it writes are named: a [`LeaseSpot`].
//!
//! A sled marks the spot in the tool's input schema with [`LEASE_KEYWORD`], whose value is the
//! resource kind; the resource is `"<kind>:<value>"`. Three spots are understood, the shapes
//! real servers write their arguments in:
//!
//! - a string property, `properties.story_id` (`story_id`): one resource;
//! - the items of an array of strings, `properties.entityNames.items` (`entityNames[]`): one
//!   resource per item;
//! - a string property of the objects of an array, `properties.observations.items.properties.
//!   entityName` (`observations[].entityName`): one resource per object.
//!
//! The gateway finds the spot in a listing ([`LeaseSpot::in_tool`]) and takes each call's
//! resources from it ([`LeaseSpot::resources`]); gateway-sled marks it for servers that know
//! nothing of leases ([`LeaseSpot::parse`], [`LeaseSpot::mark`]). One call's fences travel in
//! `params._meta[FENCE_META]`: an object `{"resource","fence"}` when it carries one, an array
//! of them when it carries several ([`fences_meta`], [`fences_from_meta`]).

use std::collections::BTreeSet;
use std::fmt;

use serde_json::{json, Map, Value};

use crate::uplink::{FENCE_META, LEASE_KEYWORD};

/// The most resources one call may write under leases: a call naming more is refused before it
/// is checked or forwarded (a lease check per item is work a client chooses the size of).
pub const MAX_LEASED_RESOURCES: usize = 64;

/// Where a tool's arguments name the resources it writes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaseSpot {
    /// The top-level argument.
    pub argument: String,
    /// Within it, for an array argument.
    pub each: Option<Each>,
    /// The resource kind: the resource is `"<kind>:<value>"`.
    pub kind: String,
}

/// Where an array argument's items name resources.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Each {
    /// Each item is a string naming one.
    Item,
    /// Each item is an object whose string property of this name names one.
    Field(String),
}

impl fmt::Display for LeaseSpot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.each {
            None => write!(f, "{}", self.argument),
            Some(Each::Item) => write!(f, "{}[]", self.argument),
            Some(Each::Field(field)) => write!(f, "{}[].{field}", self.argument),
        }
    }
}

/// A property name in a spot's path: what an argument may be called, without the characters
/// the path syntax uses.
fn valid_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['[', ']', '.', '/', '~']) && name.len() <= 128
}

impl LeaseSpot {
    /// A spot written as a path, as gateway-sled's config names it: `ARG`, `ARG[]` or
    /// `ARG[].FIELD`.
    pub fn parse(path: &str, kind: &str) -> Result<LeaseSpot, String> {
        let bad = || {
            format!(
                "lease argument {path:?}: expected ARGUMENT, ARGUMENT[] (each item of an array \
                 of strings) or ARGUMENT[].FIELD (a field of each object of an array)"
            )
        };
        if kind.is_empty() || kind.contains(':') {
            return Err(format!(
                "lease kind {kind:?}: expected a non-empty name without ':'"
            ));
        }
        let (argument, each) = match path.split_once("[]") {
            None => (path, None),
            Some((argument, "")) => (argument, Some(Each::Item)),
            Some((argument, rest)) => match rest.strip_prefix('.') {
                Some(field) if valid_name(field) => (argument, Some(Each::Field(field.to_owned()))),
                _ => return Err(bad()),
            },
        };
        if !valid_name(argument) {
            return Err(bad());
        }
        Ok(LeaseSpot {
            argument: argument.to_owned(),
            each,
            kind: kind.to_owned(),
        })
    }

    /// The spot a tool's listing marks with [`LEASE_KEYWORD`]: the first property (in name
    /// order, of the input schema and then of each schema it also applies: a local `$ref`,
    /// an `allOf`/`anyOf`/`oneOf` branch) marked itself, on its `items`, or on a property of
    /// its `items`; a property, its `items` and theirs may each be a local `$ref`.
    pub fn in_tool(tool: &Value) -> Option<LeaseSpot> {
        let kind = |at: &str| -> Option<String> {
            let kind = tool.pointer(at)?.get(LEASE_KEYWORD)?.as_str()?;
            (!kind.is_empty()).then(|| kind.to_owned())
        };
        for object in object_schemas(tool) {
            let Some(properties) = tool
                .pointer(&format!("{object}/properties"))
                .and_then(Value::as_object)
            else {
                continue;
            };
            for argument in properties.keys() {
                let spot = |each, kind| LeaseSpot {
                    argument: argument.clone(),
                    each,
                    kind,
                };
                let at = format!("{object}/properties/{}", pointer_escape(argument));
                let Some(at) = resolve(tool, at) else {
                    continue;
                };
                if let Some(k) = kind(&at) {
                    return Some(spot(None, k));
                }
                let Some(items) = resolve(tool, format!("{at}/items")) else {
                    continue;
                };
                if let Some(k) = kind(&items) {
                    return Some(spot(Some(Each::Item), k));
                }
                let fields = tool
                    .pointer(&format!("{items}/properties"))
                    .and_then(Value::as_object);
                for field in fields.into_iter().flat_map(|f| f.keys()) {
                    let at = format!("{items}/properties/{}", pointer_escape(field));
                    if let Some(k) = resolve(tool, at).and_then(|at| kind(&at)) {
                        return Some(spot(Some(Each::Field(field.clone())), k));
                    }
                }
            }
        }
        None
    }

    /// Marks the spot in `tool`'s input schema, where [`LeaseSpot::in_tool`] looks for it:
    /// the argument as the first schema that lists it defines it (following local `$ref`s).
    /// `false` when the schema does not have it (the argument is not listed, or not an array
    /// of the shape the spot says).
    pub fn mark(&self, tool: &mut Value) -> bool {
        let Some(at) = self.locate(tool) else {
            return false;
        };
        match tool.pointer_mut(&at).and_then(Value::as_object_mut) {
            Some(schema) => {
                schema.insert(LEASE_KEYWORD.to_owned(), json!(self.kind));
                true
            }
            None => false,
        }
    }

    /// The JSON pointer, in `tool`, of the schema this spot marks.
    fn locate(&self, tool: &Value) -> Option<String> {
        let argument = pointer_escape(&self.argument);
        let at = object_schemas(tool).into_iter().find_map(|object| {
            let at = format!("{object}/properties/{argument}");
            tool.pointer(&at).is_some().then_some(at)
        })?;
        let at = resolve(tool, at)?;
        let at = match &self.each {
            None => at,
            Some(Each::Item) => resolve(tool, format!("{at}/items"))?,
            Some(Each::Field(field)) => {
                let items = resolve(tool, format!("{at}/items"))?;
                resolve(
                    tool,
                    format!("{items}/properties/{}", pointer_escape(field)),
                )?
            }
        };
        tool.pointer(&at)?.is_object().then_some(at)
    }

    /// The resources a call writes, from its argument at this spot (`None`: absent), each
    /// once, in order. Items that are not strings name nothing (the server refuses such a call
    /// itself). More than [`MAX_LEASED_RESOURCES`] is an error naming the spot.
    pub fn resources(&self, argument: Option<&Value>) -> Result<Vec<String>, String> {
        let Some(value) = argument else {
            return Ok(Vec::new());
        };
        let named: Vec<&str> = match &self.each {
            None => value.as_str().into_iter().collect(),
            Some(each) => {
                let items = value.as_array().map(Vec::as_slice).unwrap_or_default();
                items
                    .iter()
                    .filter_map(|item| match each {
                        Each::Item => item.as_str(),
                        Each::Field(field) => item.get(field)?.as_str(),
                    })
                    .collect()
            }
        };
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for name in named {
            if seen.insert(name) {
                if out.len() == MAX_LEASED_RESOURCES {
                    return Err(format!(
                        "`{self}` names more than {MAX_LEASED_RESOURCES} leased resources in one \
                         call; write them in several calls"
                    ));
                }
                out.push(format!("{}:{name}", self.kind));
            }
        }
        Ok(out)
    }
}

/// The most schemas [`object_schemas`] visits in one tool, and the most `$ref` hops
/// [`resolve`] follows.
const MAX_SCHEMAS: usize = 256;
const MAX_REF_HOPS: usize = 16;

/// The JSON pointers, in `tool`, of its input schema and of each schema that also applies to
/// the same object: the target of a local `$ref`, each `allOf`/`anyOf`/`oneOf` branch, and
/// theirs, in breadth-first order, each once.
fn object_schemas(tool: &Value) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    let mut todo = std::collections::VecDeque::from([String::from("/inputSchema")]);
    while let Some(at) = todo.pop_front() {
        if seen.len() >= MAX_SCHEMAS || seen.contains(&at) {
            continue;
        }
        let Some(schema) = tool.pointer(&at).and_then(Value::as_object) else {
            continue;
        };
        if let Some(target) = schema
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(local_ref)
        {
            todo.push_back(target);
        }
        for k in ["allOf", "anyOf", "oneOf"] {
            if let Some(branches) = schema.get(k).and_then(Value::as_array) {
                todo.extend((0..branches.len()).map(|i| format!("{at}/{k}/{i}")));
            }
        }
        seen.push(at);
    }
    seen
}

/// A local reference (`#/$defs/Args`) as a pointer in the tool (references are resolved
/// against the input schema, the document root); `None` for any other.
fn local_ref(reference: &str) -> Option<String> {
    let path = reference.strip_prefix('#')?;
    (path.is_empty() || path.starts_with('/')).then(|| format!("/inputSchema{path}"))
}

/// `at` with its local `$ref`s followed (a schema that is only a reference is the schema it
/// names); `None` when `at` is not in `tool`, or the references go round or too deep.
fn resolve(tool: &Value, mut at: String) -> Option<String> {
    for _ in 0..MAX_REF_HOPS {
        let schema = tool.pointer(&at)?;
        match schema
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(local_ref)
        {
            Some(target) => at = target,
            None => return Some(at),
        }
    }
    None
}

/// RFC 6901: `~` and `/` in a JSON pointer's token.
fn pointer_escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

/// One call's fences as they go in `params._meta[FENCE_META]`: the object for one, an array
/// for several. `None` when there are none.
pub fn fences_meta(fences: &[(String, u64)]) -> Option<Value> {
    let one = |(resource, fence): &(String, u64)| json!({ "resource": resource, "fence": fence });
    match fences {
        [] => None,
        [only] => Some(one(only)),
        many => Some(Value::Array(many.iter().map(one).collect())),
    }
}

/// The fences in a call's `params._meta` (its `_meta` object, or none): empty when it carries
/// none; an error naming what is wrong when [`FENCE_META`] is not an object or an array of
/// `{"resource": string, "fence": non-negative integer}`, or names one resource twice.
pub fn fences_from_meta(meta: Option<&Map<String, Value>>) -> Result<Vec<(String, u64)>, String> {
    let Some(value) = meta.and_then(|m| m.get(FENCE_META)) else {
        return Ok(Vec::new());
    };
    let bad = || {
        format!(
            "Invalid params: _meta[\"{FENCE_META}\"] must be {{\"resource\": string, \"fence\": \
             non-negative integer}} or an array of them, one per resource"
        )
    };
    let one = |v: &Value| match (
        v.get("resource").and_then(Value::as_str),
        v.get("fence").and_then(Value::as_u64),
    ) {
        (Some(r), Some(f)) => Ok((r.to_owned(), f)),
        _ => Err(bad()),
    };
    let fences = match value {
        Value::Array(items) if !items.is_empty() && items.len() <= MAX_LEASED_RESOURCES => {
            items.iter().map(one).collect::<Result<Vec<_>, _>>()?
        }
        Value::Object(_) => vec![one(value)?],
        _ => return Err(bad()),
    };
    let distinct: BTreeSet<&str> = fences.iter().map(|(r, _)| r.as_str()).collect();
    if distinct.len() != fences.len() {
        return Err(bad());
    }
    Ok(fences)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spot(path: &str) -> LeaseSpot {
        LeaseSpot::parse(path, "entity").unwrap()
    }

    #[test]
    fn paths_parse_and_print_back() {
        for path in ["entityName", "entityNames[]", "observations[].entityName"] {
            assert_eq!(spot(path).to_string(), path);
        }
        assert_eq!(spot("a[].b").each, Some(Each::Field("b".into())));
        for bad in [
            "", "[]", "a[]b", "a[].", "a[][]", "a.b", "a[].b[]", "a[].b.c", "a/b",
        ] {
            assert!(LeaseSpot::parse(bad, "k").is_err(), "{bad:?} parsed");
        }
        assert!(LeaseSpot::parse("a", "").is_err());
        assert!(LeaseSpot::parse("a", "x:y").is_err());
    }

    /// What the connector marks, the gateway finds: each of the three shapes, as server-memory
    /// writes them.
    #[test]
    fn a_marked_spot_is_found_in_the_listing() {
        let tool = || {
            json!({"name": "t", "inputSchema": {"type": "object", "properties": {
                "entityName": {"type": "string"},
                "entityNames": {"type": "array", "items": {"type": "string"}},
                "observations": {"type": "array", "items": {"type": "object",
                    "properties": {"entityName": {"type": "string"}, "contents": {"type": "array"}}}}
            }}})
        };
        for path in ["entityName", "entityNames[]", "observations[].entityName"] {
            let mut t = tool();
            assert!(spot(path).mark(&mut t), "{path}");
            assert_eq!(LeaseSpot::in_tool(&t), Some(spot(path)), "{path}");
        }
        assert_eq!(LeaseSpot::in_tool(&tool()), None);
        for missing in [
            "other",
            "entityName[]",
            "entityNames[].x",
            "nope[].entityName",
        ] {
            assert!(!spot(missing).mark(&mut tool()), "{missing} marked");
        }
        // The one marked first in name order wins; an empty kind marks nothing.
        let t = json!({"inputSchema": {"properties": {
            "b": {LEASE_KEYWORD: "second"}, "a": {"items": {LEASE_KEYWORD: "first"}},
            "0": {LEASE_KEYWORD: ""}}}});
        assert_eq!(LeaseSpot::in_tool(&t).unwrap().kind, "first");
    }

    /// Schemas as real servers write them: the arguments behind a `$ref` into `$defs`, in an
    /// `allOf` branch, an array's items as a reference; what is marked there is found there.
    #[test]
    fn spots_are_found_and_marked_behind_references_and_compositions() {
        let by_ref = || {
            json!({"name": "add_observations", "inputSchema": {
                "$ref": "#/$defs/Args",
                "$defs": {
                    "Args": {"type": "object", "properties": {
                        "observations": {"type": "array", "items": {"$ref": "#/$defs/Observation"}}}},
                    "Observation": {"type": "object", "properties": {
                        "entityName": {"$ref": "#/$defs/Name"}, "contents": {"type": "array"}}},
                    "Name": {"type": "string"}
                }
            }})
        };
        let mut t = by_ref();
        assert!(spot("observations[].entityName").mark(&mut t));
        assert_eq!(t["inputSchema"]["$defs"]["Name"][LEASE_KEYWORD], "entity");
        assert_eq!(
            LeaseSpot::in_tool(&t),
            Some(spot("observations[].entityName"))
        );
        let mut t = by_ref();
        assert!(spot("observations[]").mark(&mut t));
        assert_eq!(LeaseSpot::in_tool(&t), Some(spot("observations[]")));
        let composed = || {
            json!({"name": "c", "inputSchema": {"type": "object", "allOf": [
                {"properties": {"n": {"type": "integer"}}},
                {"properties": {"entityNames": {"type": "array", "items": {"type": "string"}}}}
            ]}})
        };
        let mut t = composed();
        assert!(spot("entityNames[]").mark(&mut t));
        assert_eq!(
            t["inputSchema"]["allOf"][1]["properties"]["entityNames"]["items"][LEASE_KEYWORD],
            "entity"
        );
        assert_eq!(LeaseSpot::in_tool(&t), Some(spot("entityNames[]")));
        // A reference that goes round, or leaves the document, names nothing.
        let round = json!({"inputSchema": {"$ref": "#/$defs/A", "$defs": {
            "A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}}});
        assert_eq!(LeaseSpot::in_tool(&round), None);
        let mut far = json!({"inputSchema": {"properties": {"a": {"$ref": "https://x/y"}}}});
        assert!(
            spot("a").mark(&mut far),
            "a remote reference is left as it is, marked beside"
        );
        assert!(!spot("a[]").mark(&mut far));
    }

    #[test]
    fn a_call_writes_each_named_resource_once() {
        let v = json!("alice");
        assert_eq!(
            spot("a").resources(Some(&v)),
            Ok(vec!["entity:alice".into()])
        );
        assert_eq!(spot("a").resources(Some(&json!(7))), Ok(vec![]));
        assert_eq!(spot("a").resources(None), Ok(vec![]));
        let v = json!(["bob", "alice", "bob", 3]);
        assert_eq!(
            spot("a[]").resources(Some(&v)),
            Ok(vec!["entity:bob".into(), "entity:alice".into()])
        );
        let v = json!([{"n": "x"}, {"n": 1}, {"m": "y"}, "z", {"n": "w"}]);
        assert_eq!(
            spot("a[].n").resources(Some(&v)),
            Ok(vec!["entity:x".into(), "entity:w".into()])
        );
        let many: Vec<String> = (0..=MAX_LEASED_RESOURCES).map(|i| i.to_string()).collect();
        let err = spot("a[]").resources(Some(&json!(many))).unwrap_err();
        assert!(err.contains("more than 64"), "{err}");
        let same = vec!["x"; 1000];
        assert_eq!(spot("a[]").resources(Some(&json!(same))).unwrap().len(), 1);
    }

    #[test]
    fn fences_travel_as_one_object_or_an_array() {
        let meta = |v: Option<Value>| {
            let mut m = Map::new();
            if let Some(v) = v {
                m.insert(FENCE_META.into(), v);
            }
            m
        };
        assert_eq!(fences_meta(&[]), None);
        let one = vec![("entity:a".to_owned(), 3)];
        let v = fences_meta(&one).unwrap();
        assert_eq!(v, json!({"resource": "entity:a", "fence": 3}));
        assert_eq!(fences_from_meta(Some(&meta(Some(v)))), Ok(one));
        let two = vec![("entity:a".to_owned(), 3), ("entity:b".to_owned(), 9)];
        let v = fences_meta(&two).unwrap();
        assert!(v.is_array());
        assert_eq!(fences_from_meta(Some(&meta(Some(v)))), Ok(two));
        assert_eq!(fences_from_meta(None), Ok(vec![]));
        assert_eq!(fences_from_meta(Some(&meta(None))), Ok(vec![]));
        for bad in [
            json!([]),
            json!("x"),
            json!({"resource": "a"}),
            json!({"resource": "a", "fence": -1}),
            json!([{"resource": "a", "fence": 1}, {"resource": "a", "fence": 2}]),
            json!([{"resource": "a", "fence": 1}, 5]),
        ] {
            assert!(
                fences_from_meta(Some(&meta(Some(bad.clone())))).is_err(),
                "{bad}"
            );
        }
    }
}

//! The generated commands: one per gateway tool, built from its definition at run time, and
//! `call` for any project tool.
//!
//! A command's name is the tool's with `_` → `-`; each `inputSchema` property is a flag of
//! the same name (`ttl_s` → `--ttl-s`, `--ttl_s` also accepted) parsed by its schema type:
//! `integer` and `number` as numbers, `boolean` as `--flag` (true) or `--flag=false`, `array`
//! as a repeatable flag, a string `enum` as one of its values, `string` as given, and a
//! property without a type (board_set's `value`) as JSON when it parses and a string
//! otherwise. A required property may also be given positionally, in the order of the
//! schema's `required` (`gateway claim story:beta-1`). Nothing here names a tool's arguments:
//! a new tool or argument in the core is a new command or flag.

use clap::{Arg, ArgAction, ArgGroup, ArgMatches, Command};
use serde_json::{Map, Value};

use super::{agent, fail, print_answer, Conn, Failure};

/// Gateway tools without a shell command: `switch_project` sets a session's default, and
/// the shell has no session.
pub(crate) const NOT_COMMANDS: &[&str] = &["switch_project"];

/// The gateway tools that are commands, as the core defines them.
pub(crate) fn shell_tools() -> Vec<Value> {
    gateway_core::gateway_tool_definitions()
        .into_iter()
        .filter(|d| !NOT_COMMANDS.contains(&tool_name(d)))
        .collect()
}

fn tool_name(def: &Value) -> &str {
    def["name"].as_str().unwrap_or_default()
}

/// The command of a tool: its name with `_` → `-`.
pub(crate) fn command_name(def: &Value) -> String {
    tool_name(def).replace('_', "-")
}

/// The flag of a property: its name with `_` → `-`.
pub(crate) fn flag_name(property: &str) -> String {
    property.replace('_', "-")
}

/// How a property's value is read from the command line.
#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Integer,
    Number,
    Boolean,
    String,
    /// Any JSON value (no `type` in the schema): JSON when it parses, else a string.
    Json,
    Array(Box<Kind>),
}

fn kind_of(schema: &Value) -> Kind {
    match schema["type"].as_str() {
        Some("integer") => Kind::Integer,
        Some("number") => Kind::Number,
        Some("boolean") => Kind::Boolean,
        Some("string") => Kind::String,
        Some("array") => Kind::Array(Box::new(match kind_of(&schema["items"]) {
            Kind::Array(_) => Kind::Json,
            k => k,
        })),
        _ => Kind::Json,
    }
}

/// The properties of a tool's `inputSchema`, and its required ones in order.
fn properties(def: &Value) -> (Vec<(String, Value)>, Vec<String>) {
    let props = def["inputSchema"]["properties"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    let required = def["inputSchema"]["required"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    (props, required)
}

fn flag_id(property: &str) -> String {
    format!("flag:{property}")
}

fn positional_id(property: &str) -> String {
    format!("pos:{property}")
}

fn with_kind(arg: Arg, kind: &Kind) -> Arg {
    match kind {
        Kind::Integer => arg.value_parser(clap::value_parser!(i64)).value_name("N"),
        Kind::Number => arg.value_parser(clap::value_parser!(f64)).value_name("X"),
        Kind::Boolean => arg
            .value_parser(clap::value_parser!(bool))
            .num_args(0..=1)
            .require_equals(true)
            .default_missing_value("true"),
        Kind::String | Kind::Json => arg,
        Kind::Array(item) => with_kind(arg, item).action(ArgAction::Append),
    }
}

/// The command of one gateway tool.
pub(crate) fn command_for(def: &Value) -> Command {
    let name = command_name(def);
    let mut about = def["title"].as_str().unwrap_or_default().to_owned();
    let description = def["description"].as_str().unwrap_or_default();
    let mut cmd = Command::new(name.clone());
    if about.is_empty() {
        about = description.to_owned();
    }
    cmd = cmd.about(about).long_about(format!(
        "{description}\n\nThe gateway tool `{}`; prints its structuredContent.",
        tool_name(def)
    ));
    if name == "gateway-health" {
        cmd = cmd.visible_alias("health");
    }
    let (props, required) = properties(def);
    for (property, schema) in &props {
        let kind = kind_of(schema);
        let flag = flag_name(property);
        let mut arg = Arg::new(flag_id(property))
            .long(flag.clone())
            .value_name(property.to_uppercase())
            .help(
                schema["description"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            );
        if flag != *property {
            arg = arg.alias(property.clone());
        }
        if let Some(values) = schema["enum"].as_array() {
            let values: Vec<String> = values
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect();
            arg = arg.value_parser(clap::builder::PossibleValuesParser::new(values));
        } else {
            arg = with_kind(arg, &kind);
        }
        if kind == Kind::Array(Box::new(Kind::String)) {
            arg = arg.value_name("ITEM");
        }
        cmd = cmd.arg(arg);
    }
    for (i, property) in required.iter().enumerate() {
        let Some((_, schema)) = props.iter().find(|(p, _)| p == property) else {
            continue;
        };
        let arg = Arg::new(positional_id(property))
            .index(i + 1)
            .value_name(property.to_uppercase())
            .help(format!("The same as --{}", flag_name(property)));
        cmd = cmd.arg(with_kind(arg, &kind_of(schema))).group(
            ArgGroup::new(format!("required:{property}"))
                .args([positional_id(property), flag_id(property)])
                .required(true),
        );
    }
    cmd
}

/// Reads the arguments of a tool's call from its command's matches.
pub(crate) fn arguments(def: &Value, m: &ArgMatches) -> Map<String, Value> {
    let (props, _) = properties(def);
    let mut out = Map::new();
    for (property, schema) in props {
        let kind = kind_of(&schema);
        let positional = positional_id(&property);
        let id = if m.try_contains_id(&positional).unwrap_or(false) {
            positional
        } else {
            flag_id(&property)
        };
        if !m.try_contains_id(&id).unwrap_or(false) {
            continue;
        }
        let value = match &kind {
            Kind::Array(item) => Value::Array(values_of(m, &id, item)),
            k => match values_of(m, &id, k).into_iter().next() {
                Some(v) => v,
                None => continue,
            },
        };
        out.insert(property, value);
    }
    out
}

fn values_of(m: &ArgMatches, id: &str, kind: &Kind) -> Vec<Value> {
    match kind {
        Kind::Integer => m
            .get_many::<i64>(id)
            .into_iter()
            .flatten()
            .map(|n| Value::from(*n))
            .collect(),
        Kind::Number => m
            .get_many::<f64>(id)
            .into_iter()
            .flatten()
            .map(|n| Value::from(*n))
            .collect(),
        Kind::Boolean => m
            .get_many::<bool>(id)
            .into_iter()
            .flatten()
            .map(|b| Value::Bool(*b))
            .collect(),
        Kind::String => m
            .get_many::<String>(id)
            .into_iter()
            .flatten()
            .map(|s| Value::String(s.clone()))
            .collect(),
        Kind::Json | Kind::Array(_) => m
            .get_many::<String>(id)
            .into_iter()
            .flatten()
            .map(|s| json_or_string(s))
            .collect(),
    }
}

/// `s` as JSON when it parses, else as a string: `5` is a number, `beta-1` a string, `'"5"'`
/// the string "5".
pub(crate) fn json_or_string(s: &str) -> Value {
    serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.to_owned()))
}

/// Runs a gateway tool's command.
pub(crate) async fn run_tool(conn: &mut Conn, def: &Value, m: &ArgMatches) -> u8 {
    let tool = tool_name(def).to_owned();
    let args = arguments(def, m);
    let takes_agent = def["inputSchema"]["properties"].get("agent").is_some();
    let timeout = match tool.as_str() {
        // The fan-out's own deadline is at most 60 s; a wait at most 25 s.
        "aggregate_pipeline_status" => Some(std::time::Duration::from_secs(70)),
        "wait" => Some(std::time::Duration::from_secs(40)),
        _ => None,
    };
    let result = if !takes_agent || args.contains_key("agent") {
        conn.call(&tool, &args, None, timeout).await
    } else if tool == "checkin" {
        agent::checkin(conn, args).await
    } else {
        let project = agent::project_hint(&args);
        agent::call_as_agent(conn, &tool, args, project.as_deref(), timeout).await
    };
    match result {
        Ok(v) => {
            print_answer(&conn.settings, &v);
            0
        }
        Err(f) => fail(&f),
    }
}

/// `gateway call TOOL --project P key=value…`.
pub(crate) fn call_command() -> Command {
    Command::new(super::CALL)
        .about("Call any project tool: gateway call TOOL --project P key=value…")
        .long_about(
            "Call any project tool: gateway call TOOL --project P key=value…\n\n\
             Each key=value is an argument; the value is JSON when it parses (5, true, \
             [\"a\"], {\"k\":1}) and a string otherwise (beta-1); quote a JSON string to \
             pass digits as text ('\"5\"'). Without --project the call goes to the gateway's \
             default project. A project tool can also be called by name as a command of its \
             own, with - or _: gateway move-story --project beta story_id=beta-1 stage=review. \
             When this shell has an agent identity (see below), its writes are made as that \
             agent, so a lease it holds lets them through.",
        )
        .arg(
            Arg::new("tool")
                .value_name("TOOL")
                .required(true)
                .help("The project tool's name, e.g. show, move_story"),
        )
        .arg(
            Arg::new("project")
                .long("project")
                .value_name("PROJECT")
                .help("The project to call it on (list-projects names them)"),
        )
        .arg(
            Arg::new("arguments")
                .value_name("KEY=VALUE")
                .num_args(0..)
                .help("The tool's arguments"),
        )
}

/// Runs `call` (or a project tool by name: `external` is the command as typed).
pub(crate) async fn run_call(conn: &mut Conn, m: &ArgMatches, external: Option<&str>) -> u8 {
    let tool = m
        .get_one::<String>("tool")
        .cloned()
        .expect("TOOL is required");
    let mut args = Map::new();
    for item in m.get_many::<String>("arguments").into_iter().flatten() {
        let Some((k, v)) = item.split_once('=') else {
            eprintln!("gateway: expected KEY=VALUE, got {item:?} (e.g. story_id=beta-1)");
            return 2;
        };
        args.insert(k.to_owned(), json_or_string(v));
    }
    if let Some(p) = m.get_one::<String>("project") {
        args.insert("project".to_owned(), Value::String(p.clone()));
    }
    let project = agent::project_hint(&args);
    match agent::call_project_tool(conn, &tool, args, project.as_deref()).await {
        Ok(v) => {
            print_answer(&conn.settings, &v);
            0
        }
        Err(f) => {
            if let (Some(name), Failure::Tool { .. }) = (external, &f) {
                // The gateway's `unknown_tool`, or a sled's own "Unknown tool" error.
                if f.kind() == Some("unknown_tool")
                    || f.line().to_ascii_lowercase().contains("unknown tool")
                {
                    eprintln!(
                        "gateway: `{name}` is not a gateway command (gateway --help lists them), \
                         and as a project tool: {}",
                        f.line()
                    );
                    return 1;
                }
            }
            if let (Some(name), Failure::Transport(_)) = (external, &f) {
                eprintln!(
                    "gateway: `{name}` is not a gateway command (gateway --help lists them); \
                     calling it as a project tool: {}",
                    f.line()
                );
                return 1;
            }
            fail(&f)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(def: &Value, args: &[&str]) -> Result<Map<String, Value>, clap::Error> {
        let m = command_for(def).try_get_matches_from(args)?;
        Ok(arguments(def, &m))
    }

    fn def(name: &str) -> Value {
        shell_tools()
            .into_iter()
            .find(|d| d["name"] == name)
            .unwrap_or_else(|| panic!("no tool {name}"))
    }

    /// Every gateway tool but switch_project is a command; each flag is a property and each
    /// property a flag (the same check the black-box parity test makes through `--help`).
    #[test]
    fn every_tool_is_a_command_and_every_flag_an_argument() {
        let names: Vec<String> = gateway_core::gateway_tool_definitions()
            .iter()
            .map(|d| d["name"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(names.len(), gateway_core::GATEWAY_TOOLS.len());
        for def in gateway_core::gateway_tool_definitions() {
            let tool = def["name"].as_str().unwrap();
            if NOT_COMMANDS.contains(&tool) {
                continue;
            }
            let cmd = command_for(&def);
            let flags: std::collections::BTreeSet<String> = cmd
                .get_arguments()
                .filter_map(|a| a.get_long().map(str::to_owned))
                .collect();
            let props: std::collections::BTreeSet<String> = def["inputSchema"]["properties"]
                .as_object()
                .unwrap()
                .keys()
                .map(|p| flag_name(p))
                .collect();
            assert_eq!(flags, props, "{tool}");
        }
    }

    #[test]
    fn flags_are_typed_by_the_schema() {
        let claim = def("claim");
        assert_eq!(
            parse(
                &claim,
                &[
                    "claim",
                    "story:beta-1",
                    "--project",
                    "beta",
                    "--ttl-s",
                    "60"
                ]
            )
            .unwrap(),
            json!({"resource": "story:beta-1", "project": "beta", "ttl_s": 60})
                .as_object()
                .unwrap()
                .clone()
        );
        assert_eq!(
            parse(&claim, &["claim", "--resource", "r", "--ttl_s", "5"]).unwrap()["ttl_s"],
            json!(5)
        );
        assert!(parse(&claim, &["claim"]).is_err(), "resource is required");
        assert!(parse(&claim, &["claim", "r", "--resource", "r"]).is_err());
        assert!(parse(&claim, &["claim", "r", "--ttl-s", "soon"]).is_err());

        let inbox = def("inbox");
        assert_eq!(
            parse(&inbox, &["inbox", "--peek"]).unwrap()["peek"],
            json!(true)
        );
        assert_eq!(
            parse(&inbox, &["inbox", "--peek=false"]).unwrap()["peek"],
            json!(false)
        );
        assert!(parse(&inbox, &["inbox"]).unwrap().is_empty());

        let wait = def("wait");
        assert_eq!(
            parse(&wait, &["wait", "--projects", "a", "--projects", "b"]).unwrap()["projects"],
            json!(["a", "b"])
        );

        let set = def("board_set");
        assert_eq!(
            parse(&set, &["board-set", "k", "{\"n\":1}", "--if-revision", "0"]).unwrap(),
            json!({"key": "k", "value": {"n": 1}, "if_revision": 0})
                .as_object()
                .unwrap()
                .clone()
        );
        assert_eq!(
            parse(&set, &["board-set", "k", "plain words"]).unwrap()["value"],
            json!("plain words")
        );

        let identity = def("fleet_identity");
        assert!(parse(&identity, &["fleet-identity", "--action", "repin"]).is_ok());
        assert!(parse(&identity, &["fleet-identity", "--action", "burn"]).is_err());
    }

    #[test]
    fn values_are_json_when_they_parse() {
        assert_eq!(json_or_string("5"), json!(5));
        assert_eq!(json_or_string("beta-1"), json!("beta-1"));
        assert_eq!(json_or_string("\"5\""), json!("5"));
        assert_eq!(json_or_string("[1,2]"), json!([1, 2]));
    }
}

//! A battery of hostile and malformed inputs against the real server over loopback: each gets
//! its exact answer (HTTP status, and the JSON-RPC error code and `data.kind` where there is
//! one), and the gateway keeps serving after every one.

use std::time::Duration;

use gateway_tests::Stack;
use serde_json::{json, Value};
use sled_sim::{McpClient, SledOptions, TokioConnect};

/// What an input must get: the status, and the error's code and kind when the body is one.
#[derive(Debug, Clone, Copy)]
struct Want {
    status: u16,
    code: Option<i64>,
    kind: Option<&'static str>,
}

const fn want(status: u16, code: i64, kind: &'static str) -> Want {
    Want {
        status,
        code: Some(code),
        kind: Some(kind),
    }
}

const fn status(status: u16) -> Want {
    Want {
        status,
        code: None,
        kind: None,
    }
}

struct Case {
    name: String,
    method: &'static str,
    session: bool,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
    want: Want,
}

fn post(name: impl Into<String>, body: impl Into<Vec<u8>>, want: Want) -> Case {
    Case {
        name: name.into(),
        method: "POST",
        session: true,
        headers: Vec::new(),
        body: body.into(),
        want,
    }
}

fn call(name: &str, id: &str, arguments: &str, want: Want) -> Case {
    post(
        name,
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"whoami","arguments":{arguments}}}}}"#
        ),
        want,
    )
}

fn cases() -> Vec<Case> {
    let parse = want(400, -32700, "parse_error");
    let invalid = want(400, -32600, "invalid_request");
    let params = want(200, -32602, "invalid_params");
    let mut v = vec![
        // Not JSON at all.
        post("empty body", "", parse),
        post("whitespace", "   \n\t", parse),
        post("garbage", "garbage", parse),
        post(
            "truncated object",
            r#"{"jsonrpc":"2.0","id":1,"method":"ping""#,
            parse,
        ),
        post(
            "trailing comma",
            r#"{"jsonrpc":"2.0","id":1,"method":"ping",}"#,
            parse,
        ),
        post("single quotes", "{'jsonrpc':'2.0'}", parse),
        post(
            "trailing garbage",
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"} x"#,
            parse,
        ),
        post(
            "two documents",
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}{}"#,
            parse,
        ),
        post(
            "invalid utf-8",
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\xfe\"}".to_vec(),
            parse,
        ),
        // Valid JSON syntax, but not a valid Unicode string: the method is refused.
        post(
            "lone surrogate escape",
            r#"{"jsonrpc":"2.0","id":1,"method":"\ud800"}"#,
            invalid,
        ),
        post(
            "NaN",
            r#"{"jsonrpc":"2.0","id":NaN,"method":"ping"}"#,
            parse,
        ),
        post("nesting 10000 deep", "[".repeat(10_000), parse),
        post(
            "object nesting 200 deep",
            format!("{}{}", r#"{"a":"#.repeat(200), "}".repeat(200)),
            parse,
        ),
        // JSON, but not a JSON-RPC message.
        post("a number", "42", invalid),
        post("a string", r#""ping""#, invalid),
        post("null", "null", invalid),
        post("true", "true", invalid),
        post("empty object", "{}", invalid),
        post("no jsonrpc", r#"{"id":1,"method":"ping"}"#, invalid),
        post(
            "jsonrpc 1.0",
            r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#,
            invalid,
        ),
        post(
            "jsonrpc number",
            r#"{"jsonrpc":2.0,"id":1,"method":"ping"}"#,
            invalid,
        ),
        post(
            "jsonrpc null",
            r#"{"jsonrpc":null,"id":1,"method":"ping"}"#,
            invalid,
        ),
        post(
            "null id",
            r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
            invalid,
        ),
        post(
            "object id",
            r#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#,
            invalid,
        ),
        post(
            "array id",
            r#"{"jsonrpc":"2.0","id":[1],"method":"ping"}"#,
            invalid,
        ),
        post(
            "bool id",
            r#"{"jsonrpc":"2.0","id":true,"method":"ping"}"#,
            invalid,
        ),
        post(
            "duplicate id",
            r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#,
            invalid,
        ),
        post(
            "duplicate method",
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","method":"x"}"#,
            invalid,
        ),
        post(
            "method number",
            r#"{"jsonrpc":"2.0","id":1,"method":7}"#,
            invalid,
        ),
        post(
            "method null",
            r#"{"jsonrpc":"2.0","id":1,"method":null}"#,
            invalid,
        ),
        post(
            "params a number",
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":3}"#,
            invalid,
        ),
        post(
            "params a string",
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":"x"}"#,
            invalid,
        ),
        post(
            "no method, no result",
            r#"{"jsonrpc":"2.0","id":1}"#,
            invalid,
        ),
        post(
            "batch of one",
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
            want(400, -32600, "batch_not_supported"),
        ),
        post(
            "empty batch",
            "[]",
            want(400, -32600, "batch_not_supported"),
        ),
        post(
            "batch of garbage",
            "[1,2,3]",
            want(400, -32600, "batch_not_supported"),
        ),
        // Requests the gateway does not serve, or with bad params.
        post(
            "unknown method",
            r#"{"jsonrpc":"2.0","id":1,"method":"no/such"}"#,
            want(200, -32601, "method_not_found"),
        ),
        post(
            "empty method",
            r#"{"jsonrpc":"2.0","id":1,"method":""}"#,
            want(200, -32601, "method_not_found"),
        ),
        post(
            "huge method name",
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"{}"}}"#,
                "m".repeat(100_000)
            ),
            want(200, -32601, "method_not_found"),
        ),
        post(
            "tools/call without params",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#,
            params,
        ),
        post(
            "tools/call name missing",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}"#,
            params,
        ),
        post(
            "tools/call name a number",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":5}}"#,
            params,
        ),
        post(
            "tools/call name null",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":null}}"#,
            params,
        ),
        post(
            "tools/call arguments an array",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami","arguments":[1]}}"#,
            params,
        ),
        post(
            "tools/call arguments a string",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami","arguments":"x"}}"#,
            params,
        ),
        post(
            "tools/call _meta a string",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami","arguments":{},"_meta":"x"}}"#,
            params,
        ),
        post(
            "progress token an object",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami","arguments":{},"_meta":{"progressToken":{}}}}"#,
            params,
        ),
        post(
            "tools/list bad cursor",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":"nope"}}"#,
            params,
        ),
        post(
            "tools/list cursor a number",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":5}}"#,
            params,
        ),
        post(
            "initialize without version",
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#,
            params,
        ),
        post(
            "initialize version a number",
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}"#,
            params,
        ),
        post(
            "logging level unknown",
            r#"{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"level":"loud"}}"#,
            params,
        ),
        post(
            "logging level missing",
            r#"{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{}}"#,
            params,
        ),
        // The project argument, every way wrong.
        call(
            "project a number",
            "1",
            r#"{"project":1}"#,
            want(200, -32602, "project_not_string"),
        ),
        call(
            "project null",
            "1",
            r#"{"project":null}"#,
            want(200, -32602, "project_not_string"),
        ),
        call(
            "project an array",
            "1",
            r#"{"project":["alpha"]}"#,
            want(200, -32602, "project_not_string"),
        ),
        call(
            "project an object",
            "1",
            r#"{"project":{"name":"alpha"}}"#,
            want(200, -32602, "project_not_string"),
        ),
        call(
            "project true",
            "1",
            r#"{"project":true}"#,
            want(200, -32602, "project_not_string"),
        ),
        call(
            "project empty",
            "1",
            r#"{"project":""}"#,
            want(200, -32602, "project_empty"),
        ),
        call(
            "project unknown",
            "1",
            r#"{"project":"zeta"}"#,
            want(200, -32602, "unknown_project"),
        ),
        call(
            "project with a space",
            "1",
            r#"{"project":"alpha "}"#,
            want(200, -32602, "unknown_project"),
        ),
        call(
            "project in another case",
            "1",
            r#"{"project":"ALPHA"}"#,
            want(200, -32602, "unknown_project"),
        ),
        call(
            "project huge",
            "1",
            &format!(r#"{{"project":"{}"}}"#, "p".repeat(200_000)),
            want(200, -32602, "unknown_project"),
        ),
        call(
            "project with a NUL",
            "1",
            r#"{"project":"al\u0000pha"}"#,
            want(200, -32602, "unknown_project"),
        ),
        call(
            "project not connected",
            "1",
            r#"{"project":"gamma"}"#,
            want(200, -32603, "sled_not_connected"),
        ),
        // switch_project, every way wrong.
        post(
            "switch without project",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"switch_project","arguments":{}}}"#,
            params,
        ),
        post(
            "switch to a number",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"switch_project","arguments":{"project":3}}}"#,
            want(200, -32602, "project_not_string"),
        ),
        post(
            "switch to unknown",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"switch_project","arguments":{"project":"zeta"}}}"#,
            want(200, -32602, "unknown_project"),
        ),
        post(
            "switch with extra args",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"switch_project","arguments":{"project":"beta","x":1}}}"#,
            params,
        ),
        post(
            "list_projects with args",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_projects","arguments":{"project":"beta"}}}"#,
            params,
        ),
        // Resources and prompts naming a bad project.
        post(
            "resources/read unknown project",
            r#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"x","_meta":{"io.mcp-gateway/project":"zeta"}}}"#,
            want(200, -32602, "unknown_project"),
        ),
        post(
            "prompts/get project a number",
            r#"{"jsonrpc":"2.0","id":1,"method":"prompts/get","params":{"name":"p","arguments":{"project":5}}}"#,
            want(200, -32602, "project_not_string"),
        ),
        post(
            "resources/read params a list",
            r#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":[]}"#,
            params,
        ),
    ];
    // Ids of every shape come back exactly as sent.
    for id in [
        "0",
        "-1",
        "18446744073709551616",
        "-0",
        r#""""#,
        r#""x\"y""#,
        r#""\u00e9""#,
    ] {
        v.push(post(
            format!("id {id} comes back"),
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#),
            status(200),
        ));
    }
    // MCP ids are strings or integers.
    for id in ["1.5", "1e400", "2E3", "-0.0"] {
        v.push(post(
            format!("non-integer id {id}"),
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#),
            invalid,
        ));
    }
    // Nothing forwarded that a sled's strict reader rejects: refused at once, naming why,
    // instead of hanging at the sled until the call's deadline.
    let unreadable = want(400, -32602, "unreadable_value");
    v.push(call(
        "lone high surrogate in arguments",
        "1",
        r#"{"a":"\ud800"}"#,
        unreadable,
    ));
    v.push(call(
        "lone low surrogate in arguments",
        "1",
        r#"{"a":"x\udc00y"}"#,
        unreadable,
    ));
    v.push(call(
        "reversed surrogate pair",
        "1",
        r#"{"a":"\ude00\ud83d"}"#,
        unreadable,
    ));
    v.push(call(
        "lone surrogate in a key",
        "1",
        r#"{"\ud800":1}"#,
        unreadable,
    ));
    v.push(call(
        "number out of range",
        "1",
        r#"{"n":1e400}"#,
        unreadable,
    ));
    let nested = |n: usize| format!(r#"{{"a":{}{}}}"#, "[".repeat(n), "]".repeat(n));
    v.push(call(
        "arguments nested 130 deep",
        "1",
        &nested(130),
        want(400, -32602, "too_deep"),
    ));
    v.push(call(
        "arguments nested 70 deep",
        "1",
        &nested(70),
        want(400, -32602, "too_deep"),
    ));
    v.push(call(
        "arguments nested 50 deep are forwarded",
        "1",
        &nested(50),
        status(200),
    ));
    v.push(post(
        "resources/read with a lone surrogate",
        r#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"story://alpha/\ud800"}}"#,
        unreadable,
    ));
    v.push(post(
        "invalid utf-8 in an argument",
        [
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami","arguments":{"a":""#.as_slice(),
            b"\xc3\x28",
            br#""}}}"#.as_slice(),
        ]
        .concat(),
        parse,
    ));
    // Notifications and client responses are acknowledged.
    v.push(post(
        "notification",
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        status(202),
    ));
    v.push(post(
        "unknown notification",
        r#"{"jsonrpc":"2.0","method":"no/such"}"#,
        status(202),
    ));
    v.push(post(
        "cancel of nothing",
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":99}}"#,
        status(202),
    ));
    v.push(post(
        "cancel without params",
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled"}"#,
        status(202),
    ));
    v.push(post(
        "response to nothing",
        r#"{"jsonrpc":"2.0","id":"gw-req-99","result":{}}"#,
        status(202),
    ));
    v.push(post(
        "error response to nothing",
        r#"{"jsonrpc":"2.0","id":5,"error":{"code":1,"message":"m"}}"#,
        status(202),
    ));
    // HTTP-level refusals.
    let ping = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.to_vec();
    let with = |name: &str, headers: Vec<(&'static str, String)>, want: Want| Case {
        name: name.to_owned(),
        method: "POST",
        session: true,
        headers,
        body: ping.clone(),
        want,
    };
    v.push(with(
        "text/plain",
        vec![("content-type", "text/plain".into())],
        want(415, -32000, "unsupported_content_type"),
    ));
    v.push(with(
        "form content type",
        vec![("content-type", "application/x-www-form-urlencoded".into())],
        want(415, -32000, "unsupported_content_type"),
    ));
    v.push(with(
        "no content type",
        vec![("content-type", String::new())],
        want(415, -32000, "unsupported_content_type"),
    ));
    v.push(with(
        "json with charset",
        vec![("content-type", "application/json; charset=utf-8".into())],
        status(200),
    ));
    v.push(with(
        "accept html only",
        vec![("accept", "text/html".into())],
        want(406, -32000, "not_acceptable"),
    ));
    v.push(with(
        "accept json q=0",
        vec![("accept", "application/json;q=0".into())],
        want(406, -32000, "not_acceptable"),
    ));
    v.push(with(
        "accept anything",
        vec![("accept", "*/*".into())],
        status(200),
    ));
    v.push(with(
        "evil origin",
        vec![("origin", "http://evil.example".into())],
        want(403, -32000, "forbidden_origin"),
    ));
    v.push(with(
        "origin null",
        vec![("origin", "null".into())],
        want(403, -32000, "forbidden_origin"),
    ));
    v.push(with(
        "lookalike origin",
        vec![("origin", "http://localhost.evil.example".into())],
        want(403, -32000, "forbidden_origin"),
    ));
    v.push(with(
        "localhost origin",
        vec![("origin", "http://localhost:6274".into())],
        status(200),
    ));
    v.push(with(
        "unsupported version",
        vec![("mcp-protocol-version", "1999-01-01".into())],
        want(400, -32000, "unsupported_protocol_version"),
    ));
    v.push(with(
        "garbage version",
        vec![("mcp-protocol-version", "2025-13-99; drop table".into())],
        want(400, -32000, "unsupported_protocol_version"),
    ));
    v.push(with(
        "garbage session id",
        vec![("mcp-session-id", "../../etc/passwd".into())],
        want(404, -32000, "unknown_session"),
    ));
    v.push(with(
        "huge session id",
        vec![("mcp-session-id", "s".repeat(8000))],
        want(404, -32000, "unknown_session"),
    ));
    v.push(Case {
        name: "oversize body".into(),
        method: "POST",
        session: true,
        headers: Vec::new(),
        body: vec![b' '; 5 << 20],
        want: want(413, -32000, "payload_too_large"),
    });
    v.push(Case {
        name: "DELETE without session".into(),
        method: "DELETE",
        session: false,
        headers: Vec::new(),
        body: Vec::new(),
        want: want(400, -32000, "missing_session"),
    });
    v.push(Case {
        name: "GET without session".into(),
        method: "GET",
        session: false,
        headers: vec![("accept", "text/event-stream".into())],
        body: Vec::new(),
        want: want(400, -32000, "missing_session"),
    });
    v.push(Case {
        name: "GET without SSE accept".into(),
        method: "GET",
        session: true,
        headers: vec![("accept", "application/json".into())],
        body: Vec::new(),
        want: want(406, -32000, "not_acceptable"),
    });
    v.push(Case {
        name: "stateless GET".into(),
        method: "GET",
        session: false,
        headers: vec![("mcp-protocol-version", "2026-07-28".into())],
        body: Vec::new(),
        want: want(405, -32000, "method_not_allowed"),
    });
    // The stateless era's checks.
    let modern = |name: &str, headers: Vec<(&'static str, String)>, body: &str, want: Want| Case {
        name: name.to_owned(),
        method: "POST",
        session: false,
        headers,
        body: body.as_bytes().to_vec(),
        want,
    };
    let env = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;
    let h = |m: &str| {
        vec![
            ("mcp-protocol-version", "2026-07-28".to_owned()),
            ("mcp-method", m.to_owned()),
        ]
    };
    v.push(modern(
        "stateless without envelope",
        h("tools/list"),
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#,
        want(400, -32602, "missing_envelope"),
    ));
    v.push(modern(
        "stateless method header mismatch",
        h("tools/call"),
        &format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{{{env}}}}}"#),
        want(400, -32020, "header_mismatch"),
    ));
    v.push(modern("stateless name header mismatch", [h("tools/call"), vec![("mcp-name", "other".to_owned())]].concat(), &format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"whoami","arguments":{{}},{env}}}}}"#), want(400, -32020, "header_mismatch")));
    v.push(modern("stateless switch_project", [h("tools/call"), vec![("mcp-name", "switch_project".to_owned())]].concat(), &format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"switch_project","arguments":{{"project":"beta"}},{env}}}}}"#), want(400, -32602, "unknown_tool")));
    v.push(modern(
        "stateless unknown method",
        h("no/such"),
        &format!(r#"{{"jsonrpc":"2.0","id":1,"method":"no/such","params":{{{env}}}}}"#),
        want(404, -32601, "method_not_found"),
    ));
    v.push(modern(
        "stateless ping (removed)",
        h("ping"),
        &format!(r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{{env}}}}}"#),
        want(404, -32601, "method_not_found"),
    ));
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hostile_input_gets_its_exact_answer_and_the_gateway_keeps_serving() {
    let registry = gateway_tests::registry(&["alpha", "beta", "gamma"], Some("alpha"));
    let stack = Stack::start(registry, &["alpha", "beta"], SledOptions::default()).await;
    let url = stack.url();
    let mut probe = McpClient::connect(TokioConnect, &url).await.unwrap();
    probe.initialize().await.unwrap();
    let session = probe.session_id().unwrap().to_owned();

    let cases = cases();
    assert!(cases.len() >= 100, "the battery has {} inputs", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        let mut c = McpClient::connect(TokioConnect, &url).await.unwrap();
        let mut headers: Vec<(&str, &str)> = vec![
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
        ];
        if case.session {
            headers.push(("mcp-session-id", &session));
        }
        for (k, v) in &case.headers {
            headers.retain(|(h, _)| h != k);
            headers.push((k, v));
        }
        let method = case.method.parse().unwrap();
        let sent = tokio::time::timeout(
            Duration::from_secs(10),
            c.send_raw(method, case.body.clone(), &headers),
        )
        .await;
        let (status, body) = match sent {
            Ok(Ok((s, _, b))) => (s, b),
            Ok(Err(e)) => {
                failures.push(format!("{}: transport error {e}", case.name));
                continue;
            }
            Err(_) => {
                failures.push(format!("{}: no answer within 10 s", case.name));
                continue;
            }
        };
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let got = (
            status,
            v["error"]["code"].as_i64(),
            v["error"]["data"]["kind"].as_str(),
        );
        let w = case.want;
        let ok = got.0 == w.status
            && (w.code.is_none() || got.1 == w.code)
            && (w.kind.is_none() || got.2 == w.kind);
        if !ok {
            failures.push(format!(
                "{}: wanted {w:?}, got {got:?} {}",
                case.name,
                String::from_utf8_lossy(&body)
                    .chars()
                    .take(300)
                    .collect::<String>()
            ));
        }
        // Ids come back byte for byte.
        if case.name.starts_with("id ") {
            let sent_id = case
                .name
                .trim_start_matches("id ")
                .trim_end_matches(" comes back");
            let text = String::from_utf8_lossy(&body);
            if !text.contains(&format!(r#""id":{sent_id},"#)) {
                failures.push(format!(
                    "{}: the id did not come back exactly: {text}",
                    case.name
                ));
            }
        }
        // Still serving.
        let r = probe.request(json!(1), "ping", json!({})).await;
        if !matches!(&r, Ok(v) if v["result"] == json!({})) {
            failures.push(format!(
                "after {}: the gateway stopped serving: {r:?}",
                case.name
            ));
            break;
        }
    }
    println!(
        "{} hostile inputs, {} failures",
        cases.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // And a real call still works end to end.
    let r = probe
        .tools_call(json!(2), "whoami", json!({"project": "beta"}))
        .await
        .unwrap();
    assert_eq!(r["result"]["structuredContent"]["project"], "beta");
    stack.stop().await;
}

/// Hostile `Authorization` headers for a gateway with `[oauth]` (and a static client token):
/// malformed JWTs, huge headers, wrong types in headers and claims, algorithms refused, an
/// issuer whose keys cannot be fetched. Each is refused at once with the same 401, and the
/// gateway keeps serving the client token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hostile_bearer_token_is_refused_alike_and_the_gateway_keeps_serving() {
    use base64::Engine as _;
    const CLIENT_TOKEN: &str = "static-client-token-0001";
    // The issuer listens nowhere: its keys can never be fetched.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let issuer = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let resource = "http://127.0.0.1:1/mcp";
    let oauth =
        gateway_core::OAuthConfig::new(resource, vec![issuer.clone()], vec!["mcp".into()]).unwrap();
    let registry = gateway_tests::registry(&["alpha"], Some("alpha"))
        .with_client_tokens(vec![gateway_core::Secret::new(CLIENT_TOKEN)])
        .with_oauth(oauth);
    let gateway =
        gateway_tests::Gateway::start(gateway_server::ServerOptions::new(registry, [5; 32])).await;
    let url = gateway.url();
    let mut probe = McpClient::connect(TokioConnect, &url).await.unwrap();
    probe.set_bearer_token(Some(CLIENT_TOKEN.into()));

    let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    let jwt = |header: &str, claims: &str| format!("{}.{}.c2lnbmF0dXJl", b64(header), b64(claims));
    let claims = format!(
        r#"{{"iss":"{issuer}","sub":"a","aud":"{resource}","exp":9999999999,"scope":"mcp"}}"#
    );
    let ed = r#"{"alg":"EdDSA","kid":"k1"}"#;
    let cases: Vec<(&str, String)> = vec![
        ("not a JWT", "Bearer garbage".into()),
        ("two parts", format!("Bearer {}.{}", b64(ed), b64(&claims))),
        ("four parts", format!("Bearer {}.x", jwt(ed, &claims))),
        ("empty parts", "Bearer ..".into()),
        ("dots only", format!("Bearer {}", ".".repeat(5000))),
        (
            "header not base64",
            format!("Bearer !!!.{}.c2ln", b64(&claims)),
        ),
        (
            "header not JSON",
            format!("Bearer {}", jwt("not json", &claims)),
        ),
        (
            "header an array",
            format!("Bearer {}", jwt("[1,2]", &claims)),
        ),
        ("payload not JSON", format!("Bearer {}", jwt(ed, "{"))),
        ("payload a string", format!("Bearer {}", jwt(ed, r#""x""#))),
        (
            "payload nested 10000 deep",
            format!("Bearer {}", jwt(ed, &"[".repeat(10_000))),
        ),
        (
            "alg none",
            format!("Bearer {}", jwt(r#"{"alg":"none"}"#, &claims)),
        ),
        (
            "alg None",
            format!("Bearer {}", jwt(r#"{"alg":"None"}"#, &claims)),
        ),
        (
            "alg HS256",
            format!("Bearer {}", jwt(r#"{"alg":"HS256","kid":"k1"}"#, &claims)),
        ),
        (
            "alg a number",
            format!("Bearer {}", jwt(r#"{"alg":256}"#, &claims)),
        ),
        (
            "alg null",
            format!("Bearer {}", jwt(r#"{"alg":null}"#, &claims)),
        ),
        (
            "kid an object",
            format!(
                "Bearer {}",
                jwt(r#"{"alg":"EdDSA","kid":{"a":1}}"#, &claims)
            ),
        ),
        (
            "a jku to fetch keys from",
            format!(
                "Bearer {}",
                jwt(
                    r#"{"alg":"RS256","jku":"http://127.0.0.1:1/jwks"}"#,
                    &claims
                )
            ),
        ),
        (
            "an embedded jwk",
            format!(
                "Bearer {}",
                jwt(
                    r#"{"alg":"EdDSA","jwk":{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}}"#,
                    &claims
                )
            ),
        ),
        (
            "iss a number",
            format!("Bearer {}", jwt(ed, r#"{"iss":1}"#)),
        ),
        (
            "iss an array",
            format!("Bearer {}", jwt(ed, &format!(r#"{{"iss":["{issuer}"]}}"#))),
        ),
        (
            "iss not configured",
            format!(
                "Bearer {}",
                jwt(ed, r#"{"iss":"https://evil.example.com"}"#)
            ),
        ),
        (
            "exp a string",
            format!(
                "Bearer {}",
                jwt(ed, &claims.replace("9999999999", r#""never""#))
            ),
        ),
        (
            "the issuer's keys unreachable",
            format!("Bearer {}", jwt(ed, &claims)),
        ),
        ("a 15 KiB token", format!("Bearer {}", "a".repeat(15 << 10))),
        (
            "a 100 KiB token",
            format!("Bearer {}", "a".repeat(100 << 10)),
        ),
        (
            "a 100 KiB JWT",
            format!(
                "Bearer {}",
                jwt(
                    ed,
                    &format!(r#"{{"iss":"{issuer}","pad":"{}"}}"#, "x".repeat(100 << 10))
                )
            ),
        ),
        (
            "lower-case scheme, tabs",
            format!("bearer \t{}", jwt(ed, &claims)),
        ),
        (
            "the client token's prefix",
            format!("Bearer {}", &CLIENT_TOKEN[..10]),
        ),
        (
            "the client token and more",
            format!("Bearer {CLIENT_TOKEN}x"),
        ),
    ];
    let mut failures = Vec::new();
    let mut reference = None;
    for (name, authorization) in &cases {
        let mut c = McpClient::connect(TokioConnect, &url).await.unwrap();
        let headers = [
            ("content-type", "application/json"),
            ("authorization", authorization.as_str()),
        ];
        let started = std::time::Instant::now();
        let sent = tokio::time::timeout(
            Duration::from_secs(10),
            c.post_raw(
                br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.to_vec(),
                &headers,
            ),
        )
        .await;
        let (status, h, body) = match sent {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => {
                failures.push(format!("{name}: transport error {e}"));
                continue;
            }
            Err(_) => {
                failures.push(format!("{name}: no answer within 10 s"));
                continue;
            }
        };
        let challenge = h
            .get("www-authenticate")
            .map(|v| v.to_str().unwrap_or("").to_owned());
        let answer = (
            status,
            challenge,
            String::from_utf8_lossy(&body).into_owned(),
        );
        if started.elapsed() > Duration::from_secs(3) {
            failures.push(format!(
                "{name}: refused only after {:?}",
                started.elapsed()
            ));
        }
        match &reference {
            None => {
                let ok = status == 401
                    && answer
                        .1
                        .as_deref()
                        .is_some_and(|c| c.contains(r#"error="invalid_token""#))
                    && answer.2.contains(r#""kind":"unauthorized""#);
                if !ok {
                    failures.push(format!("{name}: {answer:?}"));
                }
                reference = Some(answer);
            }
            Some(r) if *r != answer => failures.push(format!("{name}: {answer:?}, not {r:?}")),
            Some(_) => {}
        }
        let r = probe.request(json!(1), "ping", json!({})).await;
        if !matches!(&r, Ok(v) if v["result"] == json!({})) {
            failures.push(format!("after {name}: the gateway stopped serving: {r:?}"));
            break;
        }
    }
    // Without a bearer token at all, or with another scheme: the challenge without an error.
    for (name, authorization) in [
        ("no scheme", "garbage"),
        ("Basic", "Basic dXNlcjpwYXNz"),
        ("Bearer alone", "Bearer"),
    ] {
        let mut c = McpClient::connect(TokioConnect, &url).await.unwrap();
        let (status, h, _) = c
            .post_raw(
                br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.to_vec(),
                &[
                    ("content-type", "application/json"),
                    ("authorization", authorization),
                ],
            )
            .await
            .unwrap();
        let challenge = h
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if status != 401
            || challenge.contains("error=")
            || !challenge.contains("resource_metadata=")
        {
            failures.push(format!("{name}: {status} {challenge}"));
        }
    }
    println!(
        "{} hostile bearer tokens, {} failures",
        cases.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    gateway.stop().await;
}

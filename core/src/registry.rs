//! The project registry: `projects.toml` parsed into typed values, or refused with an error that
//! names the file, the line and the field.
//!
//! ```toml
//! default = "alpha"              # optional: where a new session starts
//! call_timeout_ms = 30000        # optional: deadline of a proxied call (default 30 s)
//!
//! [[project]]
//! name = "alpha"                 # [A-Za-z0-9_.-], 1 to 64 characters, unique
//! url = "http://127.0.0.1:9101"  # the project's own container address
//! ssh_port = 2201                # optional
//! host_path = "/srv/alpha"       # optional
//! kind = "adopted"               # or "built-in"; default "adopted"
//! sled = "alpha-sled"            # optional: the sled's name in messages; default the project name
//! call_timeout_ms = 60000        # optional: this project's own deadline
//! leases = "required"            # optional: every write to a leasable resource needs a lease
//!                                # (default "optional": writes nobody holds a lease on pass)
//! forward_principal = true       # optional: the sled learns who calls, in `_meta`
//! read_only_tools = ["status"]   # optional: the tools the `read` right covers; or, instead,
//! # trust_read_only_hints = true  # the tools the sled annotates `readOnlyHint: true`; with
//!                                # neither, `read` covers none of the project's tools
//! ```
//!
//! Client authentication, both optional: `client_tokens = ["…"]` (static bearer tokens; an
//! entry may be `{ name = "ops", token = "…" }` to be named in rules) and `[oauth]` (the
//! gateway as an OAuth resource server); see [`crate::auth`]. Who may do what on which project:
//! `[[access]]`, see [`crate::rights`].

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::auth::{OAuthConfig, RawOAuth};
use crate::rights::{self, RawRule, Rules};

/// Deadline of a proxied call when neither the file nor the project sets one.
pub(crate) const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);

const MAX_NAME_LEN: usize = 64;

/// A credential: compared in constant time, and never shown by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }

    /// The secret itself, to send where it belongs (a hello, a header); never to log.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `given` is this secret, in time that does not depend on where they differ.
    pub fn matches(&self, given: &str) -> bool {
        use subtle::ConstantTimeEq;
        self.0.len() == given.len() && bool::from(self.0.as_bytes().ct_eq(given.as_bytes()))
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// A secret is written as itself only where it belongs: the frame or file that carries it
/// (an uplink's hello). Its `Debug` stays redacted.
impl serde::Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Secret, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

/// Whether a write to a leasable resource of a project needs the caller to hold its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LeaseMode {
    /// A write nobody holds a lease on goes through, unfenced.
    #[default]
    Optional,
    /// A write goes through only under the caller's own lease.
    Required,
}

/// Whether a project was adopted into the fleet or ships with the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum ProjectKind {
    #[serde(rename = "adopted")]
    Adopted,
    #[serde(rename = "built-in")]
    BuiltIn,
}

impl ProjectKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProjectKind::Adopted => "adopted",
            ProjectKind::BuiltIn => "built-in",
        }
    }
}

/// One registered project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectSpec {
    pub name: String,
    pub url: String,
    pub ssh_port: Option<u16>,
    pub host_path: Option<String>,
    pub kind: ProjectKind,
    /// The name of the project's sled, used in messages about its uplink.
    pub sled: String,
    /// Deadline of a call proxied to this project.
    pub call_timeout: Duration,
    /// When set, the project's sled must present it in its hello.
    pub token: Option<Secret>,
    /// Whether writes to leasable resources need a lease (`leases = "required"`).
    pub leases_required: bool,
    /// Whether the sled learns who calls (`forward_principal = true`): the caller's subject
    /// and client id (or client token's name) in the forwarded request's `_meta`.
    pub forward_principal: bool,
    /// Which of the project's tools the `read` right covers.
    pub read_only_tools: ReadOnlyTools,
}

/// Which of a project's tools the `read` right covers. The gateway decides this, not the sled:
/// a server's `readOnlyHint` is a hint from the side the rule guards against, and a server
/// that mislabels a writing tool would hand it to read-only callers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ReadOnlyTools {
    /// Neither `read_only_tools` nor `trust_read_only_hints`: `read` covers none of them.
    #[default]
    None,
    /// `trust_read_only_hints = true`: the tools the sled annotates `readOnlyHint: true`.
    Hints,
    /// `read_only_tools = [...]`: these, whatever the sled says.
    Listed(BTreeSet<String>),
}

impl ReadOnlyTools {
    /// Whether calling `tool`, which the sled annotates read-only or not (`annotated`), needs
    /// only the `read` right.
    pub fn covers(&self, tool: &str, annotated: bool) -> bool {
        match self {
            ReadOnlyTools::None => false,
            ReadOnlyTools::Hints => annotated,
            ReadOnlyTools::Listed(tools) => tools.contains(tool),
        }
    }
}

impl ProjectSpec {
    /// A project with the defaults for everything but its name and url.
    pub fn new(name: impl Into<String>, url: impl Into<String>) -> ProjectSpec {
        let name = name.into();
        ProjectSpec {
            sled: name.clone(),
            name,
            url: url.into(),
            ssh_port: None,
            host_path: None,
            kind: ProjectKind::Adopted,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            token: None,
            leases_required: false,
            forward_principal: false,
            read_only_tools: ReadOnlyTools::None,
        }
    }
}

/// The registered projects, in file order, and the default project of new sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registry {
    projects: Vec<ProjectSpec>,
    index: HashMap<String, usize>,
    default: Option<String>,
    /// When not empty, every request to `/mcp` must carry one of these as a bearer token.
    client_tokens: Vec<Secret>,
    /// `[oauth]`: requests to `/mcp` may (with client tokens) or must carry an access token.
    oauth: Option<OAuthConfig>,
    /// The name of each client token (`client_tokens[i]` when the file gives none).
    client_token_names: Vec<String>,
    /// What each client token's sessions are owned by: `client <name>` for a named token,
    /// `client sha256:<hash>` for an unnamed one (never its position).
    client_token_owners: Vec<String>,
    /// `[[access]]`: who may do what on which project.
    rules: Rules,
    /// `allow_unauthenticated_uplinks = true`: a project with neither an uplink `token` nor a
    /// pinned identity key takes any sled that says hello for it (trust on first use). Off by
    /// default: such a project is refused every uplink until it gets one or the other. For
    /// local use (the demo, sled-sim on one machine), never for a gateway others can reach.
    allow_unauthenticated_uplinks: bool,
}

/// A `projects.toml` that was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}:{column}: {}{message}", field.as_ref().map(|f| format!("`{f}`: ")).unwrap_or_default())]
pub struct RegistryError {
    pub file: String,
    /// 1-based line of the offending text.
    pub line: usize,
    /// 1-based column of the offending text.
    pub column: usize,
    /// The field at fault, as a path such as `project[1].kind`, when there is one.
    pub field: Option<String>,
    pub message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    default: Option<Spanned<String>>,
    call_timeout_ms: Option<Spanned<u64>>,
    #[serde(default)]
    client_tokens: Vec<Spanned<RawToken>>,
    #[serde(default)]
    project: Vec<RawProject>,
    oauth: Option<RawOAuth>,
    #[serde(default)]
    access: Vec<Spanned<RawRule>>,
    #[serde(default)]
    allow_unauthenticated_uplinks: bool,
}

/// A client token: the token itself, or a table naming it for the `[[access]]` rules.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawToken {
    Plain(String),
    Named { name: String, token: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProject {
    name: Spanned<String>,
    url: Spanned<String>,
    ssh_port: Option<u16>,
    host_path: Option<String>,
    kind: Option<ProjectKind>,
    sled: Option<Spanned<String>>,
    call_timeout_ms: Option<Spanned<u64>>,
    token: Option<Spanned<String>>,
    leases: Option<LeaseMode>,
    forward_principal: Option<bool>,
    read_only_tools: Option<Spanned<Vec<String>>>,
    trust_read_only_hints: Option<Spanned<bool>>,
}

impl Registry {
    /// Parses the text of a `projects.toml`; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Registry, RegistryError> {
        let at = |span: Option<Range<usize>>, field: Option<String>, message: String| {
            let (line, column) = line_col(text, span.map_or(0, |s| s.start));
            RegistryError {
                file: file.to_owned(),
                line,
                column,
                field,
                message,
            }
        };
        let de = toml::Deserializer::new(text);
        let raw: RawFile = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let field = (path != ".").then_some(path);
            let inner = e.into_inner();
            at(inner.span(), field, inner.message().to_owned())
        })?;

        let file_timeout = match raw.call_timeout_ms {
            Some(t) => timeout_from(&t)
                .map_err(|m| at(Some(t.span()), Some("call_timeout_ms".into()), m))?,
            None => DEFAULT_CALL_TIMEOUT,
        };
        let mut projects = Vec::with_capacity(raw.project.len());
        let mut index = HashMap::with_capacity(raw.project.len());
        for (i, p) in raw.project.into_iter().enumerate() {
            let field = |f: &str| Some(format!("project[{i}].{f}"));
            let name = p.name.get_ref();
            check_name(name).map_err(|m| at(Some(p.name.span()), field("name"), m))?;
            if index.contains_key(name.as_str()) {
                return Err(at(
                    Some(p.name.span()),
                    field("name"),
                    format!("duplicate project name '{name}': each project is registered once"),
                ));
            }
            check_url(p.url.get_ref()).map_err(|m| at(Some(p.url.span()), field("url"), m))?;
            let sled = match &p.sled {
                Some(s) => {
                    check_name(s.get_ref()).map_err(|m| at(Some(s.span()), field("sled"), m))?;
                    s.get_ref().clone()
                }
                None => name.clone(),
            };
            let call_timeout = match &p.call_timeout_ms {
                Some(t) => {
                    timeout_from(t).map_err(|m| at(Some(t.span()), field("call_timeout_ms"), m))?
                }
                None => file_timeout,
            };
            let token = match &p.token {
                Some(t) => {
                    check_token(t.get_ref()).map_err(|m| at(Some(t.span()), field("token"), m))?;
                    Some(Secret::new(t.get_ref().clone()))
                }
                None => None,
            };
            let read_only_tools = match (p.read_only_tools, p.trust_read_only_hints) {
                (Some(_), Some(t)) => {
                    return Err(at(
                        Some(t.span()),
                        field("trust_read_only_hints"),
                        "set either read_only_tools (the list decides) or \
                         trust_read_only_hints (the sled's annotations decide), not both"
                            .into(),
                    ))
                }
                (Some(list), None) => {
                    let span = list.span();
                    let mut tools = BTreeSet::new();
                    for t in list.into_inner() {
                        if !crate::tools::valid_tool_name(&t) {
                            return Err(at(
                                Some(span),
                                field("read_only_tools"),
                                format!("'{t}' is not a tool name (1 to 128 of A-Z a-z 0-9 _ . -)"),
                            ));
                        }
                        tools.insert(t);
                    }
                    ReadOnlyTools::Listed(tools)
                }
                (None, Some(t)) if *t.get_ref() => ReadOnlyTools::Hints,
                (None, _) => ReadOnlyTools::None,
            };
            index.insert(name.clone(), i);
            projects.push(ProjectSpec {
                read_only_tools,
                token,
                name: p.name.into_inner(),
                url: p.url.into_inner(),
                ssh_port: p.ssh_port,
                host_path: p.host_path,
                kind: p.kind.unwrap_or(ProjectKind::Adopted),
                sled,
                call_timeout,
                leases_required: p.leases == Some(LeaseMode::Required),
                forward_principal: p.forward_principal.unwrap_or(false),
            });
        }
        let default = match raw.default {
            Some(d) if !index.contains_key(d.get_ref().as_str()) => {
                return Err(at(
                    Some(d.span()),
                    Some("default".into()),
                    format!(
                        "default project '{}' is not registered (registered: {})",
                        d.get_ref(),
                        list(projects.iter().map(|p| p.name.as_str()))
                    ),
                ));
            }
            Some(d) => Some(d.into_inner()),
            None => None,
        };
        let mut client_tokens = Vec::with_capacity(raw.client_tokens.len());
        let mut client_token_names: Vec<String> = Vec::with_capacity(raw.client_tokens.len());
        let named: Vec<bool> = raw
            .client_tokens
            .iter()
            .map(|t| matches!(t.get_ref(), RawToken::Named { .. }))
            .collect();
        for (i, t) in raw.client_tokens.iter().enumerate() {
            let field = Some(format!("client_tokens[{i}]"));
            let (name, token) = match t.get_ref() {
                RawToken::Plain(token) => (format!("client_tokens[{i}]"), token),
                RawToken::Named { name, token } => {
                    check_name(name).map_err(|m| at(Some(t.span()), field.clone(), m))?;
                    if client_token_names.contains(name) {
                        return Err(at(
                            Some(t.span()),
                            field,
                            format!("two client tokens are named '{name}'"),
                        ));
                    }
                    (name.clone(), token)
                }
            };
            check_token(token).map_err(|m| at(Some(t.span()), field, m))?;
            client_tokens.push(Secret::new(token.clone()));
            client_token_names.push(name);
        }
        let client_token_owners = owners_of(&client_tokens, &client_token_names, &named);
        let names: Vec<&str> = client_token_names.iter().map(String::as_str).collect();
        let rules = rights::check(raw.access, &|p| index.contains_key(p), &names)
            .map_err(|(span, field, m)| at(span, Some(field), m))?;
        let oauth = match raw.oauth {
            Some(o) => Some(
                o.check()
                    .map_err(|(span, field, m)| at(span, Some(field), m))?,
            ),
            None => None,
        };
        Ok(Registry {
            projects,
            index,
            default,
            client_tokens,
            oauth,
            client_token_names,
            client_token_owners,
            rules,
            allow_unauthenticated_uplinks: raw.allow_unauthenticated_uplinks,
        })
    }

    /// A registry built in code (the demo's, a test's), checked as a file would be.
    pub fn from_projects(
        projects: Vec<ProjectSpec>,
        default: Option<&str>,
    ) -> Result<Registry, RegistryError> {
        let err = |i: usize, f: &str, message: String| RegistryError {
            file: "<built-in>".into(),
            line: 1,
            column: 1,
            field: Some(format!("project[{i}].{f}")),
            message,
        };
        let mut index = HashMap::with_capacity(projects.len());
        for (i, p) in projects.iter().enumerate() {
            check_name(&p.name).map_err(|m| err(i, "name", m))?;
            check_name(&p.sled).map_err(|m| err(i, "sled", m))?;
            check_url(&p.url).map_err(|m| err(i, "url", m))?;
            if index.insert(p.name.clone(), i).is_some() {
                return Err(err(
                    i,
                    "name",
                    format!("duplicate project name '{}'", p.name),
                ));
            }
        }
        if let Some(d) = default {
            if !index.contains_key(d) {
                return Err(RegistryError {
                    file: "<built-in>".into(),
                    line: 1,
                    column: 1,
                    field: Some("default".into()),
                    message: format!("default project '{d}' is not registered"),
                });
            }
        }
        Ok(Registry {
            projects,
            index,
            default: default.map(str::to_owned),
            client_tokens: Vec::new(),
            oauth: None,
            client_token_names: Vec::new(),
            client_token_owners: Vec::new(),
            rules: Rules::default(),
            allow_unauthenticated_uplinks: false,
        })
    }

    /// The same registry, taking uplinks of projects with neither a token nor a pin (see
    /// [`Registry::allows_unauthenticated_uplinks`]): for the demo and tests that say so.
    pub fn allowing_unauthenticated_uplinks(mut self) -> Registry {
        self.allow_unauthenticated_uplinks = true;
        self
    }

    /// Whether a project with neither an uplink token nor a pinned key takes any sled
    /// (`allow_unauthenticated_uplinks = true`); off by default.
    pub fn allows_unauthenticated_uplinks(&self) -> bool {
        self.allow_unauthenticated_uplinks
    }

    /// The same registry, requiring one of `tokens` as a bearer token on every request.
    pub fn with_client_tokens(mut self, tokens: Vec<Secret>) -> Registry {
        self.client_token_names = (0..tokens.len())
            .map(|i| format!("client_tokens[{i}]"))
            .collect();
        self.client_token_owners = owners_of(
            &tokens,
            &self.client_token_names,
            &vec![false; tokens.len()],
        );
        self.client_tokens = tokens;
        self
    }

    /// What the sessions of the `i`th client token are owned by (see
    /// [`crate::Identity::session_owner`]).
    pub fn client_token_owner(&self, i: usize) -> Option<&str> {
        self.client_token_owners.get(i).map(String::as_str)
    }

    /// The name of the `i`th client token: its `name`, or `client_tokens[i]`.
    pub fn client_token_name(&self, i: usize) -> Option<&str> {
        self.client_token_names.get(i).map(String::as_str)
    }

    /// `[[access]]`: who may do what on which project.
    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// The bearer tokens clients must present; none means no client authentication.
    pub fn client_tokens(&self) -> &[Secret] {
        &self.client_tokens
    }

    /// The same registry, with the gateway an OAuth resource server as `oauth` says.
    pub fn with_oauth(mut self, oauth: OAuthConfig) -> Registry {
        self.oauth = Some(oauth);
        self
    }

    /// `[oauth]`, when the gateway is an OAuth resource server.
    pub fn oauth(&self) -> Option<&OAuthConfig> {
        self.oauth.as_ref()
    }

    /// The project named `name`, and its position in the file.
    pub fn get(&self, name: &str) -> Option<(usize, &ProjectSpec)> {
        self.index.get(name).map(|&i| (i, &self.projects[i]))
    }

    /// The project at a position returned by [`Registry::get`].
    pub fn at(&self, i: usize) -> &ProjectSpec {
        &self.projects[i]
    }

    pub fn projects(&self) -> &[ProjectSpec] {
        &self.projects
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.projects.iter().map(|p| p.name.as_str())
    }

    /// Where a new session starts, if the file says.
    pub fn default_project(&self) -> Option<&str> {
        self.default.as_deref()
    }

    pub fn len(&self) -> usize {
        self.projects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.projects.is_empty()
    }
}

fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!("'{name}' is longer than {MAX_NAME_LEN} characters"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return Err(format!(
            "'{name}' has the character {c:?}: use letters, digits, '_', '.' and '-'"
        ));
    }
    Ok(())
}

/// Each client token's session owner: its name when the file named it, else a hash of it.
fn owners_of(tokens: &[Secret], names: &[String], named: &[bool]) -> Vec<String> {
    use sha2::Digest;
    tokens
        .iter()
        .zip(names)
        .zip(named)
        .map(|((token, name), named)| {
            if *named {
                format!("client {name}")
            } else {
                let hash = sha2::Sha256::digest(token.expose().as_bytes());
                format!("client sha256:{}", hex::encode(&hash[..16]))
            }
        })
        .collect()
}

fn check_token(token: &str) -> Result<(), String> {
    if token.len() < 16 {
        return Err("a token must be at least 16 characters long".into());
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("a token must not contain whitespace or control characters".into());
    }
    Ok(())
}

fn check_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("'{url}' is not an http:// or https:// URL"))?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    if host.is_empty() || host.contains(char::is_whitespace) {
        return Err(format!("'{url}' has no host"));
    }
    Ok(())
}

fn timeout_from(t: &Spanned<u64>) -> Result<Duration, String> {
    match *t.get_ref() {
        0 => Err("must be at least 1 millisecond".into()),
        ms => Ok(Duration::from_millis(ms)),
    }
}

fn list<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let v: Vec<&str> = names.collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// 1-based line and column of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..text.floor_char_boundary_compat(offset)];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

trait FloorCharBoundary {
    fn floor_char_boundary_compat(&self, i: usize) -> usize;
}

impl FloorCharBoundary for str {
    fn floor_char_boundary_compat(&self, mut i: usize) -> usize {
        while !self.is_char_boundary(i) {
            i -= 1;
        }
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Registry::parse("projects.toml", text)
            .unwrap_err()
            .to_string()
    }

    const GOOD: &str = r#"
default = "alpha"

[[project]]
name = "alpha"
url = "http://127.0.0.1:9101"
ssh_port = 2201
host_path = "/srv/alpha"
kind = "adopted"

[[project]]
name = "beta"
url = "https://beta.internal:8443/"
kind = "built-in"
sled = "beta-sled"
call_timeout_ms = 5000
"#;

    #[test]
    fn the_read_right_covers_a_list_the_sleds_hints_or_no_tool() {
        let file = "[[project]]\nname = \"a\"\nurl = \"http://x\"\nread_only_tools = [\"show\", \"status\"]\n\
                    [[project]]\nname = \"b\"\nurl = \"http://y\"\ntrust_read_only_hints = true\n\
                    [[project]]\nname = \"c\"\nurl = \"http://z\"\ntrust_read_only_hints = false\n\
                    [[project]]\nname = \"d\"\nurl = \"http://w\"\n";
        let r = Registry::parse("projects.toml", file).unwrap();
        let covers = |p: &str, tool: &str, annotated: bool| {
            r.get(p).unwrap().1.read_only_tools.covers(tool, annotated)
        };
        assert!(covers("a", "status", false) && !covers("a", "wipe", true));
        assert!(covers("b", "show", true) && !covers("b", "status", false));
        assert!(!covers("c", "show", true) && !covers("d", "show", true));
        assert_eq!(
            err("[[project]]\nname = \"a\"\nurl = \"http://x\"\nread_only_tools = [\"show\"]\ntrust_read_only_hints = true\n"),
            "projects.toml:5:25: `project[0].trust_read_only_hints`: set either read_only_tools (the list decides) or trust_read_only_hints (the sled's annotations decide), not both"
        );
        assert_eq!(
            err("[[project]]\nname = \"a\"\nurl = \"http://x\"\nread_only_tools = [\"a b\"]\n"),
            "projects.toml:4:19: `project[0].read_only_tools`: 'a b' is not a tool name (1 to 128 of A-Z a-z 0-9 _ . -)"
        );
    }

    #[test]
    fn parses_the_documented_shape() {
        let r = Registry::parse("projects.toml", GOOD).unwrap();
        assert_eq!(r.default_project(), Some("alpha"));
        assert_eq!(r.names().collect::<Vec<_>>(), ["alpha", "beta"]);
        let (i, alpha) = r.get("alpha").unwrap();
        assert_eq!(i, 0);
        assert_eq!(alpha.ssh_port, Some(2201));
        assert_eq!(alpha.host_path.as_deref(), Some("/srv/alpha"));
        assert_eq!(alpha.sled, "alpha");
        assert_eq!(alpha.call_timeout, DEFAULT_CALL_TIMEOUT);
        let (_, beta) = r.get("beta").unwrap();
        assert_eq!(beta.kind, ProjectKind::BuiltIn);
        assert_eq!(beta.sled, "beta-sled");
        assert_eq!(beta.call_timeout, Duration::from_millis(5000));
        assert!(r.get("gamma").is_none());
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let cases: &[(&str, &str)] = &[
            (
                "[[project]]\nname = \"a\"\nurl = \"http://x\"\nkind = \"borrowed\"\n",
                "projects.toml:4:8: `project[0].kind`: unknown variant `borrowed`, expected `adopted` or `built-in`",
            ),
            (
                "[[project]]\nname = \"a\"\nurl = \"http://x\"\nssh_port = \"22\"\n",
                "projects.toml:4:12: `project[0].ssh_port`: invalid type: string \"22\", expected u16",
            ),
            (
                "[[project]]\nname = \"a\"\nurl = \"http://x\"\nsssh_port = 22\n",
                "projects.toml:4:1: `project[0].sssh_port`: unknown field `sssh_port`, expected one of `name`, `url`, `ssh_port`, `host_path`, `kind`, `sled`, `call_timeout_ms`, `token`, `leases`, `forward_principal`, `read_only_tools`, `trust_read_only_hints`",
            ),
            (
                "[[project]]\nname = \"a\"\nurl = \"http://x\"\n[[project]]\nname = \"a\"\nurl = \"http://y\"\n",
                "projects.toml:5:8: `project[1].name`: duplicate project name 'a': each project is registered once",
            ),
            (
                "default = \"zeta\"\n[[project]]\nname = \"a\"\nurl = \"http://x\"\n",
                "projects.toml:1:11: `default`: default project 'zeta' is not registered (registered: a)",
            ),
            (
                "[[project]]\nname = \"a b\"\nurl = \"http://x\"\n",
                "projects.toml:2:8: `project[0].name`: 'a b' has the character ' ': use letters, digits, '_', '.' and '-'",
            ),
            (
                "[[project]]\nname = \"a\"\nurl = \"ftp://x\"\n",
                "projects.toml:3:7: `project[0].url`: 'ftp://x' is not an http:// or https:// URL",
            ),
            (
                "[[project]]\nname = \"a\"\nurl = \"http://x\"\ncall_timeout_ms = 0\n",
                "projects.toml:4:19: `project[0].call_timeout_ms`: must be at least 1 millisecond",
            ),
            ("[[project]]\nname = \"a\"\n", "projects.toml:1:1: `project[0]`: missing field `url`"),
            ("default = \n", "projects.toml:1:11: invalid string\nexpected `\"`, `'`"),
        ];
        for (text, want) in cases {
            assert_eq!(&err(text), want, "for {text:?}");
        }
    }

    #[test]
    fn empty_file_is_an_empty_registry() {
        let r = Registry::parse("p.toml", "").unwrap();
        assert!(r.is_empty());
        assert_eq!(r.default_project(), None);
    }
}

//! Who may do what, per project: the `[[access]]` rules of projects.toml.
//!
//! ```toml
//! [[access]]
//! group = "ops"                 # who: exactly one of subject, client_id, group, token, anyone
//! projects = ["*"]              # which projects ("*": all of them)
//! right = "admin"               # read < write < admin; each includes the ones before
//!
//! [[access]]
//! client_id = "ci-bot"
//! projects = ["alpha"]
//! right = "read"
//! ```
//!
//! - `subject`, `client_id` and `group` match an OAuth access token's `sub`, `client_id` (or
//!   `azp`) and groups claim; `token` matches a named client token (`client_tokens = [{ name =
//!   "ops", token = "…" }]`); `anyone = true` matches every caller let in.
//! - A caller's right on a project is the highest any matching rule gives; no matching rule:
//!   no right, and the project is invisible to it.
//! - Without any `[[access]]`, every caller let in may do everything (the gateway of before
//!   rules existed); a file that wants no one anywhere says so with rules that match nobody.
//!
//! `read` is the project's read-only tools (the sled's `readOnlyHint`, never the tool's name),
//! resources, prompts and completion, and seeing the project at all (listings, fleet tools,
//! the roster); `write` is every other tool and leases; `admin` is re-pinning its sled's key
//! (`fleet_identity`) and force-releasing another agent's lease.

use std::collections::BTreeSet;
use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

use crate::auth::Identity;

/// What a caller may do on a project.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Right {
    Read,
    Write,
    Admin,
}

impl Right {
    pub fn name(self) -> &'static str {
        match self {
            Right::Read => "read",
            Right::Write => "write",
            Right::Admin => "admin",
        }
    }

    fn parse(s: &str) -> Option<Right> {
        match s {
            "read" => Some(Right::Read),
            "write" => Some(Right::Write),
            "admin" => Some(Right::Admin),
            _ => None,
        }
    }
}

/// Whom a rule is for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Who {
    Subject(String),
    ClientId(String),
    Group(String),
    Token(String),
    Anyone,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Projects {
    All,
    Named(BTreeSet<String>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    who: Who,
    projects: Projects,
    right: Right,
}

/// The `[[access]]` rules of a projects.toml.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rules {
    rules: Vec<Rule>,
}

/// The names a caller goes by, for the rules.
pub struct Caller<'a> {
    identity: &'a Identity,
    /// The name of its client token, when it came in with one.
    token_name: Option<&'a str>,
}

impl<'a> Caller<'a> {
    pub fn new(identity: &'a Identity, token_name: Option<&'a str>) -> Caller<'a> {
        Caller {
            identity,
            token_name,
        }
    }
}

impl Rules {
    /// Whether there are no rules: every caller may do everything.
    pub fn is_open(&self) -> bool {
        self.rules.is_empty()
    }

    /// The caller's right on `project`, if any.
    pub fn right(&self, caller: &Caller<'_>, project: &str) -> Option<Right> {
        if self.is_open() {
            return Some(Right::Admin);
        }
        self.rules
            .iter()
            .filter(|r| match &r.projects {
                Projects::All => true,
                Projects::Named(set) => set.contains(project),
            })
            .filter(|r| matches(&r.who, caller))
            .map(|r| r.right)
            .max()
    }

    /// Whether the caller has at least `need` on `project`.
    pub fn allows(&self, caller: &Caller<'_>, project: &str, need: Right) -> bool {
        self.right(caller, project).is_some_and(|r| r >= need)
    }
}

fn matches(who: &Who, caller: &Caller<'_>) -> bool {
    let principal = match caller.identity {
        Identity::Token(p) => Some(p),
        Identity::Anonymous | Identity::ClientToken(_) => None,
    };
    match who {
        Who::Anyone => true,
        Who::Token(name) => caller.token_name == Some(name.as_str()),
        Who::Subject(s) => principal.is_some_and(|p| &p.subject == s),
        Who::ClientId(c) => principal.is_some_and(|p| p.client_id.as_deref() == Some(c)),
        Who::Group(g) => principal.is_some_and(|p| p.groups.iter().any(|x| x == g)),
    }
}

/// One `[[access]]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRule {
    subject: Option<Spanned<String>>,
    client_id: Option<Spanned<String>>,
    group: Option<Spanned<String>>,
    token: Option<Spanned<String>>,
    anyone: Option<Spanned<bool>>,
    projects: Spanned<Vec<Spanned<String>>>,
    right: Spanned<String>,
}

/// A refusal of a rule: where, which field, what.
pub(crate) type RawError = (Option<Range<usize>>, String, String);

/// Checks the file's rules against its projects and its client tokens' names.
pub(crate) fn check(
    raw: Vec<Spanned<RawRule>>,
    projects: &dyn Fn(&str) -> bool,
    token_names: &[&str],
) -> Result<Rules, RawError> {
    let mut rules = Vec::with_capacity(raw.len());
    for (i, r) in raw.into_iter().enumerate() {
        let span = r.span();
        let r = r.into_inner();
        let field = |f: &str| format!("access[{i}].{f}");
        let mut who = Vec::new();
        let mut named = |f: &str, v: Option<Spanned<String>>, make: fn(String) -> Who| {
            if let Some(v) = v {
                if v.get_ref().is_empty() {
                    return Err((Some(v.span()), field(f), "must not be empty".to_owned()));
                }
                who.push((f.to_owned(), v.span(), make(v.into_inner())));
            }
            Ok(())
        };
        named("subject", r.subject, Who::Subject)?;
        named("client_id", r.client_id, Who::ClientId)?;
        named("group", r.group, Who::Group)?;
        named("token", r.token, Who::Token)?;
        if let Some(a) = r.anyone {
            if !*a.get_ref() {
                return Err((
                    Some(a.span()),
                    field("anyone"),
                    "only `anyone = true` means anything; leave it out instead".into(),
                ));
            }
            who.push(("anyone".into(), a.span(), Who::Anyone));
        }
        let who = match who.len() {
            1 => who.pop().expect("one").2,
            0 => return Err((
                Some(span),
                format!("access[{i}]"),
                "name whom the rule is for: one of subject, client_id, group, token, anyone = true"
                    .into(),
            )),
            _ => {
                return Err((
                    Some(who[1].1.clone()),
                    field(&who[1].0),
                    format!(
                        "a rule is for one kind of caller; it already names {} (write two rules)",
                        who[0].0
                    ),
                ))
            }
        };
        if let Who::Token(name) = &who {
            if !token_names.contains(&name.as_str()) {
                return Err((
                    Some(span),
                    field("token"),
                    format!("no client token is named '{name}' (name one with client_tokens = [{{ name = \"{name}\", token = \"…\" }}])"),
                ));
            }
        }
        let right = Right::parse(r.right.get_ref()).ok_or_else(|| {
            (
                Some(r.right.span()),
                field("right"),
                format!(
                    "'{}' is not a right: read, write or admin",
                    r.right.get_ref()
                ),
            )
        })?;
        let projects_span = r.projects.span();
        let listed = r.projects.into_inner();
        if listed.is_empty() {
            return Err((
                Some(projects_span),
                field("projects"),
                "name at least one project, or \"*\" for all".into(),
            ));
        }
        let projects = if listed.iter().any(|p| p.get_ref() == "*") {
            if listed.len() > 1 {
                return Err((
                    Some(projects_span),
                    field("projects"),
                    "\"*\" means all projects: list nothing beside it".into(),
                ));
            }
            Projects::All
        } else {
            let mut set = BTreeSet::new();
            for p in listed {
                if !projects(p.get_ref()) {
                    return Err((
                        Some(p.span()),
                        field("projects"),
                        format!("no project is named '{}'", p.get_ref()),
                    ));
                }
                set.insert(p.into_inner());
            }
            Projects::Named(set)
        };
        rules.push(Rule {
            who,
            projects,
            right,
        });
    }
    Ok(Rules { rules })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Principal;

    #[derive(Deserialize)]
    struct File {
        #[serde(default)]
        access: Vec<Spanned<RawRule>>,
    }

    fn rules(text: &str) -> Result<Rules, String> {
        let file: File = toml::from_str(text).map_err(|e| e.to_string())?;
        check(
            file.access,
            &|p| ["alpha", "beta", "gamma"].contains(&p),
            &["ops-token"],
        )
        .map_err(|(_, field, m)| format!("{field}: {m}"))
    }

    fn principal(subject: &str, client_id: Option<&str>, groups: &[&str]) -> Identity {
        Identity::Token(Box::new(Principal {
            issuer: "https://id.example.com".into(),
            subject: subject.into(),
            client_id: client_id.map(str::to_owned),
            scopes: BTreeSet::new(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        }))
    }

    const FILE: &str = r#"
        [[access]]
        client_id = "reader"
        projects = ["alpha"]
        right = "read"

        [[access]]
        subject = "dev"
        projects = ["alpha", "beta"]
        right = "write"

        [[access]]
        group = "ops"
        projects = ["*"]
        right = "admin"

        [[access]]
        token = "ops-token"
        projects = ["gamma"]
        right = "write"
    "#;

    #[test]
    fn the_highest_matching_rule_decides_and_no_rule_means_nothing() {
        let r = rules(FILE).unwrap();
        let reader = principal("svc-1", Some("reader"), &[]);
        let c = Caller::new(&reader, None);
        assert_eq!(r.right(&c, "alpha"), Some(Right::Read));
        assert_eq!(r.right(&c, "beta"), None);
        assert!(r.allows(&c, "alpha", Right::Read));
        assert!(!r.allows(&c, "alpha", Right::Write));

        let dev_in_ops = principal("dev", None, &["ops"]);
        let c = Caller::new(&dev_in_ops, None);
        assert_eq!(r.right(&c, "alpha"), Some(Right::Admin), "the highest wins");
        let dev = principal("dev", None, &["other"]);
        let c = Caller::new(&dev, None);
        assert_eq!(r.right(&c, "beta"), Some(Right::Write));
        assert_eq!(r.right(&c, "gamma"), None);

        let token = Identity::ClientToken(0);
        assert_eq!(
            r.right(&Caller::new(&token, Some("ops-token")), "gamma"),
            Some(Right::Write)
        );
        assert_eq!(r.right(&Caller::new(&token, Some("other")), "gamma"), None);
        assert_eq!(
            r.right(&Caller::new(&Identity::Anonymous, None), "alpha"),
            None
        );
    }

    #[test]
    fn without_rules_everyone_may_do_everything() {
        let r = rules("").unwrap();
        assert!(r.is_open());
        let c = Caller::new(&Identity::Anonymous, None);
        assert_eq!(r.right(&c, "anything"), Some(Right::Admin));
        let r =
            rules("[[access]]\nanyone = true\nprojects = [\"beta\"]\nright = \"read\"\n").unwrap();
        assert_eq!(r.right(&c, "beta"), Some(Right::Read));
        assert_eq!(r.right(&c, "alpha"), None);
    }

    #[test]
    fn bad_rules_are_refused_naming_the_field() {
        for (text, want) in [
            ("[[access]]\nprojects = [\"alpha\"]\nright = \"read\"", "access[0]: name whom"),
            ("[[access]]\nsubject = \"a\"\ngroup = \"b\"\nprojects = [\"alpha\"]\nright = \"read\"", "access[0].group: a rule is for one kind"),
            ("[[access]]\nsubject = \"a\"\nprojects = [\"zeta\"]\nright = \"read\"", "access[0].projects: no project is named 'zeta'"),
            ("[[access]]\nsubject = \"a\"\nprojects = [\"*\", \"alpha\"]\nright = \"read\"", "access[0].projects: \"*\" means all"),
            ("[[access]]\nsubject = \"a\"\nprojects = []\nright = \"read\"", "access[0].projects: name at least one"),
            ("[[access]]\nsubject = \"a\"\nprojects = [\"alpha\"]\nright = \"owner\"", "access[0].right: 'owner' is not a right"),
            ("[[access]]\ntoken = \"nope\"\nprojects = [\"alpha\"]\nright = \"read\"", "access[0].token: no client token is named 'nope'"),
            ("[[access]]\nanyone = false\nprojects = [\"alpha\"]\nright = \"read\"", "access[0].anyone: only"),
            ("[[access]]\nsubject = \"\"\nprojects = [\"alpha\"]\nright = \"read\"", "access[0].subject: must not be empty"),
        ] {
            let got = rules(text).unwrap_err();
            assert!(got.starts_with(want), "{text}\n=> {got}");
        }
        assert!(rules(
            "[[access]]\nsubject = \"a\"\nprojects = [\"alpha\"]\nright = \"read\"\nextra = 1"
        )
        .unwrap_err()
        .contains("unknown field"));
    }
}

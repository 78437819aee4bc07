//! How a replica proves itself to NATS and protects its connection: the `gateway serve` flags
//! and environment variables ([`NatsAuthFlags`]), read into a [`NatsAuth`] that
//! [`super::nats::NatsEngine::connect`] applies to its connection.
//!
//! Every way nats-server authenticates a client is here: a user and password, a token, an nkey
//! seed, a creds file (a user JWT and its nkey seed), and a client certificate (mutual TLS),
//! with a CA file for the server's certificate and a demand for TLS.
//!
//! A secret (a password, a token, a seed, a creds file) is read from a file or from the
//! environment, never from a command-line value, since a command line is readable by every
//! user of the host (`ps`, `/proc`). It is never printed: not in an error, a log line or
//! `Debug`. A `--cluster` URL that carries credentials (`nats://user:pass@host`) is refused
//! with a message that says where they go, and the URL is never echoed with them.

use std::path::{Path, PathBuf};

/// The password of `--nats-user`, itself, when no `--nats-password-file` is given.
pub const PASSWORD_ENV: &str = "MCP_GATEWAY_NATS_PASSWORD";
/// The token, itself, when no `--nats-token-file` is given.
pub const TOKEN_ENV: &str = "MCP_GATEWAY_NATS_TOKEN";
/// The nkey seed (`SU…`), itself, when no `--nats-nkey-seed-file` is given.
pub const NKEY_SEED_ENV: &str = "MCP_GATEWAY_NATS_NKEY_SEED";
/// `--nats-user`.
pub const USER_ENV: &str = "MCP_GATEWAY_NATS_USER";
/// `--nats-creds`.
pub const CREDS_ENV: &str = "MCP_GATEWAY_NATS_CREDS";
/// `--nats-ca-file`.
pub const CA_FILE_ENV: &str = "MCP_GATEWAY_NATS_CA_FILE";
/// `--nats-client-cert`.
pub const CLIENT_CERT_ENV: &str = "MCP_GATEWAY_NATS_CLIENT_CERT";
/// `--nats-client-key`.
pub const CLIENT_KEY_ENV: &str = "MCP_GATEWAY_NATS_CLIENT_KEY";
/// `--nats-require-tls` (`1`, `true` or `yes`; `0`, `false`, `no` or empty: not required).
pub const REQUIRE_TLS_ENV: &str = "MCP_GATEWAY_NATS_REQUIRE_TLS";

/// The flags of `gateway serve` that say how a replica authenticates to NATS (flattened into
/// its cluster flags). Each has an environment variable, read when the flag is not given.
/// At most one way of authenticating (user and password, token, nkey, creds) may be given; a
/// client certificate goes with any of them or alone.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct NatsAuthFlags {
    /// The NATS user name; its password is read from --nats-password-file, else from env
    /// MCP_GATEWAY_NATS_PASSWORD [else env MCP_GATEWAY_NATS_USER].
    #[arg(long = "nats-user", value_name = "NAME", requires = "cluster")]
    pub user: Option<String>,
    /// A file holding the password of --nats-user (never give it on the command line)
    /// [else env MCP_GATEWAY_NATS_PASSWORD, the password itself].
    #[arg(long = "nats-password-file", value_name = "FILE", requires = "cluster")]
    pub password_file: Option<PathBuf>,
    /// A file holding the token the NATS server expects (`authorization { token }`)
    /// [else env MCP_GATEWAY_NATS_TOKEN, the token itself].
    #[arg(long = "nats-token-file", value_name = "FILE", requires = "cluster")]
    pub token_file: Option<PathBuf>,
    /// A file holding this replica's user nkey seed (SU…; the server lists its public key
    /// U…) [else env MCP_GATEWAY_NATS_NKEY_SEED, the seed itself].
    #[arg(
        long = "nats-nkey-seed-file",
        value_name = "FILE",
        requires = "cluster"
    )]
    pub nkey_seed_file: Option<PathBuf>,
    /// A NATS creds file: this replica's user JWT and nkey seed, for a server in operator
    /// (JWT) mode [else env MCP_GATEWAY_NATS_CREDS, the file's path].
    #[arg(long = "nats-creds", value_name = "FILE", requires = "cluster")]
    pub creds: Option<PathBuf>,
    /// The CA certificate(s) (PEM) that signed the NATS server's certificate, in place of the
    /// system's roots; implies --nats-require-tls [else env MCP_GATEWAY_NATS_CA_FILE].
    #[arg(long = "nats-ca-file", value_name = "FILE", requires = "cluster")]
    pub ca_file: Option<PathBuf>,
    /// This replica's client certificate (PEM), for a NATS server that verifies clients
    /// (mutual TLS); needs --nats-client-key, implies --nats-require-tls
    /// [else env MCP_GATEWAY_NATS_CLIENT_CERT].
    #[arg(long = "nats-client-cert", value_name = "FILE", requires = "cluster")]
    pub client_cert: Option<PathBuf>,
    /// The private key (PEM) of --nats-client-cert [else env MCP_GATEWAY_NATS_CLIENT_KEY].
    #[arg(long = "nats-client-key", value_name = "FILE", requires = "cluster")]
    pub client_key: Option<PathBuf>,
    /// Refuse to talk to NATS in clear: connect only over TLS, verified against the system's
    /// roots or --nats-ca-file [else env MCP_GATEWAY_NATS_REQUIRE_TLS=1].
    #[arg(long = "nats-require-tls", requires = "cluster")]
    pub require_tls: bool,
}

/// A secret: its `Debug` says only that it is there.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(text: impl Into<String>) -> Secret {
        Secret(text.into())
    }

    /// The secret itself, for the NATS client.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(redacted)")
    }
}

/// How the replica authenticates to NATS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    UserPassword {
        user: String,
        password: Secret,
    },
    Token(Secret),
    /// A user nkey seed; `public` is its public key (U…), which is no secret.
    Nkey {
        seed: Secret,
        public: String,
    },
    /// A creds file's contents (a user JWT and its nkey seed), read at start.
    Creds {
        path: PathBuf,
        contents: Secret,
    },
}

impl Credentials {
    /// What a log line or an error may say about them.
    pub fn describe(&self) -> String {
        match self {
            Credentials::UserPassword { user, .. } => format!("user {user:?} with a password"),
            Credentials::Token(_) => "a token".into(),
            Credentials::Nkey { public, .. } => format!("nkey {public}"),
            Credentials::Creds { path, .. } => format!("the creds file {}", path.display()),
        }
    }
}

/// What the replica asks of TLS to NATS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// Trust these roots (PEM) instead of the system's.
    pub ca_file: Option<PathBuf>,
    /// This client's certificate and key (PEM), for mutual TLS.
    pub client: Option<(PathBuf, PathBuf)>,
    /// Connect only over TLS (also implied by either of the above).
    pub required: bool,
}

impl TlsSettings {
    /// Whether the connection must be TLS.
    pub fn is_required(&self) -> bool {
        self.required || self.ca_file.is_some() || self.client.is_some()
    }
}

/// How a replica authenticates to NATS and protects its connection; the default is neither.
/// Its `Debug` shows no secret.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NatsAuth {
    pub credentials: Option<Credentials>,
    pub tls: TlsSettings,
}

impl NatsAuth {
    /// Applies these to the client's options.
    pub(crate) fn apply(
        &self,
        mut options: async_nats::ConnectOptions,
    ) -> Result<async_nats::ConnectOptions, String> {
        match &self.credentials {
            None => {}
            Some(Credentials::UserPassword { user, password }) => {
                options = options.user_and_password(user.clone(), password.expose().to_owned());
            }
            Some(Credentials::Token(token)) => options = options.token(token.expose().to_owned()),
            Some(Credentials::Nkey { seed, .. }) => {
                options = options.nkey(seed.expose().to_owned())
            }
            Some(Credentials::Creds { path, contents }) => {
                options = options
                    .credentials(contents.expose())
                    .map_err(|_| creds_unreadable(path))?;
            }
        }
        if let Some(ca) = &self.tls.ca_file {
            options = options.add_root_certificates(ca.clone());
        }
        if let Some((cert, key)) = &self.tls.client {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        Ok(options.require_tls(self.tls.is_required()))
    }

    /// What a log line may say: how the replica authenticates, and over what.
    pub fn describe(&self) -> String {
        let who = match &self.credentials {
            Some(c) => c.describe(),
            None if self.tls.client.is_some() => "its client certificate".into(),
            None => "no credentials".into(),
        };
        let over = match (&self.tls.client, self.tls.is_required()) {
            (Some(_), _) => "mutual TLS",
            (None, true) => "TLS",
            (None, false) => "whatever the server offers (TLS not required)",
        };
        format!("{who}, over {over}")
    }
}

fn creds_unreadable(path: &Path) -> String {
    format!(
        "the creds file {} (--nats-creds) holds no user JWT and nkey seed in the creds format \
         (-----BEGIN NATS USER JWT----- …)",
        path.display()
    )
}

impl NatsAuthFlags {
    /// Reads the flags, then the environment (`env`), and the files they name; checks what
    /// can be checked before connecting (the seed parses, the creds file has its two parts,
    /// the TLS files can be read). An error is a line to print, without any secret.
    pub fn resolve(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<NatsAuth, String> {
        let env_nonempty = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        let env_path = |k: &str| env_nonempty(k).map(PathBuf::from);
        let user = self.user.clone().or_else(|| env_nonempty(USER_ENV));
        let password = secret(
            self.password_file.as_deref(),
            env_nonempty(PASSWORD_ENV),
            "--nats-password-file",
        )?;
        let token = secret(
            self.token_file.as_deref(),
            env_nonempty(TOKEN_ENV),
            "--nats-token-file",
        )?;
        let seed = secret(
            self.nkey_seed_file.as_deref(),
            env_nonempty(NKEY_SEED_ENV),
            "--nats-nkey-seed-file",
        )?;
        let creds = self.creds.clone().or_else(|| env_path(CREDS_ENV));

        let mut given = Vec::new();
        if user.is_some() || password.is_some() {
            given.push("a user and password (--nats-user, --nats-password-file)");
        }
        if token.is_some() {
            given.push("a token (--nats-token-file)");
        }
        if seed.is_some() {
            given.push("an nkey seed (--nats-nkey-seed-file)");
        }
        if creds.is_some() {
            given.push("a creds file (--nats-creds)");
        }
        if given.len() > 1 {
            return Err(format!(
                "more than one way to authenticate to NATS is given: {}; give one (flags or their \
                 MCP_GATEWAY_NATS_* environment variables)",
                given.join(", ")
            ));
        }

        let credentials = match (user, password, token, seed, creds) {
            (Some(user), Some(password), ..) => Some(Credentials::UserPassword { user, password }),
            (Some(_), None, ..) => {
                return Err(format!(
                    "--nats-user needs its password, in the file given to --nats-password-file or \
                     in {PASSWORD_ENV}"
                ))
            }
            (None, Some(_), ..) => {
                return Err(format!(
                    "a NATS password is given (--nats-password-file or {PASSWORD_ENV}) but no \
                     user: add --nats-user (or {USER_ENV})"
                ))
            }
            (None, None, Some(token), ..) => Some(Credentials::Token(token)),
            (None, None, None, Some(seed), _) => {
                let public = nkey_public(seed.expose(), self.nkey_seed_file.as_deref())?;
                Some(Credentials::Nkey { seed, public })
            }
            (None, None, None, None, Some(path)) => {
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    format!(
                        "cannot read the creds file {} (--nats-creds): {e}",
                        path.display()
                    )
                })?;
                // Parse it now, so that a bad file is refused before anything connects.
                async_nats::ConnectOptions::new()
                    .credentials(&text)
                    .map_err(|_| creds_unreadable(&path))?;
                Some(Credentials::Creds {
                    path,
                    contents: Secret(text),
                })
            }
            (None, None, None, None, None) => None,
        };

        let ca_file = self.ca_file.clone().or_else(|| env_path(CA_FILE_ENV));
        let cert = self
            .client_cert
            .clone()
            .or_else(|| env_path(CLIENT_CERT_ENV));
        let key = self.client_key.clone().or_else(|| env_path(CLIENT_KEY_ENV));
        let client = match (cert, key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            (Some(_), None) => {
                return Err(format!(
                    "--nats-client-cert needs its private key: --nats-client-key (or {CLIENT_KEY_ENV})"
                ))
            }
            (None, Some(_)) => {
                return Err(format!(
                    "--nats-client-key needs its certificate: --nats-client-cert (or {CLIENT_CERT_ENV})"
                ))
            }
        };
        if let Some(ca) = &ca_file {
            pem_file(ca, "--nats-ca-file", "CERTIFICATE")?;
        }
        if let Some((cert, key)) = &client {
            pem_file(cert, "--nats-client-cert", "CERTIFICATE")?;
            pem_file(key, "--nats-client-key", "PRIVATE KEY")?;
        }
        let required = self.require_tls
            || match env(REQUIRE_TLS_ENV).map(|v| v.trim().to_ascii_lowercase()) {
                None => false,
                Some(v) if matches!(v.as_str(), "" | "0" | "false" | "no") => false,
                Some(v) if matches!(v.as_str(), "1" | "true" | "yes") => true,
                Some(_) => {
                    return Err(format!(
                        "{REQUIRE_TLS_ENV} must be 1, true or yes (or 0, false, no)"
                    ))
                }
            };
        Ok(NatsAuth {
            credentials,
            tls: TlsSettings {
                ca_file,
                client,
                required,
            },
        })
    }
}

/// The secret in `file`, else in the environment variable's value `from_env`; `None` when
/// neither is given. Surrounding whitespace (a file's last newline) is not part of it.
fn secret(
    file: Option<&Path>,
    from_env: Option<String>,
    flag: &str,
) -> Result<Option<Secret>, String> {
    match (file, from_env) {
        (Some(file), _) => {
            let text = std::fs::read_to_string(file)
                .map_err(|e| format!("cannot read {} ({flag}): {e}", file.display()))?;
            let text = text.trim();
            if text.is_empty() {
                return Err(format!("{} ({flag}) is empty", file.display()));
            }
            Ok(Some(Secret(text.to_owned())))
        }
        (None, Some(value)) => Ok(Some(Secret(value.trim().to_owned()))),
        (None, None) => Ok(None),
    }
}

/// The public key of a user nkey seed, or why it is not one (never quoting it).
fn nkey_public(seed: &str, file: Option<&Path>) -> Result<String, String> {
    let from = match file {
        Some(f) => format!("{} (--nats-nkey-seed-file)", f.display()),
        None => NKEY_SEED_ENV.to_owned(),
    };
    let pair = nkeys::KeyPair::from_seed(seed).map_err(|_| {
        format!("the nkey seed in {from} is not a valid nkey seed (a user seed starts with SU)")
    })?;
    if pair.key_pair_type() != nkeys::KeyPairType::User {
        return Err(format!(
            "the nkey seed in {from} is not a user's (a user seed starts with SU)"
        ));
    }
    Ok(pair.public_key())
}

/// Checks that `path` can be read and holds a PEM block of `label` (e.g. `CERTIFICATE`, or
/// any `… PRIVATE KEY`), without saying anything of its contents.
fn pem_file(path: &Path, flag: &str, label: &str) -> Result<(), String> {
    let text =
        std::fs::read(path).map_err(|e| format!("cannot read {} ({flag}): {e}", path.display()))?;
    let text = String::from_utf8_lossy(&text);
    let found = text.lines().any(|line| {
        line.strip_prefix("-----BEGIN ")
            .and_then(|rest| rest.strip_suffix("-----"))
            .is_some_and(|l| l.ends_with(label))
    });
    if found {
        Ok(())
    } else {
        Err(format!(
            "{} ({flag}) holds no PEM {label} (-----BEGIN …{label}-----)",
            path.display()
        ))
    }
}

/// Refuses a `--cluster` URL (one or several, comma-separated) that carries credentials
/// before an `@`: a secret on the command line is readable by every user of the host. The
/// message says where they go instead, and does not quote the URL.
pub fn check_cluster_url(urls: &str) -> Result<(), String> {
    if urls.split(',').any(|u| userinfo(u.trim()).is_some()) {
        return Err(format!(
            "the --cluster URL carries credentials (user:password@ or token@ before the host), \
             which the gateway never takes from the command line: give the URL without them, the \
             user with --nats-user and the password in a file (--nats-password-file) or in \
             {PASSWORD_ENV}; a token goes in --nats-token-file or {TOKEN_ENV}"
        ));
    }
    Ok(())
}

/// The URL(s) with any credentials replaced by `***`, for messages.
pub fn redact_url(urls: &str) -> String {
    urls.split(',')
        .map(|u| {
            let u = u.trim();
            match userinfo(u) {
                Some((start, end)) => format!("{}***{}", &u[..start], &u[end..]),
                None => u.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Where the userinfo of `url` is (byte range, without the `@`), if it has one.
fn userinfo(url: &str) -> Option<(usize, usize)> {
    let start = url.find("://").map_or(0, |i| i + 3);
    let authority_end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    let at = url[start..authority_end].rfind('@')?;
    Some((start, start + at))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn temp_file(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("nats-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn urls_with_credentials_are_refused_without_being_quoted() {
        for url in [
            "nats://gw:s3cret-pass@127.0.0.1:4222",
            "tls://s3cret-token@nats.example:4222",
            "127.0.0.1:4222,nats://gw:s3cret-pass@10.0.0.2:4222",
            "gw:s3cret-pass@127.0.0.1:4222",
        ] {
            let e = check_cluster_url(url).unwrap_err();
            assert!(!e.contains("s3cret"), "{e}");
            assert!(e.contains("--nats-password-file"), "{e}");
            assert!(!redact_url(url).contains("s3cret"), "{}", redact_url(url));
        }
        for url in [
            "nats://127.0.0.1:4222",
            "tls://nats.example:4222,nats://10.0.0.2",
            "127.0.0.1:4222",
        ] {
            check_cluster_url(url).unwrap();
            assert_eq!(redact_url(url), url);
        }
        assert_eq!(
            redact_url("nats://gw:pw@127.0.0.1:4222"),
            "nats://***@127.0.0.1:4222"
        );
    }

    #[test]
    fn a_password_comes_from_its_file_or_the_environment_and_is_never_shown() {
        let file = temp_file("password", "s3cret-pass\n");
        let flags = NatsAuthFlags {
            user: Some("r1".into()),
            password_file: Some(file),
            ..Default::default()
        };
        let auth = flags.resolve(&no_env).unwrap();
        assert_eq!(
            auth.credentials,
            Some(Credentials::UserPassword {
                user: "r1".into(),
                password: Secret::new("s3cret-pass")
            })
        );
        assert!(!format!("{auth:?}").contains("s3cret"), "{auth:?}");
        assert!(!auth.describe().contains("s3cret"));
        assert!(!format!("{flags:?}").contains("s3cret"));
        let env = |k: &str| match k {
            USER_ENV => Some("r2".to_owned()),
            PASSWORD_ENV => Some("from-env".to_owned()),
            _ => None,
        };
        let auth = NatsAuthFlags::default().resolve(&env).unwrap();
        assert_eq!(
            auth.credentials,
            Some(Credentials::UserPassword {
                user: "r2".into(),
                password: Secret::new("from-env")
            })
        );
    }

    #[test]
    fn half_a_pair_or_two_methods_are_refused() {
        let user_only = NatsAuthFlags {
            user: Some("r1".into()),
            ..Default::default()
        };
        assert!(user_only.resolve(&no_env).unwrap_err().contains("password"));
        let password_only = |k: &str| (k == PASSWORD_ENV).then(|| "s3cret".to_owned());
        let e = NatsAuthFlags::default()
            .resolve(&password_only)
            .unwrap_err();
        assert!(e.contains("--nats-user") && !e.contains("s3cret"), "{e}");
        let two = |k: &str| match k {
            TOKEN_ENV => Some("s3cret-token".to_owned()),
            CREDS_ENV => Some("/nowhere.creds".to_owned()),
            _ => None,
        };
        let e = NatsAuthFlags::default().resolve(&two).unwrap_err();
        assert!(e.contains("more than one") && !e.contains("s3cret"), "{e}");
        let cert_only = NatsAuthFlags {
            client_cert: Some("/nowhere.pem".into()),
            ..Default::default()
        };
        assert!(cert_only
            .resolve(&no_env)
            .unwrap_err()
            .contains("--nats-client-key"));
    }

    #[test]
    fn an_nkey_seed_is_checked_and_only_its_public_key_is_shown() {
        let pair = nkeys::KeyPair::new_user();
        let seed = pair.seed().unwrap();
        let file = temp_file("seed", &format!("{seed}\n"));
        let flags = NatsAuthFlags {
            nkey_seed_file: Some(file.clone()),
            ..Default::default()
        };
        let auth = flags.resolve(&no_env).unwrap();
        assert_eq!(
            auth.credentials,
            Some(Credentials::Nkey {
                seed: Secret::new(seed.clone()),
                public: pair.public_key()
            })
        );
        assert!(auth.describe().contains(&pair.public_key()));
        assert!(!format!("{auth:?}").contains(&seed));
        // Not a seed, and an account's seed: refused without quoting.
        let bad = "SUNOTASEEDATALLBUTLONGENOUGHTOLOOKLIKEONEXXXXXXXXXXXXXXXX";
        std::fs::write(&file, bad).unwrap();
        let e = flags.resolve(&no_env).unwrap_err();
        assert!(
            e.contains("not a valid nkey seed") && !e.contains(bad),
            "{e}"
        );
        let account = nkeys::KeyPair::new_account().seed().unwrap();
        std::fs::write(&file, &account).unwrap();
        let e = flags.resolve(&no_env).unwrap_err();
        assert!(e.contains("not a user's") && !e.contains(&account), "{e}");
    }

    #[test]
    fn a_creds_file_must_hold_a_jwt_and_a_seed() {
        let file = temp_file("bad.creds", "SUSOMETHINGSECRET\n");
        let flags = NatsAuthFlags {
            creds: Some(file),
            ..Default::default()
        };
        let e = flags.resolve(&no_env).unwrap_err();
        assert!(
            e.contains("creds format") && !e.contains("SUSOMETHING"),
            "{e}"
        );
    }

    #[test]
    fn tls_files_are_checked_and_either_implies_tls() {
        let ca = temp_file(
            "ca.pem",
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        );
        let key = temp_file(
            "key.pem",
            "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n",
        );
        let flags = NatsAuthFlags {
            ca_file: Some(ca.clone()),
            ..Default::default()
        };
        assert!(flags.resolve(&no_env).unwrap().tls.is_required());
        let swapped = NatsAuthFlags {
            client_cert: Some(key.clone()),
            client_key: Some(ca.clone()),
            ..Default::default()
        };
        let e = swapped.resolve(&no_env).unwrap_err();
        assert!(e.contains("holds no PEM CERTIFICATE"), "{e}");
        let mtls = NatsAuthFlags {
            client_cert: Some(ca),
            client_key: Some(key),
            ..Default::default()
        };
        let auth = mtls.resolve(&no_env).unwrap();
        assert!(auth.tls.is_required());
        assert!(
            auth.describe().contains("mutual TLS"),
            "{}",
            auth.describe()
        );
        let env = |k: &str| (k == REQUIRE_TLS_ENV).then(|| "true".to_owned());
        assert!(NatsAuthFlags::default().resolve(&env).unwrap().tls.required);
        let env = |k: &str| (k == REQUIRE_TLS_ENV).then(|| "maybe".to_owned());
        assert!(NatsAuthFlags::default().resolve(&env).is_err());
        assert!(!NatsAuthFlags::default()
            .resolve(&no_env)
            .unwrap()
            .tls
            .is_required());
    }
}

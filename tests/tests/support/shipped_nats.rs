//! The shipped `examples/nats-server.conf`, run as it is: mutual TLS in which a client's
//! certificate is its NATS user, with a CA, a server certificate and client certificates made
//! here for each run (nothing committed expires), in the server's working directory where the
//! file names them.
//!
//! Included with `#[path = "support/shipped_nats.rs"] mod shipped_nats;`, beside
//! `support/nats.rs` as `mod nats` and `support/processes.rs` as `mod processes`.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};

use crate::nats::NatsServer;
use crate::processes::{self, Launch};

/// A certificate authority of the test's own.
pub struct Ca {
    pub cert_pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca {
            cert_pem: cert.pem(),
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// A certificate for `names` (DNS names or IP addresses) and its key, in PEM.
    pub fn issue(&self, names: &[&str], usage: rcgen::ExtendedKeyUsagePurpose) -> (String, String) {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = rcgen::CertificateParams::new(names.clone()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, names[0].clone());
        params.extended_key_usages = vec![usage];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// Writes the CA and a server certificate for loopback into `dir/tls/` under the names
    /// `examples/nats-server.conf` uses.
    pub fn write_server_files(&self, dir: &Path) {
        let tls = dir.join("tls");
        std::fs::create_dir_all(&tls).unwrap();
        let (cert, key) = self.issue(
            &["localhost", "127.0.0.1"],
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        );
        std::fs::write(tls.join("ca.pem"), &self.cert_pem).unwrap();
        std::fs::write(tls.join("nats-server.pem"), cert).unwrap();
        std::fs::write(tls.join("nats-server-key.pem"), key).unwrap();
    }

    /// A client certificate for `name` written into `dir` as NAME.pem and NAME-key.pem.
    pub fn write_client(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = self.issue(&[name], rcgen::ExtendedKeyUsagePurpose::ClientAuth);
        let (c, k) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}-key.pem")),
        );
        std::fs::write(&c, cert).unwrap();
        std::fs::write(&k, key).unwrap();
        (c, k)
    }
}

/// nats-server running the shipped configuration, and the CA that signed its certificate and
/// the client certificates of its users.
pub struct ShippedNats {
    pub nats: NatsServer,
    pub ca: Ca,
    /// The CA certificate, for clients to check the server's.
    pub ca_file: PathBuf,
    clients: PathBuf,
}

impl ShippedNats {
    /// Starts the shipped configuration with a client certificate for each of `users` (the
    /// file's users are the replicas `r1`, `r2` and `r3`); `None` when nats-server is skipped.
    pub async fn start(users: &[&str]) -> Option<ShippedNats> {
        let ca = Ca::new("mcp-gateway cluster CA");
        let dir = processes::scratch("shipped-nats");
        ca.write_server_files(&dir);
        let clients = dir.join("clients");
        std::fs::create_dir_all(&clients).unwrap();
        for user in users {
            ca.write_client(&clients, user);
        }
        let shipped =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/nats-server.conf");
        let nats = NatsServer::start_with_config(&shipped, dir).await?;
        let ca_file = nats.dir().join("tls/ca.pem");
        Some(ShippedNats {
            nats,
            ca,
            ca_file,
            clients,
        })
    }

    /// `user`'s client certificate and key.
    pub fn client(&self, user: &str) -> (PathBuf, PathBuf) {
        let (c, k) = (
            self.clients.join(format!("{user}.pem")),
            self.clients.join(format!("{user}-key.pem")),
        );
        assert!(c.exists(), "no client certificate was made for {user}");
        (c, k)
    }

    /// How a replica joins as `user`: the CA file and `user`'s certificate, as flags.
    pub fn replica_launch(&self, user: &str) -> Launch {
        let (cert, key) = self.client(user);
        Launch {
            args: [
                "--nats-ca-file".into(),
                self.ca_file.clone().into_os_string(),
                "--nats-client-cert".into(),
                cert.into_os_string(),
                "--nats-client-key".into(),
                key.into_os_string(),
            ]
            .into(),
            ..Launch::default()
        }
    }

    /// A plain NATS client logged in with `user`'s certificate, its reply subjects under
    /// `inbox_prefix`, and the errors the server sends it (a refused publish or subscription:
    /// nats-server reports them asynchronously).
    pub async fn client_as(
        &self,
        user: &str,
        inbox_prefix: &str,
    ) -> (
        async_nats::Client,
        tokio::sync::mpsc::UnboundedReceiver<String>,
    ) {
        let (cert, key) = self.client(user);
        let (refusals_tx, refusals) = tokio::sync::mpsc::unbounded_channel();
        let client = async_nats::ConnectOptions::new()
            .custom_inbox_prefix(inbox_prefix)
            .add_root_certificates(self.ca_file.clone())
            .add_client_certificate(cert, key)
            .require_tls(true)
            .event_callback(move |event| {
                let tx = refusals_tx.clone();
                async move {
                    if let async_nats::Event::ServerError(e) = event {
                        let _ = tx.send(e.to_string());
                    }
                }
            })
            .connect(self.nats.url())
            .await
            .unwrap();
        (client, refusals)
    }
}

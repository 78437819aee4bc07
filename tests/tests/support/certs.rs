//! Certificate authorities and certificates made at run time with `rcgen`, written as PEM files
//! for the processes under test: nothing committed expires.
//!
//! Included with `#[path = "support/certs.rs"] mod certs;`.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};

/// A CA of the test's own.
pub struct TestCa {
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

/// A server certificate and its key, as PEM and as the DER a TLS client sees.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: Vec<u8>,
}

impl TestCa {
    /// A new CA named `name`.
    pub fn new(name: &str) -> TestCa {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = rcgen::KeyPair::generate().expect("a CA key");
        TestCa {
            issuer: rcgen::CertifiedIssuer::self_signed(params, key).expect("a CA certificate"),
        }
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// Writes the CA certificate to `dir/name` and returns the path.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, self.pem()).expect("the CA file can be written");
        path
    }

    /// A server certificate for `names` (DNS names or IP addresses), with common name `cn`.
    pub fn issue(&self, cn: &str, names: &[&str]) -> Leaf {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = rcgen::CertificateParams::new(names).expect("leaf params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().expect("a leaf key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("a leaf certificate");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }
}

impl Leaf {
    /// Writes the certificate and key over `cert` and `key`.
    pub fn write(&self, cert: &Path, key: &Path) {
        std::fs::write(cert, &self.cert_pem).expect("the certificate can be written");
        std::fs::write(key, &self.key_pem).expect("the key can be written");
    }
}

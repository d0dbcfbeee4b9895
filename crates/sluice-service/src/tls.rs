//! TLS for both planes, the servers' side: a certificate chain and key (`--tls-cert`,
//! `--tls-key`), for tonic's gRPC server and the TCP data plane's tokio-rustls acceptor.
//! (Clients check them against a CA: `sluice_client::tls::ClientTls`.)

use std::path::PathBuf;
use std::sync::Arc;

use sluice_client::tls::{provider, read_pem};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Identity, ServerTlsConfig};

use crate::error::ServiceError;

/// A server's certificate chain and private key, PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// What a server needs to speak TLS on both planes.
#[derive(Clone)]
pub struct ServerTls {
    pub grpc: ServerTlsConfig,
    pub data: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerTls")
    }
}

impl ServerTls {
    pub fn load(files: &TlsFiles) -> Result<Self, ServiceError> {
        let cert_pem = read_pem(&files.cert, "TLS certificate").map_err(ServiceError::Tls)?;
        let key_pem = read_pem(&files.key, "TLS key").map_err(ServiceError::Tls)?;
        let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut cert_pem.as_slice())
            .collect::<Result<_, _>>()
            .map_err(|e| ServiceError::Tls(format!("{}: {e}", files.cert.display())))?;
        if certs.is_empty() {
            return Err(ServiceError::Tls(format!("{} holds no PEM certificate", files.cert.display())));
        }
        let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut key_pem.as_slice())
            .map_err(|e| ServiceError::Tls(format!("{}: {e}", files.key.display())))?
            .ok_or_else(|| ServiceError::Tls(format!("{} holds no PEM private key", files.key.display())))?;
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| ServiceError::Tls(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| ServiceError::Tls(format!("{} and {}: {e}", files.cert.display(), files.key.display())))?;
        Ok(Self {
            grpc: ServerTlsConfig::new().identity(Identity::from_pem(cert_pem, key_pem)),
            data: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_certificate_gets_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let e = ServerTls::load(&TlsFiles { cert: dir.path().join("nope.pem"), key: empty }).unwrap_err().to_string();
        assert!(e.contains("cannot read the TLS certificate"), "{e}");
    }
}

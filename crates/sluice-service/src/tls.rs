//! TLS (rustls, ring) for both planes, enabled by flags: servers take a certificate chain
//! and key (`--tls-cert`, `--tls-key`), clients the CA that signed them (`--tls-ca`,
//! `SLUICE_TLS_CA`). gRPC control uses tonic's TLS; the TCP data plane wraps its sockets
//! with tokio-rustls. Without the flags both planes stay plain TCP, as on loopback.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

use crate::error::ServiceError;

/// A server's certificate chain and private key, PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, ServiceError> {
    std::fs::read(path).map_err(|e| ServiceError::Tls(format!("cannot read the {what} {}: {e}", path.display())))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
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
        let cert_pem = read(&files.cert, "TLS certificate")?;
        let key_pem = read(&files.key, "TLS key")?;
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

/// What a client needs to check a server's certificate: the CA (PEM) that signed it.
#[derive(Clone)]
pub struct ClientTls {
    ca_pem: Vec<u8>,
    connector: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls")
    }
}

impl ClientTls {
    pub fn load(ca: &Path) -> Result<Self, ServiceError> {
        let ca_pem = read(ca, "TLS CA certificate")?;
        let mut roots = rustls::RootCertStore::empty();
        let mut n = 0;
        for cert in rustls_pemfile::certs(&mut ca_pem.as_slice()) {
            let cert = cert.map_err(|e| ServiceError::Tls(format!("{}: {e}", ca.display())))?;
            roots.add(cert).map_err(|e| ServiceError::Tls(format!("{}: {e}", ca.display())))?;
            n += 1;
        }
        if n == 0 {
            return Err(ServiceError::Tls(format!("{} holds no PEM certificate", ca.display())));
        }
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| ServiceError::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Self { ca_pem, connector: tokio_rustls::TlsConnector::from(Arc::new(config)) })
    }

    /// tonic's client config for a server at `addr` (`host:port`).
    pub fn grpc(&self, addr: &str) -> ClientTlsConfig {
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca_pem)).domain_name(host(addr))
    }

    /// Opens TLS over `sock` to the data plane at `addr`, checking its certificate.
    pub async fn connect<S>(&self, addr: &str, sock: S) -> std::io::Result<tokio_rustls::client::TlsStream<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let name = ServerName::try_from(host(addr).to_string()).map_err(|e| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("server name of {addr}: {e}"))
        })?;
        self.connector.connect(name, sock).await
    }
}

/// The host of `host:port`, `[v6]:port` or `scheme://host:port`.
fn host(addr: &str) -> &str {
    let a = addr.split_once("://").map_or(addr, |(_, rest)| rest);
    let a = a.split('/').next().unwrap_or(a);
    if let Some(rest) = a.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    a.rsplit_once(':').map_or(a, |(h, _)| h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_is_taken_from_every_address_form() {
        assert_eq!(host("127.0.0.1:7070"), "127.0.0.1");
        assert_eq!(host("https://dispatcher.ns.svc:7070"), "dispatcher.ns.svc");
        assert_eq!(host("[::1]:7070"), "::1");
        assert_eq!(host("localhost"), "localhost");
    }

    #[test]
    fn missing_or_empty_pem_files_get_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let e = ClientTls::load(&empty).unwrap_err().to_string();
        assert!(e.contains("no PEM certificate"), "{e}");
        let e = ServerTls::load(&TlsFiles { cert: dir.path().join("nope.pem"), key: empty }).unwrap_err().to_string();
        assert!(e.contains("cannot read the TLS certificate"), "{e}");
    }
}

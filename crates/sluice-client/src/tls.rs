//! TLS (rustls, ring) for both planes, the client's side: [`ClientTls`] checks the
//! servers' certificates against the CA that signed them (`--tls-ca`, `SLUICE_TLS_CA`).
//! gRPC control uses tonic's TLS; the TCP data plane wraps its sockets with tokio-rustls.
//! Without a CA both planes stay plain TCP, as on loopback. (The servers' side, their
//! certificate and key, is `sluice_service`'s.)

use std::path::Path;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::ServerName;
use tonic::transport::{Certificate, ClientTlsConfig};

use crate::error::ClientError;

/// Reads a PEM file; `what` names it in the error.
pub fn read_pem(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read the {what} {}: {e}", path.display()))
}

/// The crypto both sides use (ring).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
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
    pub fn load(ca: &Path) -> Result<Self, ClientError> {
        let ca_pem = read_pem(ca, "TLS CA certificate").map_err(ClientError::Tls)?;
        let mut roots = rustls::RootCertStore::empty();
        let mut n = 0;
        for cert in rustls_pemfile::certs(&mut ca_pem.as_slice()) {
            let cert = cert.map_err(|e| ClientError::Tls(format!("{}: {e}", ca.display())))?;
            roots.add(cert).map_err(|e| ClientError::Tls(format!("{}: {e}", ca.display())))?;
            n += 1;
        }
        if n == 0 {
            return Err(ClientError::Tls(format!("{} holds no PEM certificate", ca.display())));
        }
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| ClientError::Tls(e.to_string()))?
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
        let e = ClientTls::load(&dir.path().join("nope.pem")).unwrap_err().to_string();
        assert!(e.contains("cannot read the TLS CA certificate"), "{e}");
    }
}

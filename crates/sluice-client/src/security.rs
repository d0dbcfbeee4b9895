//! The client's side of the service's security: [`TokenAttach`] adds the service's token
//! to every RPC, [`ClientSecret`] is what proves a client is the one its (public) id names,
//! for the calls on its leases ([`secret_digest`] is how the dispatcher checks it), and
//! [`constant_time_eq`] compares tokens without leaking how much of one matched.

use subtle::ConstantTimeEq;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::error::ClientError;

/// A client's secret and the public id derived from it. The id (shown on `/metrics`,
/// `/api/state` and in logs) is `LABEL#` and the first 16 bytes of the secret's SHA-256 in
/// hex: anyone may read it, only the holder of the secret can make a call in its name
/// (take or renew its leases, acknowledge or hand back its tasks). The dispatcher keeps
/// nothing: it checks each call's secret against the id (the dispatcher's `check_client`, through [`secret_digest`]), the same after
/// a restart.
#[derive(Clone)]
pub struct ClientSecret {
    secret: String,
    id: String,
}

impl ClientSecret {
    /// A fresh random secret (32 bytes from the operating system), its id starting with `label`.
    pub fn generate(label: &str) -> Result<Self, ClientError> {
        let secret = random_token()?;
        let id = format!("{label}#{}", secret_digest(&secret));
        Ok(Self { secret, id })
    }

    /// The public id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// What the client sends with every call in its name (`client_secret`).
    pub fn secret(&self) -> &str {
        &self.secret
    }
}

/// 32 random bytes from the operating system, in hex: a client's secret, or the operator
/// token `sluice up` makes when given none.
pub fn random_token() -> Result<String, ClientError> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new().fill(&mut bytes).map_err(|_| ClientError::NoRandomness)?;
    Ok(hex(&bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The public part of `secret`: the first 16 bytes of its SHA-256, in hex (what a
/// [`ClientSecret`]'s id ends in, after `#`).
pub fn secret_digest(secret: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, secret.as_bytes());
    hex(&d.as_ref()[..16])
}
/// Compares in constant time (`subtle`), so timing does not reveal how much of a token matched.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.ct_eq(b).into()
}

/// The client side: adds the token to every outgoing RPC.
#[derive(Clone)]
pub struct TokenAttach {
    header: Option<MetadataValue<tonic::metadata::Ascii>>,
}

impl TokenAttach {
    pub fn new(token: Option<&str>) -> Result<Self, ClientError> {
        let header = match token.filter(|t| !t.is_empty()) {
            None => None,
            Some(t) => Some(
                format!("Bearer {t}")
                    .parse()
                    .map_err(|_| ClientError::InvalidArgument("the token must be printable ASCII".into()))?,
            ),
        };
        Ok(Self { header })
    }
}

impl Interceptor for TokenAttach {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(h) = &self.header {
            req.metadata_mut().insert("authorization", h.clone());
        }
        Ok(req)
    }
}

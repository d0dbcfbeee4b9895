//! The collaborative cache's data plane: each learner serves the samples placed on it to
//! its peers, and asks the owner of a sample it must load but does not cache before
//! reading storage. It runs on the peer transport (`sluice_transport`): one framing,
//! the job's token checked first (constant time), capped connections and a pre-auth
//! deadline on the server, size-capped replies checked against this learner's own
//! decode limits, and back-off from a peer that failed. The bodies are
//! [`sluice_transport::messages::locality`].
//!
//! A peer that is gone, refuses, or does not answer within the timeout is skipped (and
//! not asked again for a second), so a step never waits on it longer than that.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::{Limits, LocalitySpec};
use sluice_transport::messages::{self, locality};
use sluice_transport::{Client, ClientConfig, Server, ServerLimits, Token};

use crate::cache::CachedData;

pub use sluice_transport::{TransportError as PeerError, TOKEN_ENV};

/// How long a failed peer is left alone before it is asked again.
const BACKOFF: Duration = Duration::from_secs(1);
/// Where a locality token is configured, for errors.
const TOKEN_FIELD: &str = "locality.token";

/// The job's token for its locality peers: the spec's, else `SLUICE_PEER_TOKEN`.
pub fn token(spec: &LocalitySpec) -> Result<Token, PeerError> {
    Token::resolve(spec.token.as_ref().map(|t| t.expose()), TOKEN_FIELD)
}

/// A learner's connections to its peers.
pub struct PeerClient {
    client: Client,
    limits: Limits,
}

impl PeerClient {
    /// Peers at `addrs`; replies are held to `limits` (the loader's own decode limits).
    pub fn new(addrs: Vec<String>, token: Token, timeout: Duration, limits: Limits) -> Self {
        let config = ClientConfig { timeout, backoff: BACKOFF };
        Self { client: Client::new(addrs, locality::PROTOCOL, token, config), limits }
    }

    /// Asks `peer` for manifest position `pos`; `Ok(None)` if it has nothing for it.
    pub fn fetch(&self, peer: usize, pos: u32) -> Result<Option<CachedData>, PeerError> {
        let max = locality::max_reply(&self.limits);
        let received =
            self.client.call(peer, &messages::encode_u32(pos), max, |body| locality::decode(body, &self.limits))?;
        Ok(match received {
            locality::Received::None => None,
            locality::Received::Raw(bytes) => Some(CachedData::Raw(bytes)),
            locality::Received::Decoded(img) => Some(CachedData::Decoded(img, None, None)),
            locality::Received::Resized(img) => Some(CachedData::Resized(img, None, None)),
        })
    }
}

/// What a peer server answers with: the sample at a manifest position, if it has it.
pub type Serve = Arc<dyn Fn(u32) -> Option<Arc<CachedData>> + Send + Sync>;

/// A learner's server for its peers; stops (and closes its connections) when dropped.
pub struct PeerServer(Server);

impl PeerServer {
    /// Listens on `addr` and answers every authenticated request with `serve`.
    pub fn start(addr: &str, token: Token, serve: Serve) -> Result<Self, PeerError> {
        let limits = ServerLimits { max_request: 4, ..ServerLimits::default() };
        let handler: sluice_transport::Handler = Arc::new(move |body: &[u8]| {
            let pos = messages::decode_u32(body).map_err(|e| e.to_string())?;
            let data = serve(pos);
            Ok(locality::encode(match data.as_deref() {
                Some(CachedData::Raw(bytes)) => locality::Reply::Raw(bytes),
                // The peer protocol carries pixels only: a sample with boxes or a mask is not
                // served from a pixel entry (the asking learner reads it from storage instead).
                Some(d) if d.keeps_records() => locality::Reply::None,
                Some(CachedData::Decoded(img, ..)) => locality::Reply::Decoded(img),
                Some(CachedData::Resized(img, ..)) => locality::Reply::Resized(img),
                None => locality::Reply::None,
            }))
        });
        Server::start(addr, locality::PROTOCOL, token, limits, handler).map(Self)
    }

    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.0.local_addr()
    }

    /// Connections open now (each holds a thread; the server caps them).
    pub fn connections(&self) -> usize {
        self.0.connections()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Instant;

    use super::*;

    #[test]
    fn a_served_sample_comes_back_and_a_dead_peer_fails_fast() {
        let token = Token::new("t0k3n", "test").unwrap();
        let serve: Serve = Arc::new(|pos| (pos == 7).then(|| Arc::new(CachedData::Raw(vec![7; 3]))));
        let server = PeerServer::start("127.0.0.1:0", token.clone(), serve).unwrap();
        let addr = server.local_addr().to_string();
        let client = PeerClient::new(vec![addr.clone(), addr], token, Duration::from_millis(300), Limits::default());
        assert_eq!(client.fetch(0, 7).ok().flatten(), Some(CachedData::Raw(vec![7; 3])));
        assert_eq!(client.fetch(0, 8).ok().flatten(), None);
        drop(server);
        std::thread::sleep(Duration::from_millis(300));
        let t = Instant::now();
        assert!(client.fetch(1, 7).is_err(), "a stopped server must not answer");
        assert!(matches!(client.fetch(1, 7), Err(PeerError::BackingOff { peer: 1, .. })));
        assert!(t.elapsed() < Duration::from_millis(900), "{:?}", t.elapsed());
    }
}

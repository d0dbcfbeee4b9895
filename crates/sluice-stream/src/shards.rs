//! The distributed rehearsal buffer. Each learner holds a shard (its own buffer) and
//! serves it to its peers over TCP; rehearsal samples are drawn uniformly from the global
//! buffer (every shard), the remote ones prefetched from the peers in the background so a
//! step never waits on the network. A draw that falls on a peer whose samples have not
//! arrived takes a local sample instead (counted).
//!
//! It runs on the peer transport (`sluice_transport`): the job's token checked first
//! (constant time), capped connections and a pre-auth deadline on the server, replies
//! bounded in size and time, back-off from a peer that failed. The bodies are
//! [`sluice_transport::messages::rehearsal`]: a request is how many samples; a reply the
//! shard's length and up to that many samples (id, label, encoded image), distinct, drawn
//! uniformly from the shard.
//!
//! What a peer sends is checked (frame size, sample count, image sizes, shard length): a
//! bad reply is an error naming the peer, logged and counted, and the peer is left alone
//! for a while.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use sluice_core::{SampleKey, SampleRng};
use sluice_transport::messages::{self, rehearsal};
use sluice_transport::{Client, ClientConfig, Server, ServerLimits, Token, TransportError};

use crate::error::StreamError;
use crate::rehearsal::{Rehearsal, Stored};
use crate::spec::RehearsalSpec;

/// One learner's shard, shared between its loader and the thread serving it.
pub type Shard = Arc<Mutex<Rehearsal>>;

/// Connecting to, and waiting for, a peer.
const TIMEOUT: Duration = Duration::from_secs(1);
/// How long a failed peer is left alone before it is asked again.
const BACKOFF: Duration = Duration::from_millis(250);
/// How often idle fetchers check whether they should stop.
const POLL: Duration = Duration::from_millis(50);
/// Where a rehearsal token is configured, for errors.
const TOKEN_FIELD: &str = "rehearsal.token";

/// The job's token for its rehearsal peers: the spec's, else `SLUICE_PEER_TOKEN`.
pub fn token(spec: &RehearsalSpec) -> Result<Token, StreamError> {
    Token::resolve(spec.token.as_ref().map(|t| t.expose()), TOKEN_FIELD).map_err(|e| match e {
        TransportError::NoToken { field } | TransportError::BadToken { field, .. } => {
            StreamError::Config { field, problem: e.to_string() }
        }
        other => StreamError::Config { field: TOKEN_FIELD, problem: other.to_string() },
    })
}

/// The reply to a request for `n` samples of `shard`, drawn with `rng`.
fn encode_reply(shard: &Shard, n: usize, rng: &mut SampleRng) -> Vec<u8> {
    let (len, picked): (u64, Vec<Arc<Stored>>) = {
        let shard = shard.lock();
        let items = shard.items();
        let picks = crate::rehearsal::distinct(items.len(), n, rng);
        (items.len() as u64, picks.into_iter().map(|i| Arc::clone(&items[i])).collect())
    };
    rehearsal::encode(len, picked.iter().map(|s| (s.id, s.label, s.image.as_slice())))
}

/// Serves this learner's shard to its peers until dropped.
pub struct ShardServer(Server);

impl ShardServer {
    /// Listens on `addr` (this learner's entry in the peer list) for peers with `token`.
    pub fn start(addr: &str, token: Token, shard: Shard, seed: u64) -> Result<Self, StreamError> {
        let served = AtomicU64::new(0);
        let handler: sluice_transport::Handler = Arc::new(move |body: &[u8]| {
            let n = messages::decode_u32(body).map_err(|e| e.to_string())?.min(rehearsal::MAX_ASK) as usize;
            let round = served.fetch_add(1, Ordering::Relaxed);
            let mut rng = SampleRng::new(seed, round, SampleKey(u64::MAX), 0x7065_6572);
            Ok(encode_reply(&shard, n, &mut rng))
        });
        let limits = ServerLimits { max_request: 4, ..ServerLimits::default() };
        Server::start(addr, rehearsal::PROTOCOL, token, limits, handler).map(Self).map_err(|e| match e {
            TransportError::Listen { addr, source } => StreamError::RehearsalListen { addr, source },
            other => StreamError::RehearsalListen { addr: addr.to_string(), source: std::io::Error::other(other) },
        })
    }

    /// Connections open now (each holds a thread; the server caps them).
    pub fn connections(&self) -> usize {
        self.0.connections()
    }
}

/// What has been fetched from one peer.
#[derive(Default)]
struct Pool {
    /// The peer's shard length, as of its last reply (0 while it does not answer).
    len: u64,
    ready: VecDeque<Stored>,
}

struct Fetched {
    pools: Mutex<Vec<Pool>>,
    /// Wakes the fetchers when samples were taken.
    taken: Condvar,
    stop: AtomicBool,
    errors: AtomicU64,
}

/// Keeps `want` samples of each peer's shard ready, fetched in the background.
pub struct PeerFetcher {
    /// Peer index (this learner excluded) to its rank in the peer list.
    ranks: Vec<usize>,
    fetched: Arc<Fetched>,
}

impl PeerFetcher {
    /// Starts one background thread per peer other than `rank`.
    pub fn start(
        peers: &[String],
        rank: usize,
        token: Token,
        want: usize,
        max_image: u64,
    ) -> Result<Self, StreamError> {
        let ranks: Vec<usize> = (0..peers.len()).filter(|&r| r != rank).collect();
        let fetched = Arc::new(Fetched {
            pools: Mutex::new(ranks.iter().map(|_| Pool::default()).collect()),
            taken: Condvar::new(),
            stop: AtomicBool::new(false),
            errors: AtomicU64::new(0),
        });
        let config = ClientConfig { timeout: TIMEOUT, backoff: BACKOFF };
        let client = Arc::new(Client::new(peers.to_vec(), rehearsal::PROTOCOL, token, config));
        for (i, &r) in ranks.iter().enumerate() {
            let (fetched, client) = (Arc::clone(&fetched), Arc::clone(&client));
            std::thread::Builder::new()
                .name(format!("rehearsal-fetch-{r}"))
                .spawn(move || fetch_loop(&fetched, &client, i, r, want.max(1), max_image))
                .map_err(|source| StreamError::RehearsalListen { addr: peers[r].clone(), source })?;
        }
        Ok(Self { ranks, fetched })
    }

    /// Each peer's shard length as last reported (0 for a peer that does not answer).
    pub fn lens(&self) -> Vec<u64> {
        self.fetched.pools.lock().iter().map(|p| p.len).collect()
    }

    /// Up to `n` prefetched samples of peer `i` (an index into [`PeerFetcher::lens`]).
    pub fn take(&self, i: usize, n: usize) -> Vec<Stored> {
        let mut pools = self.fetched.pools.lock();
        let Some(pool) = pools.get_mut(i) else { return Vec::new() };
        let k = n.min(pool.ready.len());
        let got = pool.ready.drain(..k).collect();
        drop(pools);
        self.fetched.taken.notify_all();
        got
    }

    /// Samples fetched and not drawn yet, all peers together.
    pub fn ready(&self) -> u64 {
        self.fetched.pools.lock().iter().map(|p| p.ready.len() as u64).sum()
    }

    /// Failed requests to peers so far.
    pub fn errors(&self) -> u64 {
        self.fetched.errors.load(Ordering::Relaxed)
    }

    /// The rank in the peer list of peer `i`.
    pub fn rank_of(&self, i: usize) -> Option<usize> {
        self.ranks.get(i).copied()
    }
}

impl Drop for PeerFetcher {
    fn drop(&mut self) {
        // The threads notice within a poll or a peer timeout; nothing waits on them.
        self.fetched.stop.store(true, Ordering::Relaxed);
        self.fetched.taken.notify_all();
    }
}

/// One peer's fetcher: tops its pool up to `want` samples, backing off after a failure.
fn fetch_loop(fetched: &Fetched, client: &Client, i: usize, rank: usize, want: usize, max_image: u64) {
    while !fetched.stop.load(Ordering::Relaxed) {
        let missing = {
            let mut pools = fetched.pools.lock();
            let have = pools.get(i).map_or(want, |p| p.ready.len());
            if have >= want {
                fetched.taken.wait_for(&mut pools, POLL);
                continue;
            }
            want - have
        };
        let ask = u32::try_from(missing).unwrap_or(u32::MAX).min(rehearsal::MAX_ASK);
        let max_reply = rehearsal::max_reply(ask, max_image);
        let reply =
            client.call(rank, &messages::encode_u32(ask), max_reply, |body| rehearsal::decode(body, ask, max_image));
        match reply {
            Ok((len, samples)) => {
                let mut pools = fetched.pools.lock();
                if let Some(p) = pools.get_mut(i) {
                    p.len = len;
                    p.ready.extend(samples.into_iter().map(|s| Stored { id: s.id, label: s.label, image: s.image }));
                }
                if len == 0 {
                    // An empty shard: ask again a little later.
                    drop(pools);
                    std::thread::sleep(POLL);
                }
            }
            Err(e) => {
                if !matches!(e, TransportError::BackingOff { .. }) {
                    tracing::warn!(error = %e, "rehearsal peer unavailable; drawing locally meanwhile");
                    fetched.errors.fetch_add(1, Ordering::Relaxed);
                }
                if let Some(p) = fetched.pools.lock().get_mut(i) {
                    p.len = 0;
                }
                std::thread::sleep(BACKOFF);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Instant;

    use super::*;

    fn token() -> Token {
        Token::new("shards-test", "test").unwrap()
    }

    #[test]
    fn a_shard_is_fetched_and_an_oversized_reply_counts_as_an_error() {
        let mut rehearsal = Rehearsal::new(crate::rehearsal::RehearsalPolicy::Reservoir, 8, 1);
        for id in 0..8 {
            rehearsal.offer(&crate::entry::Sample { entry: format!("{id}-0"), id, label: 1, image: vec![3; 10] });
        }
        let server = ShardServer::start("127.0.0.1:0", token(), Arc::new(Mutex::new(rehearsal)), 5).unwrap();
        let addr = server.0.local_addr().to_string();
        // A peer with the token whose replies are larger than any reply to the request.
        let liar: sluice_transport::Handler = Arc::new(|_: &[u8]| Ok(vec![0; 1 << 16]));
        let limits = ServerLimits { max_request: 4, ..ServerLimits::default() };
        let liar = Server::start("127.0.0.1:0", rehearsal::PROTOCOL, token(), limits, liar).unwrap();
        let peers = ["127.0.0.1:9".to_string(), addr, liar.local_addr().to_string()];
        let fetcher = PeerFetcher::start(&peers, 0, token(), 4, 1000).unwrap();
        let t = Instant::now();
        while fetcher.ready() < 4 || fetcher.errors() == 0 {
            assert!(t.elapsed() < Duration::from_secs(10), "ready {}, errors {}", fetcher.ready(), fetcher.errors());
            std::thread::sleep(POLL);
        }
        assert_eq!(fetcher.lens(), [8, 0]);
        assert!(fetcher.take(0, 4).iter().all(|s| s.image == [3; 10] && s.label == 1));
    }

    #[test]
    fn a_spec_without_a_token_is_refused_naming_the_field() {
        if std::env::var_os(sluice_transport::TOKEN_ENV).is_some() {
            return; // the environment supplies one
        }
        let spec = RehearsalSpec {
            capacity: 4,
            policy: Default::default(),
            dir: "unused".into(),
            peers: vec!["127.0.0.1:1".into()],
            rank: 0,
            token: None,
            persist: false,
        };
        let err = super::token(&spec).unwrap_err().to_string();
        assert!(err.contains("rehearsal.token") && err.contains("SLUICE_PEER_TOKEN"), "{err}");
    }
}

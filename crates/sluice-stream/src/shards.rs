//! The distributed rehearsal buffer. Each learner holds a shard (its own buffer) and
//! serves it to its peers over TCP; rehearsal samples are drawn uniformly from the global
//! buffer (every shard), the remote ones prefetched from the peers in the background so a
//! step never waits on the network. A draw that falls on a peer whose samples have not
//! arrived takes a local sample instead (counted).
//!
//! A frame is a little-endian `u32` length, then the body (as in the locality peers):
//!
//! * request: `u32` how many samples;
//! * reply: `u64` the shard's length, then per sample `u64` id, `i64` label, `u32` image
//!   length and the encoded image bytes: up to the number asked, distinct, drawn uniformly
//!   from the shard.
//!
//! What a peer sends is checked (frame size, sample count, image sizes): a bad reply is an
//! error naming the peer, logged and counted, and the peer is left alone for a while.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use sluice_core::{SampleKey, SampleRng};

use crate::error::StreamError;
use crate::rehearsal::{Rehearsal, Stored};

/// One learner's shard, shared between its loader and the thread serving it.
pub type Shard = Arc<Mutex<Rehearsal>>;

/// Most samples one request may ask for.
const MAX_ASK: u32 = 1024;
/// Largest frame accepted either way.
const MAX_FRAME: u64 = 1 << 30;
/// Bytes of a reply besides the images: the shard length, and per sample id, label, length.
const HEADER: u64 = 8;
const PER_SAMPLE: u64 = 8 + 8 + 4;
/// Connecting to, and waiting for, a peer.
const TIMEOUT: Duration = Duration::from_secs(1);
/// How long a failed peer is left alone before it is asked again.
const BACKOFF: Duration = Duration::from_millis(250);
/// How often idle threads check whether they should stop.
const POLL: Duration = Duration::from_millis(50);

/// Why a peer's samples could not be had: logged and counted, the draw goes local.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("rehearsal peer {rank} ({addr}): {source}")]
    Io { rank: usize, addr: String, source: io::Error },
    #[error("rehearsal peer {rank} ({addr}) sent a malformed reply: {what}")]
    Malformed { rank: usize, addr: String, what: String },
}

fn write_frame(s: &mut TcpStream, body: &[u8]) -> io::Result<()> {
    let len = u32::try_from(body.len()).map_err(|_| io::Error::other("frame too large"))?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(body);
    s.write_all(&frame)
}

/// Reads a frame's length; `Ok(None)` if nothing arrived within the socket's timeout.
fn read_len(s: &mut TcpStream) -> io::Result<Option<u32>> {
    let mut len = [0u8; 4];
    match s.read(&mut len[..1]) {
        Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
        Ok(_) => {}
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => return Ok(None),
        Err(e) => return Err(e),
    }
    s.read_exact(&mut len[1..])?;
    Ok(Some(u32::from_le_bytes(len)))
}

/// The reply to a request for `n` samples of `shard`, drawn with `rng`.
fn encode_reply(shard: &Shard, n: usize, rng: &mut SampleRng) -> Vec<u8> {
    let (len, picked): (u64, Vec<Arc<Stored>>) = {
        let shard = shard.lock();
        let items = shard.items();
        let picks = crate::rehearsal::distinct(items.len(), n, rng);
        (items.len() as u64, picks.into_iter().map(|i| Arc::clone(&items[i])).collect())
    };
    encode_samples(len, &picked)
}

fn encode_samples(shard_len: u64, samples: &[Arc<Stored>]) -> Vec<u8> {
    let mut body = Vec::with_capacity(8 + samples.iter().map(|s| 20 + s.image.len()).sum::<usize>());
    body.extend_from_slice(&shard_len.to_le_bytes());
    for s in samples {
        body.extend_from_slice(&s.id.to_le_bytes());
        body.extend_from_slice(&s.label.to_le_bytes());
        body.extend_from_slice(&(s.image.len() as u32).to_le_bytes());
        body.extend_from_slice(&s.image);
    }
    body
}

/// Parses a reply to a request for `asked` samples: the shard's length and the samples.
fn decode_reply(body: &[u8], asked: u32, max_image: u64) -> Result<(u64, Vec<Stored>), String> {
    let word = |at: usize| -> Result<[u8; 8], String> {
        body.get(at..at + 8).and_then(|b| b.try_into().ok()).ok_or_else(|| format!("truncated at byte {at}"))
    };
    let shard_len = u64::from_le_bytes(word(0)?);
    let mut at = HEADER as usize;
    let mut samples = Vec::new();
    while at < body.len() {
        if samples.len() as u32 >= asked {
            return Err(format!("more than the {asked} samples asked for"));
        }
        let id = u64::from_le_bytes(word(at)?);
        let label = i64::from_le_bytes(word(at + 8)?);
        let len = body
            .get(at + 16..at + 20)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
            .ok_or_else(|| format!("sample {id}: truncated at byte {}", at + 16))?;
        if u64::from(len) > max_image {
            return Err(format!("sample {id}: an image of {len} bytes (at most {max_image})"));
        }
        if len == 0 {
            return Err(format!("sample {id}: an empty image"));
        }
        at += PER_SAMPLE as usize;
        let image = body
            .get(at..at + len as usize)
            .ok_or_else(|| format!("sample {id}: {len} image bytes announced, {} left", body.len() - at))?;
        at += len as usize;
        samples.push(Stored { id, label, image: image.to_vec() });
    }
    if samples.len() as u64 > shard_len {
        return Err(format!("{} samples from a shard of {shard_len}", samples.len()));
    }
    Ok((shard_len, samples))
}

/// Serves this learner's shard to its peers until dropped.
pub struct ShardServer {
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl ShardServer {
    /// Listens on `addr` (this learner's entry in the peer list).
    pub fn start(addr: &str, shard: Shard, seed: u64) -> Result<Self, StreamError> {
        let listen_err = |source| StreamError::RehearsalListen { addr: addr.to_string(), source };
        let listener = TcpListener::bind(addr).map_err(listen_err)?;
        listener.set_nonblocking(true).map_err(listen_err)?;
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicU64::new(0));
        let accept = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("rehearsal-serve".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        match listener.accept() {
                            Ok((conn, _)) => {
                                let (stop, shard, served) =
                                    (Arc::clone(&stop), Arc::clone(&shard), Arc::clone(&served));
                                let spawned = std::thread::Builder::new()
                                    .name("rehearsal-conn".into())
                                    .spawn(move || serve(conn, &shard, seed, &served, &stop));
                                if let Err(e) = spawned {
                                    tracing::warn!(error = %e, "cannot start a thread for a rehearsal peer");
                                }
                            }
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(POLL),
                            Err(e) => {
                                tracing::warn!(error = %e, "rehearsal shard server: accept failed");
                                std::thread::sleep(POLL);
                            }
                        }
                    }
                })
                .map_err(listen_err)?
        };
        Ok(Self { stop, accept: Some(accept) })
    }
}

impl Drop for ShardServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// Answers one peer's requests until it hangs up, sends a bad request, or the server stops.
fn serve(mut conn: TcpStream, shard: &Shard, seed: u64, served: &AtomicU64, stop: &AtomicBool) {
    let peer = conn.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let result = (|| -> io::Result<()> {
        conn.set_nonblocking(false)?;
        conn.set_read_timeout(Some(POLL))?;
        conn.set_write_timeout(Some(TIMEOUT))?;
        while !stop.load(Ordering::Relaxed) {
            let Some(len) = read_len(&mut conn)? else { continue };
            if len != 4 {
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a request of {len} bytes, not 4")));
            }
            let mut ask = [0u8; 4];
            conn.set_read_timeout(Some(TIMEOUT))?;
            conn.read_exact(&mut ask)?;
            conn.set_read_timeout(Some(POLL))?;
            let n = u32::from_le_bytes(ask).min(MAX_ASK) as usize;
            let round = served.fetch_add(1, Ordering::Relaxed);
            let mut rng = SampleRng::new(seed, round, SampleKey(u64::MAX), 0x7065_6572);
            write_frame(&mut conn, &encode_reply(shard, n, &mut rng))?;
        }
        Ok(())
    })();
    if let Err(e) = result {
        if e.kind() != io::ErrorKind::UnexpectedEof {
            tracing::debug!(peer, error = %e, "rehearsal peer connection closed");
        }
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
    pub fn start(peers: &[String], rank: usize, want: usize, max_image: u64) -> Result<Self, StreamError> {
        let ranks: Vec<usize> = (0..peers.len()).filter(|&r| r != rank).collect();
        let fetched = Arc::new(Fetched {
            pools: Mutex::new(ranks.iter().map(|_| Pool::default()).collect()),
            taken: Condvar::new(),
            stop: AtomicBool::new(false),
            errors: AtomicU64::new(0),
        });
        for (i, &r) in ranks.iter().enumerate() {
            let (fetched, addr) = (Arc::clone(&fetched), peers[r].clone());
            std::thread::Builder::new()
                .name(format!("rehearsal-fetch-{r}"))
                .spawn(move || fetch_loop(&fetched, i, r, &addr, want.max(1), max_image))
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
fn fetch_loop(fetched: &Fetched, i: usize, rank: usize, addr: &str, want: usize, max_image: u64) {
    let mut conn: Option<TcpStream> = None;
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
        let ask = (missing as u32).min(MAX_ASK);
        match fetch(&mut conn, rank, addr, ask, max_image) {
            Ok((len, samples)) => {
                let mut pools = fetched.pools.lock();
                if let Some(p) = pools.get_mut(i) {
                    p.len = len;
                    p.ready.extend(samples);
                }
                if len == 0 {
                    // An empty shard: ask again a little later.
                    drop(pools);
                    std::thread::sleep(POLL);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "rehearsal peer unavailable; drawing locally meanwhile");
                fetched.errors.fetch_add(1, Ordering::Relaxed);
                if let Some(p) = fetched.pools.lock().get_mut(i) {
                    p.len = 0;
                }
                std::thread::sleep(BACKOFF);
            }
        }
    }
}

/// One request to peer `rank`, on `conn` (connected first if need be).
fn fetch(
    conn: &mut Option<TcpStream>,
    rank: usize,
    addr: &str,
    ask: u32,
    max_image: u64,
) -> Result<(u64, Vec<Stored>), PeerError> {
    let io_err = |source| PeerError::Io { rank, addr: addr.to_string(), source };
    let malformed = |what: String| PeerError::Malformed { rank, addr: addr.to_string(), what };
    // The connection goes back for the next request only after a good reply.
    let mut s = match conn.take() {
        Some(s) => s,
        None => connect(addr).map_err(io_err)?,
    };
    write_frame(&mut s, &ask.to_le_bytes()).map_err(io_err)?;
    let mut len = [0u8; 4];
    s.read_exact(&mut len).map_err(io_err)?;
    let len = u64::from(u32::from_le_bytes(len));
    let cap = (HEADER + u64::from(ask) * (PER_SAMPLE + max_image)).min(MAX_FRAME);
    if len > cap {
        return Err(malformed(format!("a reply of {len} bytes for {ask} samples (at most {cap})")));
    }
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body).map_err(io_err)?;
    let reply = decode_reply(&body, ask, max_image).map_err(malformed)?;
    *conn = Some(s);
    Ok(reply)
}

fn connect(addr: &str) -> io::Result<TcpStream> {
    let sock: SocketAddr = addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "the address resolves to nothing"))?;
    let s = TcpStream::connect_timeout(&sock, TIMEOUT)?;
    s.set_read_timeout(Some(TIMEOUT))?;
    s.set_write_timeout(Some(TIMEOUT))?;
    s.set_nodelay(true)?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn replies_round_trip_and_bad_ones_are_refused() {
        let samples: Vec<Arc<Stored>> =
            (0..3).map(|id| Arc::new(Stored { id, label: id as i64 - 1, image: vec![7; 5 + id as usize] })).collect();
        let body = encode_samples(40, &samples);
        let (len, back) = decode_reply(&body, 3, 100).unwrap();
        assert_eq!(len, 40);
        assert_eq!(
            back.iter().map(|s| (s.id, s.label, s.image.len())).collect::<Vec<_>>(),
            [(0, -1, 5), (1, 0, 6), (2, 1, 7)]
        );
        assert!(decode_reply(&body, 2, 100).unwrap_err().contains("more than the 2 samples asked for"));
        assert!(decode_reply(&body, 3, 6).unwrap_err().contains("sample 2: an image of 7 bytes (at most 6)"));
        assert!(decode_reply(&body[..body.len() - 1], 3, 100).unwrap_err().contains("7 image bytes announced, 6 left"));
        assert!(decode_reply(&encode_samples(1, &samples), 3, 100)
            .unwrap_err()
            .contains("3 samples from a shard of 1"));
    }

    #[test]
    fn an_oversized_reply_is_an_error_naming_the_peer() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let liar = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().unwrap();
            let mut req = [0u8; 8];
            c.read_exact(&mut req).unwrap();
            c.write_all(&u32::MAX.to_le_bytes()).unwrap();
        });
        let err = fetch(&mut None, 2, &addr, 4, 1000).unwrap_err().to_string();
        liar.join().unwrap();
        assert!(
            err.starts_with(&format!("rehearsal peer 2 ({addr}) sent a malformed reply: a reply of 4294967295")),
            "{err}"
        );
    }
}

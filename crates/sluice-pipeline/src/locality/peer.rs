//! The collaborative cache's data plane: each learner serves the samples placed on it to
//! its peers over TCP, and asks the owner of a sample it must load but does not cache
//! before reading storage. A frame is a little-endian `u32` length, then the body:
//!
//! * request: `u32` manifest position;
//! * reply: `u8` kind (0 none, 1 raw bytes, 2 decoded, 3 resized), then for images `u32`
//!   width and `u32` height, then the bytes (RGB8 HWC pixels for images).
//!
//! A peer that is gone, refuses, or does not answer within the timeout is skipped (and
//! not asked again for a second), so a step never waits on it longer than that.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sluice_core::{Image, Pixels};

use crate::cache::CachedData;

/// Largest reply body a learner accepts: far above any decoded training image.
const MAX_FRAME: u32 = 1 << 30;
/// How long a failed peer is left alone before it is asked again.
const BACKOFF: Duration = Duration::from_secs(1);
/// How often the accept loop checks whether it should stop.
const ACCEPT_POLL: Duration = Duration::from_millis(50);

/// Why a peer could not be used: the caller falls back to storage either way.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("peer {peer} ({addr}): {source}")]
    Io { peer: usize, addr: String, source: io::Error },
    #[error("peer {peer} ({addr}) sent a malformed reply: {what}")]
    Malformed { peer: usize, addr: String, what: String },
    #[error("peer {peer} is backing off after a failure")]
    BackingOff { peer: usize },
    #[error("no address for peer {peer}")]
    NoAddress { peer: usize },
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: String, source: io::Error },
}

fn encode(data: Option<&CachedData>) -> Vec<u8> {
    let mut body = Vec::new();
    match data {
        Some(CachedData::Raw(bytes)) => {
            body.push(1);
            body.extend_from_slice(bytes);
        }
        Some(CachedData::Decoded(img) | CachedData::Resized(img)) if matches!(img.pixels, Pixels::U8(_)) => {
            body.push(if matches!(data, Some(CachedData::Decoded(_))) { 2 } else { 3 });
            body.extend_from_slice(&img.width.to_le_bytes());
            body.extend_from_slice(&img.height.to_le_bytes());
            body.extend_from_slice(img.as_bytes());
        }
        _ => body.push(0),
    }
    body
}

fn decode(body: &[u8]) -> Result<Option<CachedData>, String> {
    let (&kind, rest) = body.split_first().ok_or("an empty reply")?;
    let image = |rest: &[u8]| -> Result<Image, String> {
        if rest.len() < 8 {
            return Err("an image reply without its size".into());
        }
        let w = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
        let h = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        let px = &rest[8..];
        if w as usize * h as usize * Image::CHANNELS != px.len() {
            return Err(format!("a {w}x{h} image with {} bytes of pixels", px.len()));
        }
        Ok(Image::rgb8(w, h, px.to_vec()))
    };
    Ok(match kind {
        0 => None,
        1 => Some(CachedData::Raw(rest.to_vec())),
        2 => Some(CachedData::Decoded(image(rest)?)),
        3 => Some(CachedData::Resized(image(rest)?)),
        k => return Err(format!("unknown reply kind {k}")),
    })
}

fn write_frame(s: &mut TcpStream, body: &[u8]) -> io::Result<()> {
    let len = u32::try_from(body.len()).map_err(|_| io::Error::other("frame too large"))?;
    s.write_all(&len.to_le_bytes())?;
    s.write_all(body)
}

fn read_frame(s: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len);
    if len > MAX_FRAME {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a frame of {len} bytes")));
    }
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body)?;
    Ok(body)
}

/// A learner's connections to its peers.
pub struct PeerClient {
    addrs: Vec<String>,
    timeout: Duration,
    /// Idle connections by peer.
    idle: Mutex<HashMap<usize, Vec<TcpStream>>>,
    /// Peers not to ask until the given time.
    down: Mutex<HashMap<usize, Instant>>,
}

impl PeerClient {
    pub fn new(addrs: Vec<String>, timeout: Duration) -> Self {
        Self { addrs, timeout, idle: Mutex::new(HashMap::new()), down: Mutex::new(HashMap::new()) }
    }

    /// Asks `peer` for manifest position `pos`; `Ok(None)` if it has nothing for it.
    pub fn fetch(&self, peer: usize, pos: u32) -> Result<Option<CachedData>, PeerError> {
        if self.down.lock().get(&peer).is_some_and(|until| Instant::now() < *until) {
            return Err(PeerError::BackingOff { peer });
        }
        let addr = self.addrs.get(peer).ok_or(PeerError::NoAddress { peer })?;
        let io_err = |source| PeerError::Io { peer, addr: addr.clone(), source };
        let result = (|| {
            let mut stream = match self.idle.lock().get_mut(&peer).and_then(Vec::pop) {
                Some(s) => s,
                None => self.connect(addr).map_err(io_err)?,
            };
            write_frame(&mut stream, &pos.to_le_bytes()).map_err(io_err)?;
            let body = read_frame(&mut stream).map_err(io_err)?;
            let data = decode(&body).map_err(|what| PeerError::Malformed { peer, addr: addr.clone(), what })?;
            self.idle.lock().entry(peer).or_default().push(stream);
            Ok(data)
        })();
        if result.is_err() {
            self.down.lock().insert(peer, Instant::now() + BACKOFF);
        }
        result
    }

    fn connect(&self, addr: &str) -> io::Result<TcpStream> {
        let sock: SocketAddr = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "the address resolves to nothing"))?;
        let s = TcpStream::connect_timeout(&sock, self.timeout)?;
        s.set_read_timeout(Some(self.timeout))?;
        s.set_write_timeout(Some(self.timeout))?;
        s.set_nodelay(true)?;
        Ok(s)
    }
}

/// What a peer server answers with: the sample at a manifest position, if it has it.
pub type Serve = Arc<dyn Fn(u32) -> Option<Arc<CachedData>> + Send + Sync>;

/// A learner's server for its peers; stops (and closes its connections) when dropped.
pub struct PeerServer {
    stop: Arc<AtomicBool>,
    addr: SocketAddr,
}

impl PeerServer {
    /// Listens on `addr` and answers every request with `serve`, one thread per peer.
    pub fn start(addr: &str, serve: Serve) -> Result<Self, PeerError> {
        let listen_err = |source| PeerError::Listen { addr: addr.to_string(), source };
        let listener = TcpListener::bind(addr).map_err(listen_err)?;
        listener.set_nonblocking(true).map_err(listen_err)?;
        let local = listener.local_addr().map_err(listen_err)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        std::thread::Builder::new()
            .name("sluice-peer-accept".into())
            .spawn(move || accept_loop(listener, serve, flag))
            .map_err(listen_err)?;
        Ok(Self { stop, addr: local })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for PeerServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn accept_loop(listener: TcpListener, serve: Serve, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                let (serve, stop) = (serve.clone(), stop.clone());
                let spawned = std::thread::Builder::new()
                    .name("sluice-peer-serve".into())
                    .spawn(move || serve_connection(stream, serve, stop));
                if let Err(e) = spawned {
                    tracing::warn!(error = %e, "peer server: cannot start a connection thread");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_POLL),
            Err(e) => {
                tracing::warn!(error = %e, "peer server: accept failed");
                std::thread::sleep(ACCEPT_POLL);
            }
        }
    }
}

fn serve_connection(mut stream: TcpStream, serve: Serve, stop: Arc<AtomicBool>) {
    // Reads wake up now and then so a stopped server lets go of its connections.
    if stream.set_nonblocking(false).and_then(|_| stream.set_read_timeout(Some(ACCEPT_POLL * 4))).is_err() {
        return;
    }
    while !stop.load(Ordering::SeqCst) {
        let body = match read_frame(&mut stream) {
            Ok(b) => b,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => continue,
            Err(_) => return,
        };
        let Ok(pos) = <[u8; 4]>::try_from(body.as_slice()).map(u32::from_le_bytes) else {
            return;
        };
        let data = serve(pos);
        if write_frame(&mut stream, &encode(data.as_deref())).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_round_trip_and_malformed_ones_are_refused() {
        let img = Image::rgb8(2, 1, vec![1, 2, 3, 4, 5, 6]);
        for d in [CachedData::Raw(vec![9, 8]), CachedData::Decoded(img.clone()), CachedData::Resized(img)] {
            assert_eq!(decode(&encode(Some(&d))).unwrap_or_else(|e| panic!("{e}")), Some(d));
        }
        assert_eq!(decode(&encode(None)), Ok(None));
        assert!(decode(&[2, 2, 0, 0, 0, 1, 0, 0, 0, 7]).is_err_and(|e| e.contains("2x1")));
        assert!(decode(&[]).is_err());
        assert!(decode(&[9]).is_err());
    }

    #[test]
    fn a_served_sample_comes_back_and_a_dead_peer_fails_fast() {
        let serve: Serve = Arc::new(|pos| (pos == 7).then(|| Arc::new(CachedData::Raw(vec![7; 3]))));
        let server = PeerServer::start("127.0.0.1:0", serve).unwrap_or_else(|e| panic!("{e}"));
        let addr = server.local_addr().to_string();
        let client = PeerClient::new(vec![addr.clone(), addr], Duration::from_millis(300));
        assert_eq!(client.fetch(0, 7).ok().flatten(), Some(CachedData::Raw(vec![7; 3])));
        assert_eq!(client.fetch(0, 8).ok().flatten(), None);
        drop(server);
        std::thread::sleep(ACCEPT_POLL * 6);
        let t = Instant::now();
        assert!(client.fetch(1, 7).is_err(), "a stopped server must not answer");
        assert!(matches!(client.fetch(1, 7), Err(PeerError::BackingOff { peer: 1 })));
        assert!(t.elapsed() < Duration::from_millis(900), "{:?}", t.elapsed());
    }
}

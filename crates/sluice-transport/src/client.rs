//! A learner's connections to its peers: authenticated once, kept open between requests,
//! every reply bounded in size and time, and a peer that failed left alone for a while.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::auth::{self, Token};
use crate::frame::{self, Deadline, FrameError};
use crate::messages::Malformed;
use crate::TransportError;

/// How a client treats its peers.
#[derive(Debug, Clone, Copy)]
pub struct ClientConfig {
    /// Connecting, and waiting for a whole reply.
    pub timeout: Duration,
    /// How long a failed peer is not asked again.
    pub backoff: Duration,
}

/// Connections to the peers of one protocol, by index in the peer list.
pub struct Client {
    addrs: Vec<String>,
    protocol: &'static str,
    token: Token,
    config: ClientConfig,
    /// Idle, authenticated connections by peer.
    idle: Mutex<HashMap<usize, Vec<TcpStream>>>,
    /// Peers not to ask until the given time.
    down: Mutex<HashMap<usize, Instant>>,
}

impl Client {
    pub fn new(addrs: Vec<String>, protocol: &'static str, token: Token, config: ClientConfig) -> Self {
        Self { addrs, protocol, token, config, idle: Mutex::new(HashMap::new()), down: Mutex::new(HashMap::new()) }
    }

    pub fn addr(&self, peer: usize) -> Option<&str> {
        self.addrs.get(peer).map(String::as_str)
    }

    /// Sends `request` to `peer` and parses its reply (at most `max_reply` bytes) with
    /// `parse`. Any failure, a malformed reply included, puts the peer in back-off.
    pub fn call<T>(
        &self,
        peer: usize,
        request: &[u8],
        max_reply: u32,
        parse: impl FnOnce(&[u8]) -> Result<T, Malformed>,
    ) -> Result<T, TransportError> {
        let addr = self.addrs.get(peer).ok_or(TransportError::NoAddress { peer })?;
        if self.down.lock().get(&peer).is_some_and(|until| Instant::now() < *until) {
            return Err(TransportError::BackingOff { peer, addr: addr.clone() });
        }
        let result = self.exchange(peer, addr, request, max_reply).and_then(|(stream, body)| {
            let parsed = parse(&body).map_err(|what| TransportError::Malformed { peer, addr: addr.clone(), what })?;
            // The connection goes back for the next request only after a good reply.
            self.idle.lock().entry(peer).or_default().push(stream);
            Ok(parsed)
        });
        if result.is_err() {
            self.down.lock().insert(peer, Instant::now() + self.config.backoff);
        }
        result
    }

    /// One request and its reply; a kept connection the peer has closed (it closes idle
    /// ones) is replaced by a new one. A peer that is slow is not asked twice.
    fn exchange(
        &self,
        peer: usize,
        addr: &str,
        request: &[u8],
        max_reply: u32,
    ) -> Result<(TcpStream, Vec<u8>), TransportError> {
        let kept = self.idle.lock().get_mut(&peer).and_then(Vec::pop);
        let reply = match kept {
            Some(mut s) => match self.round_trip(&mut s, request, max_reply) {
                Err(FrameError::Io(e)) if closed(&e) => None,
                reply => Some(reply.map(|body| (s, body))),
            },
            None => None,
        };
        let reply = match reply {
            Some(reply) => reply,
            None => {
                let mut s = self.connect(peer, addr)?;
                self.round_trip(&mut s, request, max_reply).map(|body| (s, body))
            }
        };
        reply.map_err(|e| match e {
            FrameError::TooLarge { len, max } => TransportError::TooLarge { peer, addr: addr.to_string(), len, max },
            FrameError::Io(source) => TransportError::Io { peer, addr: addr.to_string(), source },
        })
    }

    fn round_trip(&self, s: &mut TcpStream, request: &[u8], max_reply: u32) -> Result<Vec<u8>, FrameError> {
        frame::write_frame(s, request)?;
        frame::read_frame(&mut Deadline::after(s, self.config.timeout), max_reply)
    }

    /// A new connection to `addr`, authenticated.
    fn connect(&self, peer: usize, addr: &str) -> Result<TcpStream, TransportError> {
        let io_err = |source| TransportError::Io { peer, addr: addr.to_string(), source };
        let sock: SocketAddr = addr
            .to_socket_addrs()
            .map_err(io_err)?
            .next()
            .ok_or_else(|| io_err(io::Error::new(io::ErrorKind::NotFound, "the address resolves to nothing")))?;
        let mut s = TcpStream::connect_timeout(&sock, self.config.timeout).map_err(io_err)?;
        s.set_write_timeout(Some(self.config.timeout)).map_err(io_err)?;
        s.set_nodelay(true).map_err(io_err)?;
        frame::write_frame(&mut s, &auth::hello(self.protocol, &self.token)).map_err(io_err)?;
        let answer =
            frame::read_frame(&mut Deadline::after(&s, self.config.timeout), auth::MAX_HELLO).map_err(|e| match e {
                FrameError::Io(source) => io_err(source),
                FrameError::TooLarge { len, max } => {
                    TransportError::TooLarge { peer, addr: addr.to_string(), len, max }
                }
            })?;
        auth::read_answer(&answer).map_err(|reason| TransportError::Refused {
            peer,
            addr: addr.to_string(),
            reason,
        })?;
        Ok(s)
    }
}

/// Whether an error says the other end closed the connection.
fn closed(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    )
}

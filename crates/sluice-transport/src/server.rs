//! A peer server: authenticates each connection, then answers its request frames with
//! a [`Handler`], one thread per connection under a cap.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::auth::{self, Refusal, Token, MAX_HELLO};
use crate::frame::{self, Deadline, FrameError};
use crate::TransportError;

/// Answers one request body with a reply body; `Err` (a malformed request) closes the
/// connection.
pub type Handler = Arc<dyn Fn(&[u8]) -> Result<Vec<u8>, String> + Send + Sync>;

/// What a server grants its connections.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// Connections at most, authenticated or not (one thread each); more are refused.
    pub max_connections: usize,
    /// Connections at most that have not sent a valid hello yet; more are refused.
    pub max_pending: usize,
    /// Time a connection has to send its hello.
    pub auth_timeout: Duration,
    /// Time a request frame has to arrive once it started, and a reply to be written.
    pub request_timeout: Duration,
    /// An authenticated connection that sends nothing this long is closed.
    pub idle_timeout: Duration,
    /// Largest request body.
    pub max_request: u32,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            max_connections: 256,
            max_pending: 32,
            auth_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            max_request: 64,
        }
    }
}

/// How often idle threads check whether the server stopped.
const POLL: Duration = Duration::from_millis(50);

#[derive(Default)]
struct Counts {
    /// Connections with a thread (authenticated or not).
    live: AtomicUsize,
    /// Of those, the ones that have not authenticated yet.
    pending: AtomicUsize,
    /// Connections turned away: over a cap, a bad hello, or too slow to send it.
    refused: AtomicU64,
}

/// A running server; stops when dropped (its connections close within a poll).
pub struct Server {
    stop: Arc<AtomicBool>,
    addr: SocketAddr,
    counts: Arc<Counts>,
    accept: Option<JoinHandle<()>>,
}

impl Server {
    /// Listens on `addr` for `protocol` clients that present `token`.
    pub fn start(
        addr: &str,
        protocol: &'static str,
        token: Token,
        limits: ServerLimits,
        handler: Handler,
    ) -> Result<Self, TransportError> {
        let listen_err = |source| TransportError::Listen { addr: addr.to_string(), source };
        // Blocking accepts (a flood drains at full speed); `Drop` wakes the loop to stop it.
        let listener = TcpListener::bind(addr).map_err(listen_err)?;
        let local = listener.local_addr().map_err(listen_err)?;
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Counts::default());
        let shared = Arc::new(Conn { protocol, token, limits, handler, stop: stop.clone(), counts: counts.clone() });
        let accept = std::thread::Builder::new()
            .name("sluice-peer-accept".into())
            .spawn(move || accept_loop(&listener, &shared))
            .map_err(listen_err)?;
        Ok(Self { stop, addr: local, counts, accept: Some(accept) })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections open now (each holds a thread).
    pub fn connections(&self) -> usize {
        self.counts.live.load(Ordering::Relaxed)
    }

    /// Connections turned away so far.
    pub fn refused(&self) -> u64 {
        self.counts.refused.load(Ordering::Relaxed)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept with a connection of our own.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        if TcpStream::connect_timeout(&wake, Duration::from_secs(1)).is_ok() {
            if let Some(t) = self.accept.take() {
                let _ = t.join();
            }
        } else {
            tracing::warn!(addr = %self.addr, "peer server: cannot wake its accept loop; left to the process's end");
        }
    }
}

/// What every connection thread of a server shares.
struct Conn {
    protocol: &'static str,
    token: Token,
    limits: ServerLimits,
    handler: Handler,
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
}

fn accept_loop(listener: &TcpListener, conn: &Arc<Conn>) {
    while !conn.stop.load(Ordering::SeqCst) {
        let (stream, peer) = match listener.accept() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, protocol = conn.protocol, "peer server: accept failed");
                std::thread::sleep(POLL);
                continue;
            }
        };
        if conn.stop.load(Ordering::SeqCst) {
            return;
        }
        let counts = &conn.counts;
        let (live, pending) = (counts.live.load(Ordering::SeqCst), counts.pending.load(Ordering::SeqCst));
        if live >= conn.limits.max_connections || pending >= conn.limits.max_pending {
            counts.refused.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, live, pending, protocol = conn.protocol, "peer server: at its cap; refused one");
            refuse(stream, &Refusal::Busy(live));
            continue;
        }
        counts.live.fetch_add(1, Ordering::SeqCst);
        counts.pending.fetch_add(1, Ordering::SeqCst);
        let shared = Arc::clone(conn);
        let spawned = std::thread::Builder::new().name("sluice-peer-conn".into()).spawn(move || {
            let _live = Release(&shared.counts.live);
            serve(stream, peer, &shared);
        });
        if let Err(e) = spawned {
            counts.live.fetch_sub(1, Ordering::SeqCst);
            counts.pending.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(error = %e, protocol = conn.protocol, "peer server: cannot start a connection thread");
        }
    }
}

/// Tells a client it is turned away, without waiting on it.
fn refuse(mut stream: TcpStream, why: &Refusal) {
    if stream.set_nonblocking(true).is_ok() {
        let _ = frame::write_frame(&mut stream, &auth::answer(&Err(why.clone())));
    }
}

/// Takes one off a count when dropped.
struct Release<'a>(&'a AtomicUsize);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn serve(mut stream: TcpStream, peer: SocketAddr, conn: &Conn) {
    let limits = &conn.limits;
    let authenticated = {
        let _pending = Release(&conn.counts.pending);
        authenticate(&mut stream, conn)
    };
    if let Err(e) = authenticated {
        conn.counts.refused.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(%peer, error = %e, protocol = conn.protocol, "peer server: refused a connection");
        return;
    }
    let result = (|| -> Result<(), FrameError> {
        stream.set_write_timeout(Some(limits.request_timeout))?;
        let mut idle_since = Instant::now();
        while !conn.stop.load(Ordering::Relaxed) {
            // Wait for a request's first byte a poll at a time, so a stopped server lets go.
            stream.set_read_timeout(Some(POLL))?;
            let mut first = [0u8; 1];
            match io::Read::read(&mut stream, &mut first) {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    if idle_since.elapsed() > limits.idle_timeout {
                        return Ok(());
                    }
                    continue;
                }
                Err(e) => return Err(e.into()),
            }
            let mut deadline = Deadline::after(&stream, limits.request_timeout);
            let mut rest = [0u8; 3];
            io::Read::read_exact(&mut deadline, &mut rest)?;
            let len = u32::from_le_bytes([first[0], rest[0], rest[1], rest[2]]);
            let body = frame::read_body(&mut deadline, len, limits.max_request)?;
            let reply = (conn.handler)(&body).map_err(|what| io::Error::new(io::ErrorKind::InvalidData, what))?;
            frame::write_frame(&mut stream, &reply)?;
            idle_since = Instant::now();
        }
        Ok(())
    })();
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, protocol = conn.protocol, "peer connection closed");
    }
}

/// Reads and checks the hello within the deadline, and answers it.
fn authenticate(stream: &mut TcpStream, conn: &Conn) -> Result<(), String> {
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    stream.set_write_timeout(Some(conn.limits.auth_timeout)).map_err(|e| e.to_string())?;
    let hello = frame::read_frame(&mut Deadline::after(stream, conn.limits.auth_timeout), MAX_HELLO)
        .map_err(|e| format!("hello: {e}"))?;
    let verdict = auth::check_hello(&hello, conn.protocol, &conn.token);
    let _ = frame::write_frame(stream, &auth::answer(&verdict));
    verdict.map_err(|r| r.to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::{Read, Write};

    use super::*;
    use crate::{Client, ClientConfig};

    const PROTOCOL: &str = "test/1";

    fn echo_server(limits: ServerLimits) -> Server {
        let token = Token::new("right", "test").unwrap();
        let handler: Handler = Arc::new(|body: &[u8]| match body {
            b"bad" => Err("a bad request".into()),
            _ => Ok(body.iter().rev().copied().collect()),
        });
        Server::start("127.0.0.1:0", PROTOCOL, token, limits, handler).unwrap()
    }

    fn client(server: &Server, token: &str) -> Client {
        let config = ClientConfig { timeout: Duration::from_millis(500), backoff: Duration::from_millis(200) };
        Client::new(vec![server.local_addr().to_string()], PROTOCOL, Token::new(token, "test").unwrap(), config)
    }

    /// Reads what the server sends until it closes (or 2 s pass, which fails the test).
    fn drain(mut s: TcpStream) -> Vec<u8> {
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut out = Vec::new();
        let read = s.read_to_end(&mut out);
        assert!(read.is_ok(), "the server neither answered nor closed: {read:?}");
        out
    }

    #[test]
    fn only_a_client_with_the_token_gets_answers() {
        let server = echo_server(ServerLimits::default());
        let good = client(&server, "right");
        assert_eq!(good.call(0, b"abc", 16, |b| Ok(b.to_vec())).unwrap(), b"cba");
        assert_eq!(good.call(0, b"xyz", 16, |b| Ok(b.to_vec())).unwrap(), b"zyx");

        let err = client(&server, "wrong").call(0, b"abc", 16, |b| Ok(b.to_vec())).unwrap_err().to_string();
        assert!(err.contains("refused the connection: wrong or missing token"), "{err}");

        // A request without a hello is taken for a bad hello: refused, nothing served.
        let mut raw = TcpStream::connect(server.local_addr()).unwrap();
        frame::write_frame(&mut raw, b"abc").unwrap();
        let out = drain(raw);
        assert_eq!(auth::read_answer(&out[4..]), Err("not a sluice peer hello".into()));

        // A request the handler refuses closes that connection; the client backs off.
        assert!(good.call(0, b"bad", 16, |b| Ok(b.to_vec())).is_err());
        assert!(matches!(good.call(0, b"abc", 16, |b| Ok(b.to_vec())), Err(TransportError::BackingOff { .. })));
    }

    #[test]
    fn an_idle_connection_is_closed_and_the_client_reconnects() {
        let limits = ServerLimits { idle_timeout: Duration::from_millis(200), ..ServerLimits::default() };
        let server = echo_server(limits);
        let c = client(&server, "right");
        assert_eq!(c.call(0, b"ab", 16, |b| Ok(b.to_vec())).unwrap(), b"ba");
        let t = Instant::now();
        while server.connections() > 0 {
            assert!(t.elapsed() < Duration::from_secs(2), "the idle connection stayed open");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(c.call(0, b"cd", 16, |b| Ok(b.to_vec())).unwrap(), b"dc", "a closed kept connection is replaced");
    }

    #[test]
    fn a_silent_connection_is_closed_at_the_auth_deadline() {
        let limits = ServerLimits { auth_timeout: Duration::from_millis(300), ..ServerLimits::default() };
        let server = echo_server(limits);
        let t = Instant::now();
        let mut slow = TcpStream::connect(server.local_addr()).unwrap();
        slow.write_all(&[200, 0]).unwrap(); // half a length, then nothing
        assert_eq!(drain(slow), b"");
        assert!(t.elapsed() < Duration::from_millis(1500), "{:?}", t.elapsed());
        assert_eq!(server.refused(), 1);
    }

    #[test]
    fn connections_past_the_caps_are_refused_without_a_thread() {
        let limits = ServerLimits { max_pending: 4, max_connections: 6, ..ServerLimits::default() };
        let server = echo_server(limits);
        let addr = server.local_addr();
        let good: Vec<Client> = (0..2).map(|_| client(&server, "right")).collect();
        for c in &good {
            c.call(0, b"ab", 16, |b| Ok(b.to_vec())).unwrap();
        }
        let silent: Vec<TcpStream> = (0..50).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let t = Instant::now();
        while server.refused() < 46 {
            assert!(t.elapsed() < Duration::from_secs(5), "refused {} of 50", server.refused());
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(server.connections(), 6, "2 authenticated, 4 waiting to");
        // The authenticated ones keep their connections.
        for c in &good {
            assert_eq!(c.call(0, b"ab", 16, |b| Ok(b.to_vec())).unwrap(), b"ba");
        }
        let err = client(&server, "right").call(0, b"ab", 16, |b| Ok(b.to_vec())).unwrap_err().to_string();
        assert!(err.contains("connections already; try again"), "{err}");
        drop(silent);
    }
}

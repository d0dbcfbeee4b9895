//! A hostile client of a peer server on the peer transport (`sluice-transport`): raw
//! frames, hellos with any protocol and token, and an attack that checks the server gives
//! nothing away.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A length-prefixed frame, as the peer transport writes one.
pub fn frame(body: &[u8]) -> Vec<u8> {
    [&(body.len() as u32).to_le_bytes()[..], body].concat()
}

/// The transport's hello frame for `protocol` with `token`.
pub fn hello(protocol: &str, token: &str) -> Vec<u8> {
    frame(&[b"SLPR1", &[protocol.len() as u8][..], protocol.as_bytes(), token.as_bytes()].concat())
}

/// Sends `bytes`, half-closes, and reads the answer to the end. The server must answer or
/// close within 10 s, and may answer only nothing, a refusal (`1` + reason) or the
/// acceptance (`0`) of a good hello: never data.
pub fn attack(addr: &str, what: &str, bytes: &[u8]) {
    let Ok(mut s) = TcpStream::connect(addr) else { return };
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut out = Vec::new();
    if let Err(e) = s.read_to_end(&mut out) {
        // A reset is a close (the server hung up on unread bytes); a timeout is not.
        let waited = matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut);
        assert!(!waited, "{what}: the server neither answered nor closed within 10 s");
    }
    let mut rest = &out[..];
    while rest.len() >= 4 {
        let len = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
        let body = &rest[4..(4 + len).min(rest.len())];
        assert!(
            body == [0] || body.first() == Some(&1),
            "{what}: the server answered with {} bytes starting {:?}: data",
            body.len(),
            &body[..body.len().min(12)]
        );
        rest = &rest[(4 + len).min(rest.len())..];
    }
}

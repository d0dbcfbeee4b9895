//! Loopback ports and plain HTTP for tests.

use std::net::TcpListener;
use std::time::Duration;

/// A free `127.0.0.1:PORT` (free when asked; a test binds it soon after).
pub fn free_addr() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// `k` distinct loopback addresses nobody listens on yet (all bound at once, then freed).
pub fn free_addrs(k: usize) -> Vec<String> {
    let ls: Vec<TcpListener> = (0..k).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    ls.iter().map(|l| l.local_addr().unwrap().to_string()).collect()
}

/// `GET path` from the HTTP server at `addr` over HTTP/1.0 (no chunked replies; the server
/// closes): the status code and the body, or `None` while nothing listens there.
pub fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).ok()?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).ok()?;
    let code = reply.split(' ').nth(1).and_then(|c| c.parse().ok())?;
    let (_, body) = reply.split_once("\r\n\r\n")?;
    Some((code, body.to_string()))
}

/// The port of a `host:port` address.
pub fn port_of(addr: &str) -> String {
    addr.rsplit(':').next().unwrap().to_string()
}

/// `GET /metrics` from `addr` (retried for 5 s while nothing listens there): the whole
/// response, headers included.
pub fn http_get(addr: &str) -> String {
    use std::io::{Read, Write};
    for _ in 0..100 {
        if let Ok(mut s) = std::net::TcpStream::connect(addr) {
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            let mut body = String::new();
            s.read_to_string(&mut body).unwrap();
            return body;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no metrics endpoint at {addr}");
}

/// The value of the first sample of metric `name` in a Prometheus text `text`.
pub fn metric_value(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

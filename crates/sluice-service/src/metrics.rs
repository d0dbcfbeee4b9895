//! Prometheus text exposition, hand-written: counters and gauges are rendered from the
//! live state on each scrape; request latency goes into a fixed-bucket histogram. Served
//! over plain HTTP/1.1 on `--metrics-port` at `/metrics`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::error::ServiceError;

const BUCKETS_S: [f64; 12] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0];

/// A latency histogram with Prometheus' cumulative buckets.
#[derive(Default)]
pub struct Histogram {
    buckets: [AtomicU64; 12],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        for (i, b) in BUCKETS_S.iter().enumerate() {
            if s <= *b {
                self.buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    pub fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, b) in BUCKETS_S.iter().enumerate() {
            let n = self.buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {n}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let braces = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
        let _ = writeln!(out, "{name}_sum{braces} {sum}\n{name}_count{braces} {count}");
    }
}

/// Appends one sample with its HELP/TYPE header.
pub fn metric(out: &mut String, name: &str, kind: &str, help: &str, value: f64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
}

/// Escapes a label value.
pub fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Binds `addr` and serves `render()` at `/metrics` until the runtime stops. Returns the
/// bound address.
pub async fn serve(addr: &str, render: Render) -> Result<std::net::SocketAddr, ServiceError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| ServiceError::Listen { addr: addr.to_string(), message: e.to_string() })?;
    let local =
        listener.local_addr().map_err(|e| ServiceError::Listen { addr: addr.to_string(), message: e.to_string() })?;
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else { continue };
            let render = render.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut n = 0;
                // Read the request head (bounded); the body, if any, is ignored.
                while n < buf.len() {
                    match tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf[n..])).await {
                        Ok(Ok(0)) | Err(_) | Ok(Err(_)) => break,
                        Ok(Ok(k)) => {
                            n += k;
                            if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                                break;
                            }
                        }
                    }
                }
                let head = String::from_utf8_lossy(&buf[..n]);
                let path = head.split_whitespace().nth(1).unwrap_or("");
                let (status, body) = if path == "/metrics" || path == "/" {
                    ("200 OK", render())
                } else {
                    ("404 Not Found", "not found; try /metrics\n".to_string())
                };
                let resp = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(50));
        h.observe(Duration::from_millis(3));
        let mut s = String::new();
        h.render(&mut s, "x_seconds", "test", "op=\"a\"");
        assert!(s.contains("x_seconds_bucket{op=\"a\",le=\"0.0001\"} 1"), "{s}");
        assert!(s.contains("x_seconds_bucket{op=\"a\",le=\"0.005\"} 2"), "{s}");
        assert!(s.contains("x_seconds_count{op=\"a\"} 2"), "{s}");
    }

    #[tokio::test]
    async fn serves_the_rendered_text_over_http() {
        let addr = serve("127.0.0.1:0", Arc::new(|| "up 1\n".to_string())).await.unwrap();
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).await.unwrap();
        assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
        assert!(body.ends_with("up 1\n"), "{body}");
    }
}

//! Metrics in the Prometheus/OpenMetrics text format, through `prometheus-client`, served
//! by axum at `/metrics`. Each scrape builds a [`Scrape`] from the live state (the
//! service's counters, gauges read under its locks, the latency histograms), so nothing
//! has to be kept in step between the state and a long-lived registry.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, StatusCode};
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::{EncodeCounterValue, EncodeGaugeValue, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Metric, Registry};
use tokio::net::TcpListener;

use crate::DashboardError;

const BUCKETS_S: [f64; 12] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0];

const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A request latency histogram (seconds, fixed buckets from 100 µs to 1 s).
#[derive(Debug, Clone)]
pub struct LatencyHistogram(Histogram);

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self(Histogram::new(BUCKETS_S))
    }
}

impl LatencyHistogram {
    pub fn observe(&self, d: Duration) {
        self.0.observe(d.as_secs_f64());
    }
}

/// Label names and values of one series.
pub type Labels = Vec<(&'static str, String)>;

/// One metric with a series per label set, built from a snapshot of the state.
#[derive(Debug)]
struct Series<M>(Vec<(Labels, M)>);

impl<M: EncodeMetric + TypedMetric> EncodeMetric for Series<M> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (labels, metric) in &self.0 {
            metric.encode(encoder.encode_family(labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        M::TYPE
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The metrics of one scrape.
#[derive(Default)]
pub struct Scrape {
    registry: Registry,
}

impl Scrape {
    /// A counter. `name` comes without `_total`: the exposition appends it.
    pub fn counter<N>(&mut self, name: &str, help: &str, value: N)
    where
        N: EncodeCounterValue + Debug + Send + Sync + 'static,
    {
        self.registry.register(name, help, ConstCounter::new(value));
    }

    pub fn gauge<N>(&mut self, name: &str, help: &str, value: N)
    where
        N: EncodeGaugeValue + Debug + Send + Sync + 'static,
    {
        self.registry.register(name, help, ConstGauge::new(value));
    }

    pub fn histogram(&mut self, name: &str, help: &str, histogram: &LatencyHistogram) {
        self.registry.register(name, help, histogram.0.clone());
    }

    /// A counter with one series per label set (`name` without `_total`).
    pub fn counters<N>(&mut self, name: &str, help: &str, series: impl IntoIterator<Item = (Labels, N)>)
    where
        ConstCounter<N>: Metric,
    {
        self.series(name, help, series.into_iter().map(|(l, v)| (l, ConstCounter::new(v))));
    }

    /// A gauge with one series per label set.
    pub fn gauges<N>(&mut self, name: &str, help: &str, series: impl IntoIterator<Item = (Labels, N)>)
    where
        ConstGauge<N>: Metric,
    {
        self.series(name, help, series.into_iter().map(|(l, v)| (l, ConstGauge::new(v))));
    }

    fn series<M>(&mut self, name: &str, help: &str, series: impl Iterator<Item = (Labels, M)>)
    where
        M: EncodeMetric + TypedMetric + Debug + Send + Sync + 'static,
    {
        self.registry.register(name, help, Series(series.collect()));
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The text of `/metrics`, built fresh on every scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Binds `addr` and serves `render()` at `/metrics` until the runtime stops. Returns the
/// bound address.
pub async fn serve(addr: &str, render: Render) -> Result<std::net::SocketAddr, DashboardError> {
    serve_with(addr, render, Router::new()).await
}

/// [`serve`], with `routes` (the dashboard, its JSON) beside `/metrics` on the same port.
pub async fn serve_with(addr: &str, render: Render, routes: Router) -> Result<std::net::SocketAddr, DashboardError> {
    let listen_err = |source: std::io::Error| DashboardError::Listen { addr: addr.to_string(), source };
    let listener = TcpListener::bind(addr).await.map_err(listen_err)?;
    let local = listener.local_addr().map_err(listen_err)?;
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let body = render();
                // One connection per scrape: scrapes are seconds apart, and a client that
                // reads to the end of the stream (curl, a test) gets its answer.
                async move { ([(header::CONTENT_TYPE, CONTENT_TYPE), (header::CONNECTION, "close")], body) }
            }),
        )
        .merge(routes)
        .fallback(|| async { (StatusCode::NOT_FOUND, [(header::CONNECTION, "close")], "not found; try /metrics\n") });
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app.into_make_service()).await {
            tracing::warn!(error = %e, "metrics server stopped");
        }
    });
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = LatencyHistogram::default();
        h.observe(Duration::from_micros(50));
        h.observe(Duration::from_millis(3));
        let mut s = Scrape::default();
        s.histogram("x_seconds", "test", &h);
        let s = s.render();
        assert!(s.contains("x_seconds_bucket{le=\"0.0001\"} 1"), "{s}");
        assert!(s.contains("x_seconds_bucket{le=\"0.005\"} 2"), "{s}");
        assert!(s.contains("x_seconds_count 2"), "{s}");
    }

    #[test]
    fn series_carry_their_labels_escaped() {
        let mut s = Scrape::default();
        s.counter("c", "a counter", 3u64);
        s.gauges("g", "a gauge", [(vec![("job", "a\"b".to_string()), ("state", "acked".to_string())], 0i64)]);
        s.gauges::<f64>("empty", "no series", []);
        let s = s.render();
        assert!(s.contains("# TYPE c counter\nc_total 3\n"), "{s}");
        assert!(s.contains("g{job=\"a\\\"b\",state=\"acked\"} 0\n"), "{s}");
        assert!(!s.contains("empty"), "{s}");
        assert!(s.ends_with("# EOF\n"), "{s}");
    }

    async fn get_path(addr: std::net::SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).await.unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).await.unwrap();
        body
    }

    #[tokio::test]
    async fn serves_the_rendered_text_over_http() {
        let addr = serve("127.0.0.1:0", Arc::new(|| "up 1\n".to_string())).await.unwrap();
        let body = get_path(addr, "/metrics").await;
        assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
        assert!(body.contains("content-type: application/openmetrics-text"), "{body}");
        assert!(body.ends_with("up 1\n"), "{body}");
        let body = get_path(addr, "/other").await;
        assert!(body.starts_with("HTTP/1.1 404 Not Found"), "{body}");
    }
}

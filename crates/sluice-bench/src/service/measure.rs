//! Measurements behind `sluice-bench service` (benchmarks, not tests):
//!
//! * [`data_plane`]: bytes/s of batches through the real data-plane stack (tonic streaming,
//!   prost encode/decode, batch conversion) from a worker that does no preprocessing,
//!   against raw loopback TCP in the same run.
//! * [`dispatcher_load`]: GetTask+AckTask from N concurrent clients against a running
//!   dispatcher: request rate and latency percentiles.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use sluice_client::proto::dispatcher_client::DispatcherClient;
use sluice_client::proto::worker_client::WorkerClient;
use sluice_client::proto::worker_server::{Worker, WorkerServer};
use sluice_client::proto::*;
use sluice_client::wire::{message_to_batch, Outgoing};
use sluice_client::{Compression, MAX_MESSAGE_BYTES};
use sluice_core::{Batch, DType, Layout, Tensor};
use sluice_service::dataplane;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

fn rt() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().context("starting a runtime")
}

/// A gRPC status from a task as an error naming the call.
fn rpc(what: &'static str) -> impl Fn(Status) -> anyhow::Error {
    move |s| anyhow::anyhow!("{what}: {} ({:?})", s.message(), s.code())
}

/// Bytes/s of `total` bytes written in `chunk`-sized writes over one loopback TCP connection.
pub fn raw_tcp(total: u64, chunk: usize) -> Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0").context("bind")?;
    let addr = listener.local_addr().context("addr")?;
    let reader = std::thread::spawn(move || -> std::io::Result<u64> {
        let (mut s, _) = listener.accept()?;
        let mut buf = vec![0u8; chunk];
        let mut got = 0u64;
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                return Ok(got);
            }
            got += n as u64;
        }
    });
    let mut s = TcpStream::connect(addr).context("connect")?;
    s.set_nodelay(true).context("nodelay")?;
    let buf = vec![7u8; chunk];
    let t0 = Instant::now();
    let mut sent = 0u64;
    while sent < total {
        s.write_all(&buf).context("write")?;
        sent += chunk as u64;
    }
    drop(s);
    let got = reader.join().map_err(|_| anyhow::anyhow!("the reader thread panicked"))?.context("read")?;
    Ok(got as f64 / t0.elapsed().as_secs_f64())
}

/// Stream `s`'s share of the task: batches `s * per` to `(s + 1) * per` of epoch 0.
fn stream_request(s: u64, per: u64) -> RunTaskRequest {
    RunTaskRequest { job_id: 0, epoch: 0, start: s * per, end: (s + 1) * per, compression: 0, ..Default::default() }
}

/// The bytes every stream task received, or the first failure (`what` names the call).
async fn total_bytes(tasks: Vec<tokio::task::JoinHandle<Result<u64, Status>>>, what: &'static str) -> Result<u64> {
    let mut bytes = 0;
    for t in tasks {
        bytes += t.await.context("a stream task")?.map_err(rpc(what))?;
    }
    Ok(bytes)
}

/// A worker whose "pipeline" is free: every batch is a fresh zeroed buffer, converted and
/// streamed exactly as the real worker does.
struct NoopWorker {
    samples: usize,
    side: usize,
}

#[tonic::async_trait]
impl Worker for NoopWorker {
    type RunTaskStream = std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<BatchMessage, Status>> + Send>>;

    async fn run_task(&self, request: Request<RunTaskRequest>) -> Result<Response<Self::RunTaskStream>, Status> {
        use tokio_stream::StreamExt;
        let rx = noop_batches(request.into_inner(), self.samples, self.side);
        #[allow(clippy::result_large_err)] // tonic's stream item type
        fn to_message(r: Result<Outgoing, Status>) -> Result<BatchMessage, Status> {
            r.map(Outgoing::into_message)
        }
        Ok(Response::new(Box::pin(ReceiverStream::new(rx).map(to_message))))
    }
}

/// Bytes/s of pixel data received through the gRPC data plane, `batches` batches of
/// `samples` × `side`² × 3 bytes, over `streams` concurrent task streams.
pub fn data_plane(samples: usize, side: usize, batches: u64, streams: u64) -> Result<f64> {
    let rt = rt()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("bind")?;
        let addr = listener.local_addr().context("addr")?;
        let incoming =
            TcpIncoming::from_listener(listener, true, None).map_err(|e| anyhow::anyhow!("incoming: {e}"))?;
        let stop = Arc::new(tokio::sync::Notify::new());
        let s2 = stop.clone();
        let server = WorkerServer::new(NoopWorker { samples, side })
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        let handle = tokio::spawn(
            tonic::transport::Server::builder()
                .initial_stream_window_size(Some(8 << 20))
                .initial_connection_window_size(Some(32 << 20))
                .add_service(server)
                .serve_with_incoming_shutdown(incoming, async move { s2.notified().await }),
        );
        let channel = Endpoint::from_shared(format!("http://{addr}"))?
            .tcp_nodelay(true)
            .initial_stream_window_size(Some(8 << 20))
            .initial_connection_window_size(Some(32 << 20))
            .connect_lazy();
        let client = WorkerClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        let per = batches / streams.max(1);
        for s in 0..streams.max(1) {
            let mut c = client.clone();
            tasks.push(tokio::spawn(async move {
                let req = stream_request(s, per);
                let mut stream = c.run_task(req).await?.into_inner();
                let mut bytes = 0u64;
                while let Some(m) = stream.message().await? {
                    let b = message_to_batch(m).map_err(Status::from)?;
                    bytes += b.images.as_bytes().len() as u64;
                }
                Ok::<u64, Status>(bytes)
            }));
        }
        let bytes = total_bytes(tasks, "RunTask").await?;
        let rate = bytes as f64 / t0.elapsed().as_secs_f64();
        stop.notify_one();
        let _ = handle.await;
        Ok(rate)
    })
}

fn noop_batches(req: RunTaskRequest, n: usize, side: usize) -> mpsc::Receiver<Result<Outgoing, Status>> {
    let (tx, rx) = mpsc::channel(2);
    tokio::task::spawn_blocking(move || {
        for index in req.start..req.end {
            let batch = Batch {
                epoch: req.epoch,
                index,
                keys: (0..n as u64).collect(),
                labels: vec![0; n],
                images: Tensor::zeros(DType::U8, vec![n, side, side, 3]),
                layout: Layout::Hwc,
                weights: None,
                boxes: None,
                fields: None,
            };
            if tx.blocking_send(Ok(Outgoing::new(batch, Compression::None))).is_err() {
                return;
            }
        }
    });
    rx
}

/// As [`data_plane`], through sluice's own data plane: TCP, or with `local` the local data
/// plane (Unix socket + shared memory) that clients use for workers on their machine.
pub fn own_data_plane(samples: usize, side: usize, batches: u64, streams: u64, local: bool) -> Result<f64> {
    let rt = rt()?;
    rt.block_on(async move {
        let start: dataplane::StartTask = Arc::new(move |req| {
            Box::pin(async move {
                Ok(dataplane::TaskBatches {
                    rx: noop_batches(req, samples, side),
                    max_batch_bytes: samples * side * side * 3,
                    in_flight: 4,
                    buffers: None,
                    recycle: None,
                })
            })
        });
        let (addr, server) = if local {
            local_server(start)?
        } else {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("bind")?;
            let addr = listener.local_addr().context("addr")?.to_string();
            (addr, tokio::spawn(dataplane::serve(listener, start, None, None, Default::default())))
        };
        let maps = Arc::new(local_maps());
        let t0 = Instant::now();
        let per = batches / streams.max(1);
        let mut tasks = Vec::new();
        for s in 0..streams.max(1) {
            let (addr, maps) = (addr.clone(), maps.clone());
            tasks.push(tokio::spawn(async move {
                let req = stream_request(s, per);
                let mut stream = open_stream(&addr, local, &req, &maps).await?;
                let mut bytes = 0u64;
                while let Some(b) = stream.next().await? {
                    bytes += b.images.as_bytes().len() as u64;
                }
                Ok::<u64, Status>(bytes)
            }));
        }
        let bytes = total_bytes(tasks, "data plane").await?;
        let rate = bytes as f64 / t0.elapsed().as_secs_f64();
        server.abort();
        Ok(rate)
    })
}

#[cfg(target_os = "linux")]
type LocalMaps = sluice_client::dataplane::MappedRegions;
#[cfg(not(target_os = "linux"))]
type LocalMaps = ();

fn local_maps() -> LocalMaps {
    LocalMaps::default()
}

#[cfg(target_os = "linux")]
fn local_server(start: dataplane::StartTask) -> Result<(String, tokio::task::JoinHandle<()>)> {
    let name = format!("sluice-bench-{}", sluice_client::random_token()?);
    let listener = sluice_client::shm::listen_abstract(&name).context("listen")?;
    let pool = Arc::new(dataplane::RegionPool::default());
    Ok((name, tokio::spawn(dataplane::serve_local(listener, start, None, pool, Default::default()))))
}

#[cfg(not(target_os = "linux"))]
fn local_server(_: dataplane::StartTask) -> Result<(String, tokio::task::JoinHandle<()>)> {
    anyhow::bail!("the local data plane needs Linux")
}

async fn open_stream(
    addr: &str,
    local: bool,
    req: &RunTaskRequest,
    maps: &LocalMaps,
) -> Result<sluice_client::dataplane::TaskStream, Status> {
    #[cfg(target_os = "linux")]
    if local {
        let sock = sluice_client::shm::connect_abstract(addr).map_err(|e| Status::unavailable(e.to_string()))?;
        return sluice_client::dataplane::TaskStream::open_local(sock, addr, None, req, maps).await;
    }
    let _ = (local, maps);
    sluice_client::dataplane::TaskStream::open(addr, None, req, None).await
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct LoadRow {
    pub clients: usize,
    /// GetTask requests answered with a task, per second.
    pub get_task_per_s: f64,
    /// All RPCs (GetTask + AckTask) per second.
    pub rpcs_per_s: f64,
    pub get_task_p50_ms: f64,
    pub get_task_p99_ms: f64,
}

/// Runs `clients` closed-loop clients (each its own connection) doing GetTask then AckTask
/// on job `job_id` for `seconds`, against the dispatcher at `addr` (started without a
/// token). A fake worker is registered and kept alive so tasks are handed out.
pub fn dispatcher_load(addr: &str, job_id: u64, clients: usize, seconds: f64) -> Result<LoadRow> {
    let rt = rt()?;
    let addr = addr.to_string();
    rt.block_on(async move {
        let connect = || -> Result<DispatcherClient<Channel>> {
            let channel = Endpoint::from_shared(format!("http://{addr}"))?.tcp_nodelay(true).connect_lazy();
            Ok(DispatcherClient::new(channel))
        };
        let mut control = connect()?;
        let wid = control
            .register_worker(RegisterWorkerRequest { addr: "127.0.0.1:9".into(), ..Default::default() })
            .await
            .map_err(rpc("RegisterWorker"))?
            .into_inner()
            .worker_id;
        let stop = Arc::new(AtomicBool::new(false));
        let hb_stop = stop.clone();
        let mut hb = control.clone();
        let heartbeat = tokio::spawn(async move {
            while !hb_stop.load(Ordering::Relaxed) {
                let _ = hb.worker_heartbeat(WorkerHeartbeatRequest { worker_id: wid, ..Default::default() }).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        control.get_job(GetJobRequest { job_id }).await.map_err(rpc("GetJob"))?;
        let deadline = Instant::now() + Duration::from_secs_f64(seconds);
        let mut handles = Vec::new();
        for c in 0..clients {
            let mut d = connect()?;
            handles.push(tokio::spawn(async move {
                let client_id = format!("load-{c}");
                let mut epoch = 0u64;
                let mut lat = Vec::new();
                let mut rpcs = 0u64;
                let mut req_id = 1u64;
                while Instant::now() < deadline {
                    let t0 = Instant::now();
                    let r = d
                        .get_task(GetTaskRequest {
                            job_id,
                            client_id: client_id.clone(),
                            epoch,
                            request_id: req_id,
                            lookahead: false,
                            streamed: None,
                            client_secret: String::new(),
                        })
                        .await?
                        .into_inner();
                    req_id += 1;
                    rpcs += 1;
                    match (r.status(), r.task) {
                        (get_task_reply::Status::Task, Some(t)) => {
                            lat.push(t0.elapsed());
                            d.ack_task(AckTaskRequest {
                                job_id,
                                client_id: client_id.clone(),
                                epoch: t.epoch,
                                task_index: t.task_index,
                                generation: t.generation,
                                lease: t.lease,
                                client_secret: String::new(),
                            })
                            .await?;
                            rpcs += 1;
                        }
                        (get_task_reply::Status::EpochDone, _) => epoch += 1,
                        _ => tokio::time::sleep(Duration::from_micros(200)).await,
                    }
                }
                Ok::<_, Status>((lat, rpcs))
            }));
        }
        let t0 = Instant::now();
        let mut lat = Vec::new();
        let mut rpcs = 0;
        for h in handles {
            let (l, r) = h.await.context("a load client")?.map_err(rpc("load"))?;
            lat.extend(l);
            rpcs += r;
        }
        let elapsed = t0.elapsed().as_secs_f64().max(seconds);
        stop.store(true, Ordering::Relaxed);
        let _ = heartbeat.await;
        lat.sort_unstable();
        let pct = |p: f64| {
            if lat.is_empty() {
                return 0.0;
            }
            let i = ((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1;
            lat[i].as_secs_f64() * 1e3
        };
        Ok(LoadRow {
            clients,
            get_task_per_s: lat.len() as f64 / elapsed,
            rpcs_per_s: rpcs as f64 / elapsed,
            get_task_p50_ms: pct(0.50),
            get_task_p99_ms: pct(0.99),
        })
    })
}

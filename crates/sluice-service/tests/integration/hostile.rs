//! A hostile client against a real service (a dispatcher in this process and two worker
//! processes, so that a worker crash shows): malformed and truncated frames, oversized lengths, wrong tokens, absurd
//! specs and misused shared-memory slots, round after round, while a well-behaved
//! `RemoteLoader` on the same service reads its epochs. The good job must still get every
//! sample exactly once per epoch, and no worker may die.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support::*;

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use prost::Message;
use sluice_client::proto::dispatcher_client::DispatcherClient;
use sluice_client::proto::{
    AckTaskRequest, CreateJobRequest, FailTaskRequest, GetTaskRequest, ResetJobRequest, RunTaskRequest,
};
use sluice_client::{RemoteLoader, ScaleClient, ServiceErrorKind};
use sluice_core::{OpSpec, PipelineSpec, Size};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;
use tonic::Code;

const TOKEN: &str = "hostile-test-token";
const MAGIC: &[u8] = b"SLDP1";
const KIND_ERROR: u8 = 3;
const KIND_REGION: u8 = 4;

fn hello(token: &str, req: &[u8]) -> Vec<u8> {
    let mut h = MAGIC.to_vec();
    h.extend_from_slice(&(token.len() as u32).to_le_bytes());
    h.extend_from_slice(token.as_bytes());
    h.extend_from_slice(&(req.len() as u32).to_le_bytes());
    h.extend_from_slice(req);
    h
}

fn run_task(job_id: u64, start: u64, end: u64) -> Vec<u8> {
    RunTaskRequest { job_id, epoch: 0, start, end, compression: 0, ..Default::default() }.encode_to_vec()
}

/// Frames a hostile client opens a data-plane connection with, each answered by an error
/// frame (or a closed connection), never by a batch.
fn bad_hellos(rng: &mut Rng, absurd_jobs: &[u64]) -> Vec<(&'static str, Vec<u8>)> {
    let mut noise = vec![0u8; 1 + rng.below(300) as usize];
    for b in &mut noise {
        *b = rng.below(256) as u8;
    }
    let mut v = vec![
        ("http", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        ("noise", noise),
        ("truncated magic", b"SLD".to_vec()),
        ("token length 4 GiB", [MAGIC, &u32::MAX.to_le_bytes()].concat()),
        ("truncated token", [MAGIC, &100u32.to_le_bytes(), b"abc"].concat()),
        ("wrong token", hello("not-the-token", &run_task(1, 0, 1))),
        ("empty token", hello("", &run_task(1, 0, 1))),
        (
            "request length 4 GiB",
            [&hello(TOKEN, &[])[..MAGIC.len() + 4 + TOKEN.len()], &u32::MAX.to_le_bytes()].concat(),
        ),
        ("malformed request", hello(TOKEN, &[0xff; 7])),
        ("unknown job", hello(TOKEN, &run_task(987_654_321, 0, 1))),
        ("empty range", hello(TOKEN, &run_task(1, 5, 5))),
        ("range past the epoch", hello(TOKEN, &run_task(1, 0, u64::MAX))),
    ];
    for &job in absurd_jobs {
        v.push(("absurd job", hello(TOKEN, &run_task(job, 0, 1))));
    }
    v
}

/// Sends `bytes` on a fresh connection and reads the answer to the end (the worker closes).
async fn answer<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    what: &str,
    mut s: S,
    bytes: &[u8],
) -> Vec<u8> {
    let _ = s.write_all(bytes).await;
    let _ = s.shutdown().await;
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(15), s.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "{what}: the worker neither answered nor closed within 15 s");
    out
}

fn check_refused(what: &str, out: &[u8]) {
    if out.is_empty() {
        return; // closed without a word: fine for a connection that said nothing useful
    }
    assert_eq!(out[0], KIND_ERROR, "{what}: answered with frame kind {} instead of an error", out[0]);
    if matches!(what, "wrong token" | "empty token") && out.len() >= 5 {
        let code = u32::from_le_bytes(out[1..5].try_into().unwrap());
        assert_eq!(code, Code::Unauthenticated as u32, "{what}: {}", String::from_utf8_lossy(&out[9..]));
    }
}

/// The abstract socket names of the local data planes of the workers `pids`, as any
/// process on the machine can list them.
fn local_sockets(pids: &[u32]) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    let mut names: Vec<String> = table
        .lines()
        .filter_map(|l| l.split_whitespace().nth(7))
        .filter_map(|p| p.strip_prefix('@'))
        .filter(|n| pids.iter().any(|p| n.starts_with(&format!("sluice-worker-{p}-"))))
        .map(str::to_string)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Misuses a shared-memory task of `job`: tries to resize and write the region, hands back
/// slots it does not hold, or hangs up halfway.
async fn misuse_slots(name: &str, job: u64, how: u64) {
    let Ok(mut sock) = sluice_client::shm::connect_abstract(name) else { return };
    sock.write_all(&hello(TOKEN, &run_task(job, 0, 2))).await.unwrap();
    let mut kind = [0u8; 1];
    let got = tokio::time::timeout(Duration::from_secs(15), sluice_client::shm::recv_with_fd(&sock, &mut kind)).await;
    let Ok(Ok((1, fd))) = got else { return };
    if kind[0] != KIND_REGION {
        return;
    }
    let fd = fd.expect("a region comes with its memory");
    let raw = fd.as_raw_fd();
    // SAFETY: syscalls on an fd this test owns; a mapping that succeeded is unmapped.
    unsafe {
        assert_ne!(libc::ftruncate(raw, 0), 0, "a client shrank a worker's shared region");
        let p = libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, raw, 0);
        if p != libc::MAP_FAILED {
            libc::munmap(p, 4096);
            panic!("a client mapped a worker's shared region writable");
        }
    }
    let mut rest = [0u8; 20];
    let _ = tokio::time::timeout(Duration::from_secs(5), sock.read_exact(&mut rest)).await;
    let misuse: &[u8] = match how % 4 {
        0 => &99u32.to_le_bytes(),      // a slot that does not exist
        1 => &[0, 0, 0, 0, 0, 0, 0, 0], // slot 0, twice
        2 => &[1, 2],                   // half a slot number
        _ => return,                    // hang up halfway
    };
    let _ = sock.write_all(misuse).await;
    let _ = sock.shutdown().await;
    let mut sink = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(15), sock.read_to_end(&mut sink)).await;
}

fn with_token<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

/// Absurd specs a hostile client creates jobs with; the ids of those the dispatcher took.
async fn absurd_jobs(d: &mut DispatcherClient<Channel>, root: &std::path::Path) -> Vec<u64> {
    let base = spec(root, 3);
    let mut specs: Vec<(&str, PipelineSpec)> = Vec::new();
    let mut s = base.clone();
    s.threads = 1_000_000_000.into();
    specs.push(("threads", s));
    let mut s = base.clone();
    s.prefetch = 1_000_000_000;
    specs.push(("prefetch", s));
    let mut s = base.clone();
    s.limits.max_pixels = u64::MAX;
    specs.push(("max_pixels", s));
    let mut s = base.clone();
    s.cache = serde_json::from_value(serde_json::json!({ "budget": 1u64 << 60 })).unwrap();
    specs.push(("cache", s));
    let mut s = base.clone();
    s.batch.size = 2;
    s.ops = vec![OpSpec::Decode, OpSpec::CenterCrop { size: Size { height: 4294967295, width: 715827883 } }];
    specs.push(("center_crop", s));
    let mut ids = Vec::new();
    for (what, s) in specs {
        let req = CreateJobRequest {
            job_name: format!("absurd-{what}"),
            spec_json: serde_json::to_string(&s).unwrap(),
            ..Default::default()
        };
        match d.create_job(with_token(req, TOKEN)).await {
            Ok(info) => ids.push(info.into_inner().job_id),
            Err(s) => eprintln!("absurd spec ({what}) refused by the dispatcher: {}", s.message()),
        }
    }
    ids
}

#[test]
fn a_hostile_client_does_not_disturb_a_good_job_or_kill_a_worker() {
    let _w = watchdog("hostile", 180);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("j"), &root, &["--token", TOKEN]);
    let data: Vec<String> = (0..2).map(|_| free_addr()).collect();
    // Threads as the specs ask (no --threads), so the worker's limits judge them.
    let mut workers: Vec<Proc> = data
        .iter()
        .map(|a| {
            let root = root.to_str().unwrap();
            serve_process(
                "worker",
                &["--dispatcher", &addr, "--allow-root", root, "--token", TOKEN, "--data-listen", a],
            )
        })
        .collect();
    let pids: Vec<u32> = workers.iter().map(|w| w.0.id()).collect();

    let good = {
        let (addr, root) = (addr.clone(), root.clone());
        std::thread::spawn(move || {
            let mut o = options(&addr, "good");
            o.token = Some(TOKEN.into());
            let mut loader = RemoteLoader::connect(&spec(&root, 7), o).unwrap();
            for _ in 0..3 {
                let epoch = loader.epoch();
                let mut keys = Vec::new();
                for b in loader.iter() {
                    keys.extend(b.unwrap().keys);
                }
                assert_exactly_once(keys, &format!("good job, epoch {epoch}"));
            }
        })
    };

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let channel = loop {
            if let Ok(c) = Channel::from_shared(format!("http://{addr}")).unwrap().connect().await {
                break c;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let mut d = DispatcherClient::new(channel);
        // A job for slot misuse, apart from the good one.
        let junk = CreateJobRequest {
            job_name: "junk".into(),
            spec_json: serde_json::to_string(&spec(&root, 5)).unwrap(),
            ..Default::default()
        };
        let junk = d.create_job(with_token(junk, TOKEN)).await.unwrap().into_inner().job_id;
        let absurd = absurd_jobs(&mut d, &root).await;
        while local_sockets(&pids).len() < 2 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
        eprintln!("hostile rounds seeded with {seed}");
        let mut rng = Rng(seed);
        let t0 = Instant::now();
        let mut rounds = 0;
        while rounds < 20 || (!good.is_finished() && rounds < 50) {
            rounds += 1;
            // gRPC without the token, with a wrong one, and an oversized message.
            let create = CreateJobRequest { job_name: "x".into(), spec_json: "{}".into(), ..Default::default() };
            let e = d.create_job(create.clone()).await.unwrap_err();
            assert_eq!(e.code(), Code::Unauthenticated, "{e}");
            let e = d.create_job(with_token(create, "wrong")).await.unwrap_err();
            assert_eq!(e.code(), Code::Unauthenticated, "{e}");
            let e = d
                .get_task(with_token(
                    GetTaskRequest { job_id: junk, client_id: "\u{0}".repeat(300), ..Default::default() },
                    TOKEN,
                ))
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{e}");
            if rounds % 10 == 1 {
                let huge =
                    CreateJobRequest { job_name: "huge".into(), spec_json: "x".repeat(8 << 20), ..Default::default() };
                let e = d.create_job(with_token(huge, TOKEN)).await.unwrap_err();
                assert!(
                    e.message().contains("message length too large"),
                    "an 8 MiB control message got past the size limit: {e}"
                );
            }
            // Bad frames on every worker's TCP data plane.
            for a in &data {
                for (what, bytes) in bad_hellos(&mut rng, &absurd) {
                    let Ok(s) = tokio::net::TcpStream::connect(a).await else { continue };
                    check_refused(what, &answer(what, s, &bytes).await);
                }
                // A connection that says nothing and goes.
                drop(tokio::net::TcpStream::connect(a).await);
            }
            // The same, and slot misuse, on their local (shared-memory) data planes.
            for name in local_sockets(&pids) {
                for (what, bytes) in bad_hellos(&mut rng, &absurd) {
                    let Ok(s) = sluice_client::shm::connect_abstract(&name) else { continue };
                    check_refused(what, &answer(what, s, &bytes).await);
                }
                misuse_slots(&name, junk, rng.below(4)).await;
            }
        }
        eprintln!("{rounds} hostile rounds in {:.1} s", t0.elapsed().as_secs_f64());
    });

    good.join().expect("the good job failed");
    for (i, w) in workers.iter_mut().enumerate() {
        assert!(w.0.try_wait().unwrap().is_none(), "worker {i} died");
    }
    assert_eq!(local_sockets(&pids).len(), 2, "both workers still serve shared memory");
}

/// Waits until the dispatcher answers `GetScale` (it is up).
fn scale_client(addr: &str, token: &str) -> ScaleClient {
    let mut c = ScaleClient::new(addr, Some(token), None).unwrap();
    let t0 = Instant::now();
    while c.scale().is_err() {
        assert!(t0.elapsed() < Duration::from_secs(20), "the dispatcher at {addr} does not answer");
        std::thread::sleep(Duration::from_millis(50));
    }
    c
}

#[test]
fn a_client_token_cannot_drain_workers_or_set_the_scale() {
    let _w = watchdog("operator calls", 90);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let journal = dir.path().join("j");
    let autoscale = ["--autoscale", "fixed", "--min-workers", "1", "--max-workers", "4"];
    let mut flags = vec!["--token", TOKEN];
    flags.extend(autoscale);
    let mut d = dispatcher_process(&addr, &journal, &root, &flags);
    let _worker = worker(&addr, &root, &["--token", TOKEN, "--name", "worker-0"]);
    let mut client = scale_client(&addr, TOKEN);

    // The clients' token and no operator token: operator calls are refused.
    let drained = client.drain("worker-0");
    assert!(drained.is_err(), "a client with the clients' token drained worker-0: {drained:?}");
    let e = drained.unwrap_err();
    assert_eq!(e.kind(), ServiceErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains("--operator-token"), "the refusal does not say what to do: {e}");
    let scaled = client.set_workers(4);
    assert!(scaled.is_err(), "a client with the clients' token set the scale: {scaled:?}");
    assert_eq!(client.scale().unwrap().target, 1, "the target moved");

    // With an operator token: the operator's calls pass, the clients' still do not.
    d.kill();
    let mut flags = vec!["--token", TOKEN, "--operator-token", OPERATOR];
    flags.extend(autoscale);
    let _d = dispatcher_process(&addr, &journal, &root, &flags);
    let mut operator = scale_client(&addr, OPERATOR);
    let mut client = scale_client(&addr, TOKEN);
    let e = client.set_workers(3).unwrap_err();
    assert_eq!(e.kind(), ServiceErrorKind::PermissionDenied, "{e}");
    assert_eq!(operator.set_workers(3).unwrap().target, 3);
    let e = client.drain("worker-0").unwrap_err();
    assert_eq!(e.kind(), ServiceErrorKind::PermissionDenied, "{e}");
    let t0 = Instant::now();
    while !operator.drain("worker-0").unwrap().known {
        assert!(t0.elapsed() < Duration::from_secs(10), "worker-0 never registered");
        std::thread::sleep(Duration::from_millis(100));
    }
}

const OPERATOR: &str = "hostile-operator-token";

/// The `client` label of the dispatcher's per-client metrics (what a co-tenant can read).
fn published_client_ids(metrics: &str) -> Vec<String> {
    http_get(metrics)
        .lines()
        .filter(|l| l.starts_with("sluice_client_batches_total{"))
        .filter_map(|l| Some(l.split("client=\"").nth(1)?.split('"').next()?.to_string()))
        .collect()
}

#[test]
fn a_co_tenant_cannot_release_or_ack_another_clients_leases() {
    let _w = watchdog("co-tenant", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let metrics = free_addr();
    let port = metrics.rsplit(':').next().unwrap().to_string();
    let _d = dispatcher(&addr, &dir.path().join("j"), &root, &["--token", TOKEN, "--metrics-port", &port]);
    let _worker = worker(&addr, &root, &["--token", TOKEN]);
    let job_options = || {
        let mut o = options(&addr, "shared");
        o.token = Some(TOKEN.into());
        o
    };

    // The victim takes one batch; its fetchers hold leases on the tasks after it.
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let victim_options = job_options();
    let root_v = root.clone();
    let victim = std::thread::spawn(move || {
        let mut loader = RemoteLoader::connect(&spec(&root_v, 7), victim_options).unwrap();
        let mut keys = Vec::new();
        let mut it = loader.iter();
        keys.extend(it.next().unwrap().unwrap().keys);
        held_tx.send(()).unwrap();
        go_rx.recv().unwrap();
        for b in it {
            keys.extend(b.unwrap().keys);
        }
        keys
    });
    held_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    let t0 = Instant::now();
    let victim_id = loop {
        if let Some(id) = published_client_ids(&metrics).pop() {
            break id;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "the victim's client id is not published");
        std::thread::sleep(Duration::from_millis(100));
    };

    // The co-tenant, with the clients' token and the victim's public id, hands the
    // victim's leases back, asks for its assignments again, and reports on its tasks.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let codes = rt.block_on(async {
        let channel = Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
        let mut d = DispatcherClient::new(channel);
        let mut codes = Vec::new();
        let mut record = |r: Result<(), tonic::Status>| codes.push(r.map_or_else(|s| s.code(), |()| Code::Ok));
        // The victim's first request holds a task: its assignment comes back to whoever asks.
        let get = GetTaskRequest { job_id: 1, client_id: victim_id.clone(), request_id: 1, ..Default::default() };
        record(d.get_task(with_token(get, TOKEN)).await.map(drop));
        let release = ResetJobRequest { job_id: 1, epoch: 0, release_client: victim_id.clone(), ..Default::default() };
        record(d.reset_job(with_token(release, TOKEN)).await.map(drop));
        for task_index in 0..2 {
            let lease = task_index + 1;
            let ack =
                AckTaskRequest { job_id: 1, client_id: victim_id.clone(), task_index, lease, ..Default::default() };
            record(d.ack_task(with_token(ack, TOKEN)).await.map(drop));
            let fail = FailTaskRequest {
                job_id: 1,
                client_id: victim_id.clone(),
                task_index,
                lease,
                received: 1,
                ..Default::default()
            };
            record(d.fail_task(with_token(fail, TOKEN)).await.map(drop));
        }
        codes
    });
    go_tx.send(()).unwrap();

    // The co-tenant's own loader reads its share of the shared epoch beside the victim.
    let mut co_tenant = RemoteLoader::connect(&spec(&root, 7), job_options()).unwrap();
    let mut keys: Vec<u64> = Vec::new();
    for b in co_tenant.iter() {
        keys.extend(b.unwrap().keys);
    }
    keys.extend(victim.join().expect("the victim failed"));
    assert_exactly_once(keys, "a shared job whose client's leases a co-tenant released");
    assert!(
        codes.iter().all(|&c| c == Code::PermissionDenied),
        "a co-tenant's calls in the victim's name were not refused: {codes:?}"
    );
}

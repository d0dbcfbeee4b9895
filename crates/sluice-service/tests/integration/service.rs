//! The service end to end: a dispatcher and workers in this process (on runtimes of their
//! own), or as processes where a scenario SIGKILLs them, real gRPC on 127.0.0.1, a
//! [`RemoteLoader`] in this process.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use sluice_client::{ClientError, Compression, DataPlane, RemoteLoader};
use sluice_core::{Assignment, ByteBudget, CacheLevel, CachePolicyKind, CacheSpec, LocalitySpec, StorageSpec};
use sluice_synth::DatasetOptions;

use crate::support::*;

#[test]
fn a_worker_killed_at_a_random_moment_loses_nothing_and_duplicates_nothing_20_times() {
    let _watchdog = watchdog("a_worker_killed_at_a_random_moment_loses_nothing_and_duplicates_nothing_20_times", 240);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &[]);
    let mut workers: Vec<Proc> = (0..3).map(|_| worker_process(&addr, &root, &[])).collect();
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    eprintln!("rng seed {seed}");
    let mut rng = Rng(seed);
    let batches = IMAGES.div_ceil(BATCH) as u64;
    let mut duplicates = 0;
    for round in 0..20u64 {
        let mut loader = RemoteLoader::connect(&spec(&root, round), options(&addr, &format!("kill-{round}"))).unwrap();
        assert_eq!(loader.batches_per_epoch(), batches);
        // Two epochs: near the end of the first, workers already run tasks of the second
        // (lookahead), so a kill there hits tasks of an epoch the trainer has not reached.
        let kill_at = rng.below(2 * batches);
        let delay = Duration::from_millis(rng.below(30));
        let victim = rng.below(workers.len() as u64) as usize;
        let mut read = 0;
        for epoch in 0..2 {
            let mut keys = Vec::new();
            let mut indices = Vec::new();
            for b in loader.iter() {
                let b = b.unwrap();
                if read == kill_at {
                    std::thread::sleep(delay);
                    workers[victim].kill();
                    workers[victim] = worker_process(&addr, &root, &[]);
                }
                read += 1;
                assert_eq!(b.epoch, epoch);
                indices.push(b.index);
                keys.extend(b.keys);
            }
            indices.sort_unstable();
            assert_eq!(indices, (0..batches).collect::<Vec<_>>(), "round {round}, epoch {epoch}: batch indices");
            let what = format!("round {round}, epoch {epoch} (killed worker {victim} at batch {kill_at} of both)");
            assert_exactly_once(keys, &what);
        }
        duplicates += loader.duplicates_dropped();
    }
    eprintln!("duplicates dropped by the client over 20 rounds: {duplicates}");
}

#[test]
fn a_restarted_dispatcher_resumes_the_job_mid_epoch_exactly_once() {
    let _watchdog = watchdog("a_restarted_dispatcher_resumes_the_job_mid_epoch_exactly_once", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let journal = dir.path().join("journal");
    let mut d = dispatcher_process(&addr, &journal, &root, &[]);
    let _w: Vec<Server> = (0..2).map(|_| worker(&addr, &root, &[])).collect();
    let mut loader = RemoteLoader::connect(&spec(&root, 7), options(&addr, "restart")).unwrap();
    let mut keys = Vec::new();
    for (i, b) in loader.iter().enumerate() {
        if i == 4 {
            d.kill();
            std::thread::sleep(Duration::from_millis(300));
            d = dispatcher_process(&addr, &journal, &root, &[]);
        }
        keys.extend(b.unwrap().keys);
    }
    assert_exactly_once(keys, "epoch 0 across a dispatcher restart");
    assert_eq!(loader.epoch(), 1);
    // The next epoch runs on the restarted dispatcher, in a different order.
    let epoch1: Vec<Vec<u64>> = loader.iter().map(|b| b.unwrap().keys).collect();
    assert_exactly_once(epoch1.concat(), "epoch 1");
    // A restart between epochs: the job is still known, at epoch 2.
    d.kill();
    let _d = dispatcher_process(&addr, &journal, &root, &[]);
    let again = RemoteLoader::connect(&spec(&root, 7), options(&addr, "restart")).unwrap();
    assert_eq!(again.epoch(), 2);
}

#[test]
fn a_checkpoint_resumes_the_epoch_exactly_and_clients_of_one_job_get_disjoint_batches() {
    let _watchdog = watchdog("a_checkpoint_resumes_the_epoch_exactly_and_clients_of_one_job_get_disjoint_batches", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &[]);
    let _w: Vec<Server> = (0..2).map(|_| worker(&addr, &root, &[])).collect();

    // A trainer reads 5 batches, checkpoints, and dies.
    let mut first = RemoteLoader::connect(&spec(&root, 3), options(&addr, "ckpt")).unwrap();
    let mut keys = Vec::new();
    for b in first.iter().take(5) {
        keys.extend(b.unwrap().keys);
    }
    let state = first.state();
    assert_eq!((state.epoch, state.delivered.len()), (0, 5));
    let json = serde_json::to_string(&state).unwrap();
    drop(first);
    // Its successor resumes from the checkpoint.
    let mut second = RemoteLoader::connect(&spec(&root, 3), options(&addr, "ckpt")).unwrap();
    second.load_state(&serde_json::from_str(&json).unwrap()).unwrap();
    for b in second.iter() {
        keys.extend(b.unwrap().keys);
    }
    assert_exactly_once(keys, "checkpoint + resume");

    // Two clients naming one job share its stream: disjoint, and together everything.
    // (Through the gRPC data plane, so both transports are covered.)
    let mut grpc = options(&addr, "shared");
    grpc.data_plane = DataPlane::Grpc;
    let a = RemoteLoader::connect(&spec(&root, 4), grpc.clone()).unwrap();
    let b = RemoteLoader::connect(&spec(&root, 4), grpc).unwrap();
    assert_eq!(a.job().job_id, b.job().job_id);
    let read = |mut l: RemoteLoader| {
        std::thread::spawn(move || l.iter().map(|b| b.unwrap().keys).collect::<Vec<_>>().concat())
    };
    let (ka, kb) = (read(a), read(b));
    let (ka, kb) = (ka.join().unwrap(), kb.join().unwrap());
    assert!(!ka.is_empty() && !kb.is_empty(), "both clients got batches: {} and {}", ka.len(), kb.len());
    assert_exactly_once([ka, kb].concat(), "two clients of one job");

    // An iterator dropped mid-epoch: the next one delivers exactly the rest.
    let mut l = RemoteLoader::connect(&spec(&root, 6), options(&addr, "abandon")).unwrap();
    let mut keys: Vec<u64> = l.iter().take(3).flat_map(|b| b.unwrap().keys).collect();
    keys.extend(l.iter().flat_map(|b| b.unwrap().keys));
    assert_exactly_once(keys, "an abandoned iterator, then a new one");
    assert_eq!(l.epoch(), 1);
}

#[test]
fn bad_requests_get_clear_errors_and_the_service_keeps_serving() {
    let _watchdog = watchdog("bad_requests_get_clear_errors_and_the_service_keeps_serving", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let outside = dir.path().join("outside");
    sluice_synth::write_dataset(
        &outside,
        &DatasetOptions { images: 4, classes: 1, texture: 8, ..Default::default() },
        &|_| {},
    )
    .unwrap();
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &["--token", "s3cret"]);
    let _w = worker(&addr, &root, &["--token", "s3cret"]);
    let with_token = |job: &str| {
        let mut o = options(&addr, job);
        o.token = Some("s3cret".into());
        o
    };
    let code = |r: Result<RemoteLoader, ClientError>| match r {
        Err(ClientError::Rpc { status, .. }) => (status.code(), status.message().to_string()),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("accepted"),
    };

    // A path outside the allowed roots, directly, through `..`, and through a symlink.
    let (c, m) = code(RemoteLoader::connect(&spec(&outside, 0), with_token("outside")));
    assert_eq!(c, tonic::Code::PermissionDenied, "{m}");
    assert!(m.contains("outside the allowed roots") && m.contains("--allow-root"), "{m}");
    let dotdot = root.join("..").join("outside");
    let (c, _) = code(RemoteLoader::connect(&spec(&dotdot, 0), with_token("dotdot")));
    assert_eq!(c, tonic::Code::PermissionDenied);
    std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
    let (c, _) = code(RemoteLoader::connect(&spec(&root.join("link"), 0), with_token("symlink")));
    assert_eq!(c, tonic::Code::PermissionDenied);
    std::fs::remove_file(root.join("link")).unwrap();

    // A wrong token, and none.
    let mut wrong = options(&addr, "wrong");
    wrong.token = Some("guess".into());
    let (c, m) = code(RemoteLoader::connect(&spec(&root, 0), wrong));
    assert_eq!(c, tonic::Code::Unauthenticated, "{m}");
    let (c, _) = code(RemoteLoader::connect(&spec(&root, 0), options(&addr, "none")));
    assert_eq!(c, tonic::Code::Unauthenticated);

    // A malformed spec (the client library would refuse it, so send it raw) and garbage bytes.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let uri = format!("http://{addr}");
        let channel = tonic::transport::Endpoint::from_shared(uri).unwrap().connect().await.unwrap();
        let token: tonic::metadata::MetadataValue<_> = "Bearer s3cret".parse().unwrap();
        let mut client = sluice_client::proto::dispatcher_client::DispatcherClient::with_interceptor(
            channel.clone(),
            sluice_client::TokenAttach::new(Some("s3cret")).unwrap(),
        );
        let mut good = serde_json::to_value(spec(&root, 0)).unwrap();
        good["batch"]["size"] = 0.into();
        let status = client
            .create_job(sluice_client::proto::CreateJobRequest {
                job_name: "bad".into(),
                spec_json: good.to_string(),
                task_batches: 0,
                parallel_epochs: 0,
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains("batch.size"), "{}", status.message());
        let status = client
            .create_job(sluice_client::proto::CreateJobRequest {
                job_name: "bad".into(),
                spec_json: "{\"source\": 5}".into(),
                task_batches: 0,
                parallel_epochs: 0,
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("source"), "{}", status.message());
        // Importance sampling runs distributed epochs only: parallel ones are refused,
        // naming the field.
        let mut importance = serde_json::to_value(spec(&root, 0)).unwrap();
        importance["sampling"] = serde_json::json!({"kind": "importance"});
        let status = client
            .create_job(sluice_client::proto::CreateJobRequest {
                job_name: "importance".into(),
                spec_json: importance.to_string(),
                task_batches: 0,
                parallel_epochs: 2,
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains("`sampling`"), "{}", status.message());

        // Garbage: bytes that are no CreateJobRequest (field 1 should be UTF-8 text).
        #[derive(Clone, PartialEq, prost::Message)]
        struct Garbage {
            #[prost(bytes = "vec", tag = "1")]
            junk: Vec<u8>,
        }
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.unwrap();
        let mut req = tonic::Request::new(Garbage { junk: vec![0xff, 0xfe, 0x00, 0x80] });
        req.metadata_mut().insert("authorization", token);
        let path = tonic::codegen::http::uri::PathAndQuery::from_static("/sluice.v1.Dispatcher/CreateJob");
        let codec: tonic::codec::ProstCodec<Garbage, sluice_client::proto::JobInfo> =
            tonic::codec::ProstCodec::default();
        let status = grpc.unary(req, path, codec).await.unwrap_err();
        assert_ne!(status.code(), tonic::Code::Ok);
        eprintln!("garbage payload: {status:?}");
    });

    // After all that, a good job still runs to the end.
    let mut loader = RemoteLoader::connect(&spec(&root, 0), with_token("good")).unwrap();
    let keys: Vec<u64> = loader.iter().flat_map(|b| b.unwrap().keys).collect();
    assert_exactly_once(keys, "a good job after the bad requests");
}

#[test]
fn a_job_spec_cannot_make_workers_dial_peers_or_create_link_files() {
    // Before: both were accepted, so any client could have every worker open TCP
    // connections to the addresses in `locality.peers` and create /dev/shm link files.
    let _watchdog = watchdog("a_job_spec_cannot_make_workers_dial_peers_or_create_link_files", 60);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &[]);
    let _w = worker(&addr, &root, &[]);
    let refused = |s: sluice_core::PipelineSpec, job: &str| match RemoteLoader::connect(&s, options(&addr, job)) {
        Err(ClientError::Rpc { status, .. }) => (status.code(), status.message().to_string()),
        Err(e) => panic!("{job}: unexpected error {e}"),
        Ok(_) => panic!("{job}: accepted"),
    };
    let mut peers = spec(&root, 0);
    peers.cache = Some(CacheSpec {
        budget: ByteBudget::Bytes(1 << 20),
        level: CacheLevel::Auto,
        resize: None,
        policy: CachePolicyKind::Lru,
        disk: None,
        share: false,
    });
    peers.locality = Some(LocalitySpec {
        assignment: Assignment::Aware,
        cache_samples: vec![8],
        peers: vec!["127.0.0.1:9".into()],
        peer_timeout_ms: 500,
        token: None,
    });
    let (c, m) = refused(peers, "peers");
    assert_eq!(c, tonic::Code::InvalidArgument, "{m}");
    assert!(m.contains("locality"), "{m}");
    let mut link = spec(&root, 0);
    link.storage = StorageSpec::Throttled { latency_ms: 1.0, bandwidth_mb_s: 100.0, shared_link: Some("nfs".into()) };
    let (c, m) = refused(link, "link");
    assert_eq!(c, tonic::Code::InvalidArgument, "{m}");
    assert!(m.contains("storage.shared_link"), "{m}");
    // The service still serves a plain job.
    let mut ok = RemoteLoader::connect(&spec(&root, 0), options(&addr, "ok")).unwrap();
    assert!(ok.iter().next().unwrap().is_ok());
}

#[test]
fn metrics_endpoints_report_throughput_queue_depth_and_client_stalls() {
    let _watchdog = watchdog("metrics_endpoints_report_throughput_queue_depth_and_client_stalls", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let (dm, wm) = (free_addr(), free_addr());
    let port = |a: &str| a.rsplit(':').next().unwrap().to_string();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &["--metrics-port", &port(&dm)]);
    let _w = worker(&addr, &root, &["--metrics-port", &port(&wm)]);
    let mut loader = RemoteLoader::connect(&spec(&root, 1), options(&addr, "metrics")).unwrap();
    let n = loader.iter().map(|b| b.unwrap().len()).sum::<usize>();
    assert_eq!(n, IMAGES);
    std::thread::sleep(Duration::from_millis(1200)); // a client heartbeat carries the counters
    let d = http_get(&dm);
    assert!(d.starts_with("HTTP/1.1 200 OK"), "{d}");
    let batches = IMAGES.div_ceil(BATCH) as f64;
    assert_eq!(metric_value(&d, "sluice_dispatcher_batches_acked_total"), batches);
    assert_eq!(metric_value(&d, "sluice_dispatcher_workers_live"), 1.0);
    assert!(d.contains("sluice_job_tasks{job=\"metrics\",state=\"acked\"} 0"), "new epoch starts with 0 acked:\n{d}");
    assert!(d.contains("sluice_dispatcher_get_task_seconds_bucket"), "{d}");
    assert_eq!(metric_value(&d, "sluice_client_batches_total"), batches);
    let stall = metric_value(&d, "sluice_client_stall_fraction");
    assert!((0.0..=1.0).contains(&stall), "{stall}");
    let w = http_get(&wm);
    // At least the epoch: the next epoch's first tasks run ahead while this one ends.
    assert!(metric_value(&w, "sluice_worker_samples_total") >= IMAGES as f64);
    assert!(metric_value(&w, "sluice_worker_bytes_sent_total") >= (IMAGES * 32 * 32 * 3) as f64);
    assert!(w.contains("sluice_worker_op_seconds_total{job_id=\"1\",op=\"read\"}"), "{w}");
}

#[test]
fn the_trainers_accelerator_busy_fraction_reaches_the_dispatchers_metrics() {
    let _watchdog = watchdog("the_trainers_accelerator_busy_fraction_reaches_the_dispatchers_metrics", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let dm = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &["--metrics-port", &port_of(&dm)]);
    let _w = worker(&addr, &root, &[]);
    let mut loader = RemoteLoader::connect(&spec(&root, 1), options(&addr, "accelerator")).unwrap();
    // The trainer computes 20 ms a step: its client measures the busy fraction itself.
    for b in loader.iter() {
        b.unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    let busy = loader.accelerator_busy().unwrap();
    assert_eq!(busy.source, sluice_autoscale::BusySource::StepTiming);
    std::thread::sleep(Duration::from_millis(1200)); // a client heartbeat carries it
    let series = |text: &str, source: &str| -> Option<f64> {
        let l = text.lines().find(|l| {
            l.starts_with("sluice_client_accelerator_busy{") && l.contains(&format!("source=\"{source}\""))
        })?;
        l.rsplit(' ').next()?.parse().ok()
    };
    let d = http_get(&dm);
    let measured = series(&d, "step_timing").unwrap_or_else(|| panic!("no step-timing series in\n{d}"));
    assert!((measured - busy.busy).abs() < 0.2 && measured > 0.0, "{measured} vs the client's {}", busy.busy);
    // The trainer reads a device counter and reports it: the dispatcher shows that.
    loader.report_accelerator_busy(0.83);
    std::thread::sleep(Duration::from_millis(1200));
    let d = http_get(&dm);
    assert_eq!(series(&d, "reported"), Some(0.83), "{d}");
    assert_eq!(series(&d, "step_timing"), None, "one series per client: {d}");
}

#[test]
fn every_data_plane_and_compression_delivers_bit_identical_batches() {
    let _watchdog = watchdog("every_data_plane_and_compression_delivers_bit_identical_batches", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &[]);
    let _w = worker(&addr, &root, &[]);
    let s = spec(&root, 3);
    // The batches, sorted, and how many came through shared memory.
    let read = |addr: &str, job: &str, compression: Compression, plane: DataPlane| {
        let mut o = options(addr, job);
        o.compression = compression;
        o.data_plane = plane;
        let mut loader = RemoteLoader::connect(&s, o).unwrap();
        let mut batches: Vec<_> = loader.iter().map(|b| b.unwrap()).collect();
        batches.sort_by_key(|b| b.index);
        (batches, loader.shared_memory_batches())
    };
    let (plain, shared) = read(&addr, "plain", Compression::None, DataPlane::Tcp);
    assert_eq!((plain.len(), shared), (IMAGES.div_ceil(BATCH), 0));
    // The worker is on this machine: `auto` takes shared memory for every batch.
    assert_eq!(read(&addr, "local", Compression::None, DataPlane::Auto), (plain.clone(), plain.len() as u64));
    assert_eq!(read(&addr, "zstd-local", Compression::Zstd, DataPlane::Auto), (plain.clone(), plain.len() as u64));
    assert_eq!(read(&addr, "zstd-tcp", Compression::Zstd, DataPlane::Tcp), (plain.clone(), 0));
    assert_eq!(read(&addr, "zstd-grpc", Compression::Zstd, DataPlane::Grpc), (plain.clone(), 0));

    // A worker told not to share memory: `auto` falls back to TCP.
    let addr2 = free_addr();
    let _d2 = dispatcher(&addr2, &dir.path().join("journal2"), &root, &[]);
    let _w2 = worker(&addr2, &root, &["--no-shared-memory"]);
    assert_eq!(read(&addr2, "tcp-only", Compression::None, DataPlane::Auto), (plain, 0));
}

#[test]
fn jobs_with_one_fingerprint_share_the_workers_cache() {
    let _watchdog = watchdog("jobs_with_one_fingerprint_share_the_workers_cache", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let wm = free_addr();
    let port = wm.rsplit(':').next().unwrap().to_string();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &[]);
    let _w = worker(&addr, &root, &["--metrics-port", &port]);
    let mut s = spec(&root, 1);
    s.cache = Some(CacheSpec {
        budget: ByteBudget::Bytes(1 << 30),
        level: CacheLevel::Decoded,
        resize: None,
        policy: CachePolicyKind::Lru,
        disk: None,
        share: false,
    });
    let mut ids = Vec::new();
    for job in ["first", "second"] {
        let mut loader = RemoteLoader::connect(&s, options(&addr, job)).unwrap();
        ids.push(loader.job().job_id);
        assert_exactly_once(loader.iter().flat_map(|b| b.unwrap().keys).collect(), job);
    }
    assert_ne!(ids[0], ids[1], "two jobs");
    let w = http_get(&wm);
    // One cache for both jobs: every sample missed once (by the first job), and the second
    // job's whole epoch hit. Separate caches would show two series and twice the misses.
    let series = w.lines().filter(|l| l.starts_with("sluice_worker_cache_misses_total{")).count();
    assert_eq!(series, 1, "{w}");
    assert_eq!(metric_value(&w, "sluice_worker_cache_misses_total"), IMAGES as f64);
    assert!(metric_value(&w, "sluice_worker_cache_hits_total") >= IMAGES as f64, "{w}");
}

#[test]
fn a_workers_auto_cache_that_cannot_pay_stores_nothing_and_the_clients_stats_say_so() {
    let _watchdog = watchdog("a_workers_auto_cache_that_cannot_pay_stores_nothing_and_the_clients_stats_say_so", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let dm = free_addr();
    let port = dm.rsplit(':').next().unwrap().to_string();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &["--metrics-port", &port]);
    let _w = worker(&addr, &root, &[]);
    // A budget of one byte holds no entry at any level: caching would save nothing.
    let mut s = spec(&root, 1);
    s.cache = Some(CacheSpec {
        budget: ByteBudget::Bytes(1),
        level: CacheLevel::Auto,
        resize: None,
        policy: CachePolicyKind::Lru,
        disk: None,
        share: false,
    });
    let mut loader = RemoteLoader::connect(&s, options(&addr, "cannot-pay")).unwrap();
    for _ in 0..2 {
        assert_exactly_once(loader.iter().flat_map(|b| b.unwrap().keys).collect(), "cannot-pay");
    }
    // The worker's heartbeat brings its cache's decision to the dispatcher.
    let t0 = std::time::Instant::now();
    let stats = loop {
        let c = loader.cache_stats().unwrap();
        if c.workers_off == 1 || t0.elapsed() > std::time::Duration::from_secs(20) {
            break c;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!((stats.workers_off, stats.entries, stats.hits), (1, 0, 0), "{stats:?}");
    // Every lookup missed (the heartbeat may not have brought the last ones yet).
    assert!(stats.misses >= sluice_pipeline::cache::MEASURE_SAMPLES, "{stats:?}");
    let m = http_get(&dm);
    assert_eq!(metric_value(&m, "sluice_cache_workers_off"), 1.0, "{m}");
}

#[test]
fn a_worker_refuses_paths_outside_its_own_roots_even_if_the_dispatcher_allows_them() {
    let _watchdog = watchdog("a_worker_refuses_paths_outside_its_own_roots_even_if_the_dispatcher_allows_them", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    // The dispatcher allows the whole temp dir; the worker only `data/secret-free`.
    let _d = dispatcher(&addr, &dir.path().join("journal"), dir.path(), &[]);
    let narrow = dir.path().join("narrow");
    std::fs::create_dir_all(&narrow).unwrap();
    let _w = worker(&addr, &narrow, &[]);
    let mut loader = RemoteLoader::connect(&spec(&root, 0), options(&addr, "refused")).unwrap();
    let first = loader.iter().next().expect("an error, not the end of the epoch");
    match first {
        Err(ClientError::Rpc { status, .. }) => {
            assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
            assert!(status.message().contains("outside the allowed roots"), "{}", status.message());
        }
        other => panic!("expected a refusal, got {:?}", other.map(|b| b.index)),
    }
}

/// A CA and a server certificate it signed for 127.0.0.1 and localhost, as PEM files
/// (generated here: nothing is downloaded). Returns (ca, cert, key).
fn test_certs(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "sluice test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params.subject_alt_names.push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
    let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
    let paths = (dir.join("ca.pem"), dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&paths.0, ca.pem()).unwrap();
    std::fs::write(&paths.1, cert.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    paths
}

#[test]
fn tls_on_both_planes_serves_a_job_and_clients_without_the_ca_are_refused() {
    let _watchdog = watchdog("tls_on_both_planes_serves_a_job_and_clients_without_the_ca_are_refused", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let (ca, cert, key) = test_certs(dir.path());
    let (ca_s, cert_s, key_s) = (ca.to_str().unwrap(), cert.to_str().unwrap(), key.to_str().unwrap());
    let addr = free_addr();
    let tls = ["--tls-cert", cert_s, "--tls-key", key_s];
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &tls);
    let _w = worker(&addr, &root, &[&tls[..], &["--tls-ca", ca_s]].concat());

    // With the CA: control and data both over TLS (the client has no plain fallback).
    let mut o = options(&addr, "tls");
    o.tls_ca = Some(ca.clone());
    let mut loader = RemoteLoader::connect(&spec(&root, 0), o).unwrap();
    let keys: Vec<u64> = loader.iter().flat_map(|b| b.unwrap().keys).collect();
    assert_exactly_once(keys, "a job over TLS");

    // Plain TCP to a TLS dispatcher: refused, with an error saying so.
    let mut plain = options(&addr, "plain");
    plain.give_up_after = Duration::from_millis(500);
    let e = RemoteLoader::connect(&spec(&root, 0), plain).err().expect("a plain client is refused").to_string();
    assert!(e.contains("gave up") || e.contains("CreateJob"), "{e}");

    // A CA that did not sign the server's certificate: refused too.
    let other = tempfile::tempdir().unwrap();
    let (other_ca, _, _) = test_certs(other.path());
    let mut wrong = options(&addr, "wrong-ca");
    wrong.tls_ca = Some(other_ca);
    wrong.give_up_after = Duration::from_millis(500);
    assert!(RemoteLoader::connect(&spec(&root, 0), wrong).is_err(), "a certificate from another CA is not trusted");

    // A missing CA file is a clear error at once.
    let mut missing = options(&addr, "missing-ca");
    missing.tls_ca = Some(dir.path().join("nope.pem"));
    let e = RemoteLoader::connect(&spec(&root, 0), missing).err().expect("no CA file").to_string();
    assert!(e.contains("cannot read the TLS CA certificate"), "{e}");
}

#[test]
fn parallel_epochs_make_each_epoch_n_full_passes_in_different_orders_exactly_once_each() {
    let _watchdog =
        watchdog("parallel_epochs_make_each_epoch_n_full_passes_in_different_orders_exactly_once_each", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &[]);
    let _w: Vec<Server> = (0..2).map(|_| worker(&addr, &root, &[])).collect();
    let mut o = options(&addr, "parallel");
    o.parallel_epochs = 2;
    let mut loader = RemoteLoader::connect(&spec(&root, 5), o).unwrap();
    let pass = IMAGES.div_ceil(BATCH) as u64;
    assert_eq!(loader.batches_per_epoch(), 2 * pass);
    for epoch in 0..2 {
        let mut batches: Vec<(u64, Vec<u64>)> = loader.iter().map(|b| b.unwrap()).map(|b| (b.index, b.keys)).collect();
        batches.sort_unstable();
        assert_eq!(batches.iter().map(|b| b.0).collect::<Vec<_>>(), (0..2 * pass).collect::<Vec<_>>());
        let (first, second) = batches.split_at(pass as usize);
        let keys = |half: &[(u64, Vec<u64>)]| half.iter().flat_map(|b| b.1.clone()).collect::<Vec<u64>>();
        assert_ne!(keys(first), keys(second), "epoch {epoch}: the two passes come in different orders");
        assert_exactly_once(keys(first), &format!("epoch {epoch}, pass 0"));
        assert_exactly_once(keys(second), &format!("epoch {epoch}, pass 1"));
    }
    // The same name in distributed mode is another pipeline: refused.
    let e = RemoteLoader::connect(&spec(&root, 5), options(&addr, "parallel")).err().expect("a conflict").to_string();
    assert!(e.contains("another pipeline"), "{e}");
}

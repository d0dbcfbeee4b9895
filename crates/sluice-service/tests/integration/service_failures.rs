//! The service under failures a review found: bad samples skipped on workers, acks lost
//! while the dispatcher is away, a client of a shared job restarting its epoch, a
//! dispatcher restarted without its journal, and checkpoints loaded after an epoch ended.
//! A dispatcher and workers in this process (the dispatcher a process where it is killed)
//! on 127.0.0.1, a [`RemoteLoader`] in this process.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use sluice_client::{RemoteLoader, RemoteState};
use sluice_core::ErrorPolicy;
use sluice_pipeline::{Loader, Shard};
use sluice_synth::DatasetOptions;

use crate::support::*;

fn sorted(mut v: Vec<u64>) -> Vec<u64> {
    v.sort_unstable();
    v
}

#[test]
fn skipped_samples_reach_the_remote_client_as_they_do_the_local_loader() {
    let _watchdog = watchdog("skipped_samples_reach_the_remote_client_as_they_do_the_local_loader", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    let data = DatasetOptions { images: 20, classes: 2, texture: 8, corrupt: 5, ..Default::default() };
    let summary = sluice_synth::write_dataset(&root, &data, &|_| {}).unwrap();
    assert_eq!(summary.bad_files.len(), 5);
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &[]);
    let _w: Vec<Server> = (0..2).map(|_| worker(&addr, &root, &[])).collect();
    // One sample per batch: a bad sample leaves its whole batch empty.
    let mut s = spec(&root, 5);
    s.batch.size = 1;
    s.on_error = ErrorPolicy::Skip;

    let local = Loader::new(s.clone(), Shard::default()).unwrap();
    let local_keys: Vec<u64> = local.iter().flat_map(|b| b.unwrap().keys).collect();
    let local_skipped = local.stats().skipped;
    assert_eq!(local_skipped.len(), 5);

    let remote = RemoteLoader::connect(&s, options(&addr, "skip")).unwrap();
    assert_eq!(remote.batches_per_epoch(), 25);
    let (epochs, remote) = within(60, "two epochs with skipped samples", move || {
        let mut remote = remote;
        let epochs: Vec<Vec<u64>> = (0..2).map(|_| remote.iter().flat_map(|b| b.unwrap().keys).collect()).collect();
        (epochs, remote)
    });
    for (epoch, keys) in epochs.into_iter().enumerate() {
        assert_eq!(sorted(keys), sorted(local_keys.clone()), "epoch {epoch}: the good samples, once each");
    }
    assert_eq!(remote.epoch(), 2);
    // Every bad sample reported once per epoch, with its key, path and error, as locally.
    let mut by_key: HashMap<u64, usize> = HashMap::new();
    for s in remote.skipped() {
        *by_key.entry(s.key).or_default() += 1;
        let local = local_skipped.iter().find(|l| l.key == s.key).expect("a key the local loader skipped too");
        assert_eq!((&s.path, &s.error), (&local.path, &local.error));
    }
    assert_eq!(by_key.len(), 5, "{:?}", remote.skipped());
    assert!(by_key.values().all(|&n| n == 2), "each bad sample once per epoch: {by_key:?}");
}

#[test]
fn an_ack_sent_while_the_dispatcher_is_down_is_not_lost() {
    let _watchdog = watchdog("an_ack_sent_while_the_dispatcher_is_down_is_not_lost", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let journal = dir.path().join("journal");
    let mut d = dispatcher_process(&addr, &journal, &root, &[]);
    let _w = worker(&addr, &root, &[]);
    // One fetcher, tasks of 3 batches, a channel of 2: when the trainer takes the last batch
    // of task 0 the fetcher is busy streaming task 1 from its worker, so only the ack talks
    // to the dispatcher while it is away, and it gives up after a second.
    let mut o = options(&addr, "lost-ack");
    o.tasks_in_flight = 1;
    o.task_batches = 3;
    o.give_up_after = Duration::from_secs(1);
    let mut loader = RemoteLoader::connect(&spec(&root, 11), o).unwrap();
    let (to_main, from_reader) = mpsc::channel::<()>();
    let (to_reader, from_main) = mpsc::channel::<()>();
    let reader = std::thread::spawn(move || {
        let mut keys = Vec::new();
        for (i, b) in loader.iter().enumerate() {
            keys.extend(b.unwrap().keys);
            if i == 1 {
                // Time for the fetcher to lease task 1 and block on the full channel.
                std::thread::sleep(Duration::from_millis(1500));
            }
            if i == 1 || i == 2 {
                // After batch 1: the dispatcher goes away. After batch 2 (task 0's ack on its
                // way): it comes back only once the ack has given up.
                to_main.send(()).unwrap();
                from_main.recv().unwrap();
            }
        }
        (keys, loader.epoch())
    });
    from_reader.recv().unwrap();
    d.kill();
    to_reader.send(()).unwrap();
    from_reader.recv().unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    d = dispatcher_process(&addr, &journal, &root, &[]);
    // Up and answering before the trainer goes on (its fetcher's next request gives up
    // after a second too).
    while std::net::TcpStream::connect(&addr).is_err() {
        std::thread::sleep(Duration::from_millis(20));
    }
    to_reader.send(()).unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(reader.join());
    });
    let (keys, epoch) = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the epoch never ended: an ack was lost and the task stays leased")
        .unwrap();
    assert_exactly_once(keys, "epoch 0 with an ack sent during an outage");
    assert_eq!(epoch, 1);
    drop(d);
}

/// A client that drops its iterator stops its fetchers, but a GetTask of theirs may still
/// be at the dispatcher, long-polling for a task. Its restart hands its tasks back, which
/// wakes that request: it must lease nothing, or the task stays leased to a client whose
/// new stream never reads it (and whose heartbeats keep the lease), and the epoch never
/// ends. (What hung `a_checkpoint_resumes...` in CI once.) The client's protocol by hand.
#[test]
fn a_request_of_a_stopped_stream_leases_nothing_after_its_client_restarts() {
    use sluice_client::proto::dispatcher_client::DispatcherClient;
    use sluice_client::proto::{get_task_reply::Status, ClientHeartbeatRequest, GetTaskRequest, ResetJobRequest};

    let _watchdog = watchdog("a_request_of_a_stopped_stream_leases_nothing_after_its_client_restarts", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &[]);
    let _w = worker(&addr, &root, &[]);
    let job = RemoteLoader::connect(&spec(&root, 3), options(&addr, "stopped")).unwrap().job().clone();
    let tasks = job.batches_per_epoch.div_ceil(job.task_batches);
    assert!(tasks >= 2, "{tasks} tasks");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let channel =
            tonic::transport::Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
        let mut d = DispatcherClient::new(channel);
        let client = "restarting".to_string();
        let hb = ClientHeartbeatRequest { job_id: job.job_id, client_id: client.clone(), ..Default::default() };
        d.client_heartbeat(hb).await.unwrap();
        let get = |request_id| GetTaskRequest {
            job_id: job.job_id,
            client_id: client.clone(),
            request_id,
            ..Default::default()
        };
        // The first stream leases every task of the epoch, then long-polls for more.
        for r in 1..=tasks {
            let reply = d.get_task(get(r)).await.unwrap().into_inner();
            assert_eq!(reply.status(), Status::Task, "request {r}");
        }
        let mut polling = d.clone();
        let stale = get(tasks + 1);
        let stale = tokio::spawn(async move { polling.get_task(stale).await });
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
        // The client restarts: its tasks go back, and its new stream's ids start above.
        let first_request = tasks + 2;
        let release = ResetJobRequest {
            job_id: job.job_id,
            release_client: client.clone(),
            client_id: client.clone(),
            first_request,
            ..Default::default()
        };
        d.reset_job(release).await.unwrap();
        match stale.await.unwrap() {
            Err(e) => {
                assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
                assert!(e.message().contains("stopped"), "{}", e.message());
            }
            Ok(reply) => panic!("a request of the stopped stream was answered {:?}", reply.into_inner()),
        }
        // The new stream gets every task of the epoch back.
        for r in first_request..first_request + tasks {
            let reply = d.get_task(get(r)).await.unwrap().into_inner();
            assert_eq!(reply.status(), Status::Task, "request {r} of the new stream");
        }
    });
}

#[test]
fn a_client_restarting_its_epoch_in_a_shared_job_leaves_the_others_batches_alone() {
    let _watchdog = watchdog("a_client_restarting_its_epoch_in_a_shared_job_leaves_the_others_batches_alone", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &[]);
    let _w: Vec<Server> = (0..2).map(|_| worker(&addr, &root, &[])).collect();
    let mut o = options(&addr, "shared-restart");
    o.tasks_in_flight = 2;
    let mut a = RemoteLoader::connect(&spec(&root, 9), o.clone()).unwrap();
    let b = RemoteLoader::connect(&spec(&root, 9), o).unwrap();
    assert_eq!(a.job().job_id, b.job().job_id);
    let b_read = Arc::new(AtomicUsize::new(0));
    let counter = b_read.clone();
    let reader = std::thread::spawn(move || {
        let mut b = b;
        let mut keys = Vec::new();
        for batch in b.iter() {
            keys.extend(batch.unwrap().keys);
            counter.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(30));
        }
        keys
    });
    while b_read.load(Ordering::SeqCst) < 2 {
        std::thread::sleep(Duration::from_millis(5));
    }
    // `a` breaks out of its loop after two batches and iterates again.
    let mut ka: Vec<u64> = a.iter().take(2).flat_map(|b| b.unwrap().keys).collect();
    let (rest, a) = within(60, "client a's second loop", move || {
        let rest: Vec<u64> = a.iter().flat_map(|b| b.unwrap().keys).collect();
        (rest, a)
    });
    ka.extend(rest);
    let kb = within(60, "client b", move || reader.join().unwrap());
    assert!(!kb.is_empty());
    assert_exactly_once([ka, kb].concat(), "two clients, one restarting its loop");
    assert_eq!(a.epoch(), 1);
}

#[test]
fn a_dispatcher_restarted_without_its_journal_gets_the_new_jobs_data_from_workers() {
    let _watchdog = watchdog("a_dispatcher_restarted_without_its_journal_gets_the_new_jobs_data_from_workers", 120);
    let dir = tempfile::tempdir().unwrap();
    let first = dataset(dir.path());
    let second = dir.path().join("second");
    let options2 = DatasetOptions { images: 24, classes: 3, texture: 8, seed: 99, ..Default::default() };
    sluice_synth::write_dataset(&second, &options2, &|_| {}).unwrap();
    let addr = free_addr();
    let mut d = dispatcher_process(&addr, &dir.path().join("journal-1"), dir.path(), &[]);
    let _w: Vec<Server> = (0..2).map(|_| worker(&addr, dir.path(), &[])).collect();
    let mut old = RemoteLoader::connect(&spec(&first, 1), options(&addr, "old")).unwrap();
    assert_eq!(old.job().job_id, 1);
    assert_exactly_once(old.iter().flat_map(|b| b.unwrap().keys).collect(), "the first job");
    drop(old);

    // A fresh dispatcher: job 1 is now another job over another dataset.
    d.kill();
    let _d = dispatcher(&addr, &dir.path().join("journal-2"), dir.path(), &[]);
    let s = spec(&second, 2);
    let mut new = RemoteLoader::connect(&s, options(&addr, "new")).unwrap();
    assert_eq!(new.job().job_id, 1);
    let local = Loader::new(s, Shard::default()).unwrap();
    let expected: HashMap<u64, sluice_core::Batch> = local.iter().map(|b| b.unwrap()).map(|b| (b.index, b)).collect();
    let got: Vec<sluice_core::Batch> = within(60, "the new job", move || new.iter().map(|b| b.unwrap()).collect());
    assert_eq!(got.len(), expected.len());
    for b in got {
        let want = &expected[&b.index];
        assert_eq!(b.keys, want.keys, "batch {}: keys of the new dataset", b.index);
        assert_eq!(b.images.as_bytes(), want.images.as_bytes(), "batch {}: pixels of the new dataset", b.index);
    }
}

#[test]
fn load_state_after_an_epoch_ended_rolls_back_and_forward_exactly() {
    let _watchdog = watchdog("load_state_after_an_epoch_ended_rolls_back_and_forward_exactly", 120);
    let dir = tempfile::tempdir().unwrap();
    let root = dataset(dir.path());
    let addr = free_addr();
    let _d = dispatcher(&addr, &dir.path().join("journal"), &root, &[]);
    let _w: Vec<Server> = (0..2).map(|_| worker(&addr, &root, &[])).collect();
    let mut loader = RemoteLoader::connect(&spec(&root, 4), options(&addr, "rollback")).unwrap();
    let head: Vec<u64> = loader.iter().take(5).flat_map(|b| b.unwrap().keys).collect();
    let mid = loader.state();
    let rest: Vec<u64> = loader.iter().flat_map(|b| b.unwrap().keys).collect();
    assert_exactly_once([head, rest.clone()].concat(), "epoch 0");
    assert_eq!(loader.epoch(), 1);

    // Back to the middle of epoch 0: exactly the batches that followed it, again.
    loader.load_state(&mid).unwrap();
    let (again, mut loader) = within(60, "rolling back", move || {
        let again: Vec<u64> = loader.iter().flat_map(|b| b.unwrap().keys).collect();
        (again, loader)
    });
    assert_eq!(sorted(again), sorted(rest), "the rest of epoch 0 after rolling back");
    assert_eq!(loader.epoch(), 1);

    // Forward to epoch 3 with its first two batches delivered.
    let later = RemoteState { epoch: 3, delivered: vec![0, 1], ..mid };
    loader.load_state(&later).unwrap();
    let batches: Vec<sluice_core::Batch> = within(60, "rolling forward", move || {
        let b: Vec<sluice_core::Batch> = loader.iter().map(|b| b.unwrap()).collect();
        assert_eq!(loader.epoch(), 4);
        b
    });
    assert!(batches.iter().all(|b| b.epoch == 3));
    assert_eq!(sorted(batches.iter().map(|b| b.index).collect()), (2..12).collect::<Vec<u64>>());
}

//! Hostile jobs against a real service (issue 38): specs whose datasets reach out of the
//! allowed roots through symlinks, for every source kind, and COCO files whose masks cost
//! minutes to paint, while a real job keeps reading its epochs and no worker dies.
//!
//! Each test starts [`UnderAttack`] (a dispatcher in this process, two worker processes
//! allowed only `allowed/`, and the good job reading epochs on a thread of its own), makes
//! its hostile jobs, and ends with [`UnderAttack::finish`]: the good job read every sample
//! of every epoch exactly once, and every worker still runs. A new kind of hostile job (user
//! code through the service: unlisted modules, name variants, hanging functions) is one
//! more `#[test]` of that shape, its workers' flags given to [`UnderAttack::start`].

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support::*;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sluice_client::{ClientError, RemoteLoader, RemoteOptions, ServiceErrorKind};
use sluice_core::{ErrorPolicy, FieldKindName, FieldSpec, MixedSource, PipelineSpec, SourceSpec};
use sluice_synth::DatasetOptions;

const TOKEN: &str = "hostile-jobs-token";

/// What a file outside the roots holds; never to be served.
const SECRET: &str = "PRIVATE-KEY-3f9a1c-never-served";

/// A service under attack: a dispatcher in this process and two worker processes that may
/// read only `allowed`, and the good job reading epochs until [`UnderAttack::finish`].
pub(crate) struct UnderAttack {
    /// Holds the test folder until the attack ends.
    _dir: tempfile::TempDir,
    /// The only root the service allows; the good job's dataset is `allowed/data`.
    pub allowed: PathBuf,
    /// Files no job may read: a sidecar holding [`SECRET`], an image, a mask, a shard.
    pub outside: PathBuf,
    pub addr: String,
    workers: Vec<Proc>,
    stop: Arc<AtomicBool>,
    good: Option<JoinHandle<()>>,
    _dispatcher: Server,
    _watchdog: Watchdog,
}

impl UnderAttack {
    /// Starts the service, its workers with `worker_flags` besides the usual ones, and the
    /// good job.
    pub fn start(name: &'static str, worker_flags: &[&str]) -> Self {
        Self::start_with(name, worker_flags, false)
    }

    /// As [`Self::start`]; with `dispatcher_allows_all`, the dispatcher allows the whole
    /// test folder (`outside` too), so that only the workers' own roots refuse.
    pub fn start_with(name: &'static str, worker_flags: &[&str], dispatcher_allows_all: bool) -> Self {
        let watchdog = watchdog(name, 240);
        let dir = tempfile::tempdir().unwrap();
        let allowed = dir.path().join("allowed");
        let good_root = dataset(&allowed);
        let outside = dir.path().join("outside");
        write_outside(&outside, &good_root);
        let addr = free_addr();
        let dispatcher_root = if dispatcher_allows_all { dir.path() } else { allowed.as_path() };
        let dispatcher = dispatcher(&addr, &dir.path().join("journal"), dispatcher_root, &["--token", TOKEN]);
        let root = allowed.to_str().unwrap();
        let mut flags = vec!["--dispatcher", &addr, "--allow-root", root, "--token", TOKEN, "--threads", "2"];
        flags.extend_from_slice(worker_flags);
        let workers = (0..2).map(|_| serve_process("worker", &flags)).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let good = {
            let (o, stop) = (client(&addr, "good"), stop.clone());
            std::thread::spawn(move || {
                let mut loader = RemoteLoader::connect(&spec(&good_root, 7), o).unwrap();
                // Two epochs at least, and on while the attack lasts.
                while loader.epoch() < 2 || !stop.load(Ordering::Relaxed) {
                    let epoch = loader.epoch();
                    let keys = loader.iter().flat_map(|b| b.unwrap().keys).collect();
                    assert_exactly_once(keys, &format!("good job, epoch {epoch}"));
                }
            })
        };
        Self {
            _dir: dir,
            allowed,
            outside,
            addr,
            workers,
            stop,
            good: Some(good),
            _dispatcher: dispatcher,
            _watchdog: watchdog,
        }
    }

    /// Options of a client of job `job` on this service.
    pub fn options(&self, job: &str) -> RemoteOptions {
        client(&self.addr, job)
    }

    /// A folder for a hostile dataset, under the allowed root.
    pub fn hostile(&self, name: &str) -> PathBuf {
        let d = self.allowed.join("hostile").join(name);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// An image of the good dataset, to build hostile datasets from.
    pub fn image(&self) -> PathBuf {
        self.allowed.join("data/class_000/img_0000000.jpg")
    }

    /// Creates job `job` with `spec`, which must be refused for reaching out of the roots;
    /// returns the refusal. A job that is taken instead is read, to say what it served.
    pub fn refused_out_of_roots(&self, job: &str, spec: &PipelineSpec) -> String {
        match RemoteLoader::connect(spec, self.options(job)) {
            Err(e) => {
                let text = e.to_string();
                assert_eq!(
                    e.kind(),
                    ServiceErrorKind::PermissionDenied,
                    "{job}: refused, but not by the roots: {text}"
                );
                assert!(text.contains("allowed roots") && text.contains("--allow-root"), "{job}: {text}");
                assert!(!text.contains(SECRET), "{job}: the refusal quotes the secret: {text}");
                text
            }
            Ok(mut loader) => {
                let served: Vec<String> = loader.iter().map(|b| describe(&b)).collect();
                let leaked = served.iter().any(|s| s.contains(SECRET));
                panic!(
                    "{job}: a job reaching out of the roots was taken (secret served: {leaked}); it served {served:?}"
                )
            }
        }
    }

    /// Ends the attack: the good job read every epoch exactly once, and no worker died.
    pub fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(good) = self.good.take() {
            good.join().expect("the good job failed while hostile jobs ran");
        }
        for (i, w) in self.workers.iter_mut().enumerate() {
            assert!(w.0.try_wait().unwrap().is_none(), "worker {i} died");
        }
    }
}

fn client(addr: &str, job: &str) -> RemoteOptions {
    let mut o = options(addr, job);
    o.token = Some(TOKEN.into());
    o
}

/// A batch as text (its keys and fields, what a leak would show in), or its error.
fn describe(b: &Result<sluice_core::Batch, ClientError>) -> String {
    match b {
        Ok(b) => format!("keys {:?} fields {:?}", b.keys, b.fields),
        Err(e) => format!("error: {e}"),
    }
}

/// The files outside the roots: a key as a sidecar would hold it, an image, a mask, a file
/// list, a COCO file, a tar shard and a (pretend) Parquet file.
fn write_outside(outside: &Path, good: &Path) {
    std::fs::create_dir_all(outside).unwrap();
    let image = good.join("class_000/img_0000000.jpg");
    std::fs::write(outside.join("key.json"), format!(r#"{{"private_key": "{SECRET}"}}"#)).unwrap();
    std::fs::copy(&image, outside.join("img.jpg")).unwrap();
    std::fs::create_dir_all(outside.join("class")).unwrap();
    std::fs::copy(&image, outside.join("class/x.jpg")).unwrap();
    std::fs::write(outside.join("mask.png"), b"a mask no job may read").unwrap();
    std::fs::write(outside.join("list.txt"), format!("{} 1\n", image.display())).unwrap();
    std::fs::write(outside.join("instances.json"), r#"{"images": [{"id": 1, "file_name": "a.jpg"}]}"#).unwrap();
    std::fs::write(outside.join("p.parquet"), b"PAR1 not really PAR1").unwrap();
    let options = DatasetOptions { images: 4, classes: 1, boxes: true, masks: true, ..Default::default() };
    sluice_synth::write_tar_shards(&outside.join("shards"), &options, 1, &|_| {}).unwrap();
}

fn symlink(target: &Path, link: &Path) {
    std::os::unix::fs::symlink(target, link).unwrap();
}

fn job(source: SourceSpec) -> PipelineSpec {
    let mut s = PipelineSpec::train_default(source, 32, BATCH);
    s.threads = 1.into();
    s
}

/// The sidecar dataset of issue 38: `a.jpg`, and `a.json` a symlink to a key outside.
fn sidecar_out(s: &UnderAttack) -> PathBuf {
    let d = s.hostile("sidecar");
    std::fs::copy(s.image(), d.join("a.jpg")).unwrap();
    symlink(&s.outside.join("key.json"), &d.join("a.json"));
    d
}

/// Asks the sidecars of `spec` for the key as a text field.
fn asking_for_the_key(mut spec: PipelineSpec) -> PipelineSpec {
    spec.fields = vec![FieldSpec { name: "private_key".into(), kind: FieldKindName::Text, classes: None }];
    spec
}

#[test]
fn jobs_reaching_out_of_the_roots_are_refused_for_every_source_kind() {
    let s = UnderAttack::start("jobs_reaching_out_of_the_roots_are_refused_for_every_source_kind", &[]);
    let mut refusals: Vec<(&str, String, &str)> = Vec::new();
    let mut refuse = |what: &'static str, spec: PipelineSpec, names: &'static str| {
        refusals.push((what, s.refused_out_of_roots(what, &spec), names));
    };

    // sidecar: the issue's key, asked for as a text field; and a mask symlinked out.
    let root = sidecar_out(&s);
    refuse("sidecar", asking_for_the_key(job(SourceSpec::Sidecar { root: root.clone(), masks: false })), "a.json");
    let masked = s.hostile("sidecar-mask");
    std::fs::copy(s.image(), masked.join("a.jpg")).unwrap();
    std::fs::write(masked.join("a.json"), r#"{"mask": "a.mask.png"}"#).unwrap();
    symlink(&s.outside.join("mask.png"), &masked.join("a.mask.png"));
    refuse("sidecar-mask", job(SourceSpec::Sidecar { root: masked, masks: true }), "a.mask.png");

    // image_folder: an image symlinked out, and a class folder.
    let folder = s.hostile("folder");
    std::fs::create_dir_all(folder.join("c")).unwrap();
    symlink(&s.outside.join("img.jpg"), &folder.join("c/a.jpg"));
    refuse("image_folder", job(SourceSpec::ImageFolder { root: folder.clone() }), "a.jpg");
    // mix: a good source and one reaching out (sources with boxes are not mixed yet).
    let good = SourceSpec::ImageFolder { root: s.allowed.join("data") };
    let mix = SourceSpec::Mix {
        sources: vec![
            MixedSource { source: good, weight: 1.0 },
            MixedSource { source: SourceSpec::ImageFolder { root: folder.clone() }, weight: 1.0 },
        ],
    };
    refuse("mix", job(mix), "a.jpg");

    let classes = s.hostile("folder-class");
    std::fs::create_dir_all(classes.join("c")).unwrap();
    std::fs::copy(s.image(), classes.join("c/a.jpg")).unwrap();
    symlink(&s.outside.join("class"), &classes.join("d"));
    refuse("image_folder-class", job(SourceSpec::ImageFolder { root: classes }), "x.jpg");

    // file_list: the list itself symlinked out, and a list naming a file out by `..`.
    let lists = s.hostile("list");
    symlink(&s.outside.join("list.txt"), &lists.join("list.txt"));
    refuse("file_list", job(SourceSpec::FileList { path: lists.join("list.txt"), root: None }), "list.txt");
    std::fs::write(lists.join("dotdot.txt"), "../../../outside/img.jpg 1\n").unwrap();
    refuse("file_list-dotdot", job(SourceSpec::FileList { path: lists.join("dotdot.txt"), root: None }), "img.jpg");

    // tar, with sidecars and masks: a shard symlinked out.
    let tar = s.hostile("tar");
    symlink(&s.outside.join("shards").join(sluice_synth::shard_name(0)), &tar.join("s.tar"));
    let shards = vec![tar.join("s.tar")];
    refuse("tar", job(SourceSpec::Tar { shards, sidecars: true, masks: true }), "s.tar");

    // parquet: a file symlinked out.
    let pq = s.hostile("parquet");
    symlink(&s.outside.join("p.parquet"), &pq.join("p.parquet"));
    let parquet = SourceSpec::Parquet { path: pq.join("p.parquet"), image_column: "image".into(), label_column: None };
    refuse("parquet", job(parquet), "p.parquet");

    // coco: the annotation file symlinked out, and an image it names.
    let coco = s.hostile("coco");
    symlink(&s.outside.join("instances.json"), &coco.join("instances.json"));
    let images = s.allowed.join("data");
    let spec = job(SourceSpec::Coco { annotations: coco.join("instances.json"), images, masks: false });
    refuse("coco", spec, "instances.json");
    let coco_images = s.hostile("coco-images");
    std::fs::write(coco_images.join("instances.json"), r#"{"images": [{"id": 1, "file_name": "a.jpg"}]}"#).unwrap();
    symlink(&s.outside.join("img.jpg"), &coco_images.join("a.jpg"));
    let spec =
        job(SourceSpec::Coco { annotations: coco_images.join("instances.json"), images: coco_images, masks: false });
    refuse("coco-image", spec, "a.jpg");

    for (what, text, names) in &refusals {
        assert!(text.contains(names), "{what}: the refusal does not name {names}: {text}");
    }
    s.finish();
}

#[test]
fn workers_refuse_what_their_own_roots_do_not_allow() {
    // The dispatcher allows everything here: each worker's own roots are what refuse.
    let s = UnderAttack::start_with("workers_refuse_what_their_own_roots_do_not_allow", &[], true);
    let mut o = s.options("sidecar-on-workers");
    o.give_up_after = Duration::from_secs(10);
    let spec = asking_for_the_key(job(SourceSpec::Sidecar { root: sidecar_out(&s), masks: false }));
    let mut loader = RemoteLoader::connect(&spec, o).unwrap();
    let served: Vec<String> = loader.iter().map(|b| describe(&b)).collect();
    assert!(!served.iter().any(|b| b.contains(SECRET)), "the key was served: {served:?}");
    let refused = served.iter().find(|b| b.starts_with("error")).unwrap_or_else(|| panic!("no refusal: {served:?}"));
    assert!(refused.contains("a.json") && refused.contains("allowed roots"), "{refused}");
    s.finish();
}

/// A COCO file of about 1 KB: one 16x16 image whose annotations declare it 8192x8192 with eight
/// RLE masks setting every one of those pixels (half a billion writes), and an honest one.
fn mask_bomb(s: &UnderAttack) -> SourceSpec {
    let d = s.hostile("mask-bomb");
    let (w, h) = (16, 16);
    std::fs::write(d.join("bomb.jpg"), sluice_synth::noise_jpeg(0, w).unwrap()).unwrap();
    std::fs::write(d.join("honest.jpg"), sluice_synth::noise_jpeg(1, w).unwrap()).unwrap();
    let bomb: Vec<String> = (0..8)
        .map(|i| {
            format!(
                r#"{{"id": {i}, "image_id": 1, "bbox": [0, 0, 1, 1], "category_id": 1,
                    "segmentation": {{"counts": [0, 67108864], "size": [8192, 8192]}}}}"#
            )
        })
        .collect();
    let json = format!(
        r#"{{"images": [{{"id": 1, "file_name": "bomb.jpg", "width": 8192, "height": 8192}},
                        {{"id": 2, "file_name": "honest.jpg", "width": {w}, "height": {h}}}],
            "annotations": [{}, {{"id": 9, "image_id": 2, "bbox": [0, 0, 1, 1], "category_id": 3,
                                  "segmentation": {{"counts": [0, {}], "size": [{h}, {w}]}}}}]}}"#,
        bomb.join(","),
        w * h
    );
    std::fs::write(d.join("instances.json"), json).unwrap();
    SourceSpec::Coco { annotations: d.join("instances.json"), images: d, masks: true }
}

#[test]
fn a_mask_bomb_fails_its_sample_at_once_and_leaves_the_workers_serving() {
    let s = UnderAttack::start("a_mask_bomb_fails_its_sample_at_once_and_leaves_the_workers_serving", &[]);
    let source = mask_bomb(&s);
    // Failing: the job stops at the bomb, naming it, long before it could have painted it.
    let mut spec = job(source.clone());
    spec.batch.size = 1;
    spec.shuffle = sluice_core::ShuffleSpec::None;
    let t0 = Instant::now();
    let mut loader = RemoteLoader::connect(&spec, s.options("bomb-fail")).unwrap();
    let err = loader.iter().find_map(Result::err).expect("the bomb's sample failed the job").to_string();
    let took = t0.elapsed();
    assert!(err.contains("bomb.jpg") && err.contains("declare a 8192x8192"), "{err}");
    assert!(took < Duration::from_secs(20), "refusing the bomb took {took:?}: {err}");
    // Skipping: the honest image is served with its mask, epoch after epoch (in a batch
    // of two: a batch whose only sample was skipped comes without masks, which the
    // client refuses; a separate defect).
    spec.on_error = ErrorPolicy::Skip;
    spec.batch.size = 2;
    let mut loader = RemoteLoader::connect(&spec, s.options("bomb-skip")).unwrap();
    for _ in 0..2 {
        let t0 = Instant::now();
        let batches: Vec<_> = loader.iter().map(|b| b.unwrap()).collect();
        assert_eq!(batches.iter().map(|b| b.keys.len()).sum::<usize>(), 1, "only the honest image is served");
        assert!(batches[0].boxes.as_ref().is_some_and(|b| b.masks.is_some()), "the honest image comes with its mask");
        assert!(t0.elapsed() < Duration::from_secs(20), "an epoch with the bomb took {:?}", t0.elapsed());
    }
    s.finish();
}

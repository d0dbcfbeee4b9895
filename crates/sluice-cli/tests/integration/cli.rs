//! The `sluice` command end to end: generate a dataset with bad files, run a spec over it
//! under the skip policy; learners lined up by `--barrier`; flags refused; moved commands
//! still answer to their old names.

#![allow(clippy::unwrap_used)] // test fixtures: a failure to set up is a test failure

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn sluice(args: &[&str], cwd: &Path) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice")).args(args).current_dir(cwd).output().unwrap();
    assert!(out.status.success(), "sluice {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    out
}

#[test]
fn gen_and_run_work_on_a_dataset_with_bad_files() {
    let dir = tempfile::tempdir().unwrap();
    sluice(&["gen-images", "--out", "train", "--images", "12", "--classes", "3", "--corrupt", "5"], dir.path());
    let spec = r#"
on_error = "skip"
threads = 2
[source]
kind = "image_folder"
root = "train"
[[ops]]
op = "decode"
[[ops]]
op = "random_resized_crop"
size = 64
[[ops]]
op = "random_horizontal_flip"
[batch]
size = 4
"#;
    std::fs::write(dir.path().join("spec.toml"), spec).unwrap();
    let out = sluice(&["run", "spec.toml", "--epochs", "2", "--json"], dir.path());
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stats["samples"], 24, "12 good images, 2 epochs");
    let skipped = stats["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 10, "5 bad files, each epoch");
    assert!(skipped.iter().all(|s| s["path"].as_str().unwrap().contains("bad_")));

    // The human report lists each bad file once, naming its key and path once.
    let out = sluice(&["run", "spec.toml", "--epochs", "2"], dir.path());
    let report = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = report.lines().filter(|l| l.contains("bad_")).collect();
    assert_eq!(lines.len(), 5, "one line per bad file:\n{report}");
    for line in lines {
        assert_eq!(line.matches("bad_").count(), 1, "the path is named once: {line}");
        assert_eq!(line.matches("sample #").count() + line.matches("key ").count(), 1, "the key is named once: {line}");
    }
}

#[test]
fn logs_written_to_a_file_carry_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    sluice(&["gen-images", "--out", "train", "--images", "6", "--classes", "2", "--corrupt", "2"], dir.path());
    let spec = "on_error = \"skip\"\nthreads = 1\n[source]\nkind = \"image_folder\"\nroot = \"train\"\n\
                [[ops]]\nop = \"decode\"\n[[ops]]\nop = \"center_crop\"\nsize = 32\n[batch]\nsize = 2\n";
    std::fs::write(dir.path().join("spec.toml"), spec).unwrap();
    let log = dir.path().join("log");
    let status = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["run", "spec.toml"])
        .current_dir(dir.path())
        .env("SLUICE_LOG", "info")
        .env_remove("NO_COLOR")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .status()
        .unwrap();
    assert!(status.success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("WARN") || text.contains("INFO"), "the run logged nothing to check:\n{text}");
    assert!(!text.contains('\x1b'), "`sluice run ... 2> log` wrote colour codes:\n{text:?}");
}

#[test]
fn gen_writes_tar_shards_that_a_tar_source_reads_with_sidecar_fields() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["gen-images", "--out", "shards", "--images", "12", "--classes", "3", "--corrupt", "2", "--fields"];
    sluice(&[&args[..], &["--tar-shards", "3"]].concat(), dir.path());
    let mut written: Vec<String> = std::fs::read_dir(dir.path().join("shards"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    written.sort();
    assert_eq!(written, ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]);
    let spec = |field: &str| {
        format!(
            r#"
on_error = "skip"
threads = 2
fields = [
    {{ name = "id", kind = "int" }},
    {{ name = "caption", kind = "text" }},
    {{ name = "score", kind = "float" }},
    {{ name = "tags", kind = "multi_label", classes = 3 }},
    {field}
]
ops = [{{ op = "decode" }}, {{ op = "center_crop", size = 32 }}]
[source]
kind = "tar"
shards = ["shards/shard-000000.tar", "shards/shard-000001.tar", "shards/shard-000002.tar"]
sidecars = true
[batch]
size = 4
"#
        )
    };
    let run = |field: &str| -> serde_json::Value {
        std::fs::write(dir.path().join("spec.toml"), spec(field)).unwrap();
        let out = sluice(&["run", "spec.toml", "--json"], dir.path());
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // Every generated sample's fields read from its sidecar member; the bad files skipped.
    let stats = run("");
    assert_eq!(stats["samples"], 12, "{stats}");
    let skipped = stats["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 2, "{stats}");
    assert!(skipped.iter().all(|s| s["path"].as_str().unwrap().contains("shard-000002.tar:bad_")), "{stats}");
    // A field the sidecars lack fails each sample by name: the fields are really read.
    let stats = run(r#"{ name = "nope", kind = "int" }"#);
    assert_eq!(stats["samples"], 0, "{stats}");
    let skipped = stats["skipped"].as_array().unwrap();
    let missing = skipped.iter().filter(|s| s["error"].as_str().unwrap().contains("field `nope` is missing")).count();
    assert_eq!(missing, 12, "{stats}");
}

#[test]
fn a_bad_spec_fails_with_the_field_named() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.toml"),
        "[source]\nkind = \"image_folder\"\nroot = \"x\"\n[[ops]]\nop = \"decode\"\n[batch]\nsize = 0\n",
    )
    .unwrap();
    let out =
        Command::new(env!("CARGO_BIN_EXE_sluice")).args(["run", "bad.toml"]).current_dir(dir.path()).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("batch.size"), "{err}");
}

#[test]
fn pack_rewrites_jpegs_keeps_everything_else_and_lists_what_it_could_not_rewrite() {
    let dir = tempfile::tempdir().unwrap();
    sluice(&["gen-images", "--out", "train", "--images", "6", "--classes", "2", "--corrupt", "5"], dir.path());
    std::fs::write(dir.path().join("train/labels.txt"), "not an image\n").unwrap();
    let out = sluice(&["pack", "train", "packed", "--interval", "2"], dir.path());
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("packed 6 JPEGs"), "{report}");
    // The bad files that carry a .jpg name are listed by path and copied as they are.
    assert!(report.contains("could not be rewritten") && report.contains("bad_"), "{report}");
    let count = |p: &Path| {
        std::fs::read_dir(p)
            .unwrap()
            .map(|c| std::fs::read_dir(c.unwrap().path()).map_or(1, |d| d.count()))
            .sum::<usize>()
    };
    assert_eq!(count(&dir.path().join("train")), count(&dir.path().join("packed")));
    assert_eq!(std::fs::read(dir.path().join("packed/labels.txt")).unwrap(), b"not an image\n");
    for class in
        std::fs::read_dir(dir.path().join("train")).unwrap().filter_map(|c| c.ok()).filter(|c| c.path().is_dir())
    {
        for f in std::fs::read_dir(class.path()).unwrap() {
            let f = f.unwrap().path();
            let rel = f.strip_prefix(dir.path().join("train")).unwrap();
            let (a, b) = (std::fs::read(&f).unwrap(), std::fs::read(dir.path().join("packed").join(rel)).unwrap());
            let name = rel.to_string_lossy();
            // Good JPEGs gain restart markers (RST0 = FF D0); bad files are byte-for-byte copies.
            assert_eq!(a == b, name.contains("bad_"), "{name}");
            if !name.contains("bad_") {
                assert!(b.windows(2).any(|w| w == [0xFF, 0xD0]), "{name} has no restart marker");
            }
        }
    }
    // Writing the copy inside the dataset is refused.
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["pack", "train", "train/packed"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("lies inside the dataset"));
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["pack", "train", "p0", "--interval", "0"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--interval"));
}

#[test]
fn demo_generates_its_dataset_and_runs_the_training_spec_on_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = sluice(&["demo", "--dir", "demo", "--images", "24", "--epochs", "1", "--threads", "1"], dir.path());
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(dir.path().join("demo/train.toml").is_file(), "{said}");
    assert!(said.contains("epoch 0: 24 samples"), "the 24 good images, one epoch: {said}");
    assert!(said.contains("skipped 5 bad samples"), "the demo's 5 bad files, skipped by name: {said}");
}

/// A small job for `sluice run` learners: 8 images, batches of 2.
fn learner_job(dir: &Path) {
    sluice(&["gen-images", "--out", "train", "--images", "8", "--classes", "2"], dir);
    let spec = "threads = 1\n[source]\nkind = \"image_folder\"\nroot = \"train\"\n\
                [[ops]]\nop = \"decode\"\n[[ops]]\nop = \"resize\"\nsize = 16\n[[ops]]\nop = \"center_crop\"\nsize = 16\n[batch]\nsize = 2\n";
    std::fs::write(dir.join("spec.toml"), spec).unwrap();
}

/// Learner `rank` of 2 of that job, lined up through `barrier/`.
fn learner(dir: &Path, rank: usize) -> Child {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["run", "spec.toml", "--rank", &rank.to_string(), "--world-size", "2", "--barrier", "barrier"])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn finishes(mut c: Child, what: &str) {
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = c.try_wait().unwrap() {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{what}: still running after 30 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{what}: {status}");
}

/// Asserts that `c` is still running (waiting at the barrier) after a while.
fn waits(c: &mut Child, what: &str) {
    std::thread::sleep(Duration::from_secs(2));
    if let Some(status) = c.try_wait().unwrap() {
        panic!("{what} passed its barriers alone ({status})");
    }
}

#[test]
fn learners_wait_for_each_other_again_in_a_barrier_folder_an_earlier_run_used() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    learner_job(d);
    let (a, b) = (learner(d, 0), learner(d, 1));
    finishes(a, "rank 0 of the first run");
    finishes(b, "rank 1 of the first run");

    // The first run's files are still there: rank 0 of a second run must wait for rank 1.
    let mut a = learner(d, 0);
    waits(&mut a, "rank 0 of the second run, rank 1 not started,");
    let b = learner(d, 1);
    finishes(a, "rank 0 of the second run");
    finishes(b, "rank 1 of the second run");

    // A run that crashed (rank 1 killed while it waited for rank 0) holds up no later run.
    let mut crashed = learner(d, 1);
    std::thread::sleep(Duration::from_millis(500));
    crashed.kill().unwrap();
    crashed.wait().unwrap();
    let mut a = learner(d, 0);
    waits(&mut a, "rank 0 after a crashed run, rank 1 not started,");
    let b = learner(d, 1);
    finishes(a, "rank 0 after a crashed run");
    finishes(b, "rank 1 after a crashed run");
}

/// A float flag that becomes a `Duration` is refused, naming the flag, when no wait can
/// last that long; it used to panic in `Duration::from_secs_f64` (after the whole run).
#[test]
fn a_wait_no_duration_can_hold_is_refused_naming_its_flag() {
    let dir = tempfile::tempdir().unwrap();
    learner_job(dir.path());
    for hold in ["inf", "1e300", "NaN"] {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["run", "spec.toml", "--dashboard", "127.0.0.1:0", "--dashboard-hold-s", hold])
            .current_dir(dir.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "--dashboard-hold-s {hold}: a usage error, not {}:\n{stderr}",
            out.status
        );
        assert!(stderr.contains("--dashboard-hold-s") && !stderr.contains("panicked"), "{stderr}");
    }
}

/// `sluice` copied into a folder of its own (`current_exe` is then that copy).
fn lone_sluice(dir: &Path) -> std::path::PathBuf {
    let exe = dir.join("sluice");
    std::fs::copy(env!("CARGO_BIN_EXE_sluice"), &exe).unwrap();
    exe
}

/// An old benchmark name says where it went and runs `sluice-bench` from beside `sluice`
/// with the new subcommand and every argument; without that binary it says how to build it.
#[cfg(unix)]
#[test]
fn an_old_bench_name_says_where_it_went_and_runs_sluice_bench_beside_it() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let exe = lone_sluice(dir.path());
    let args = ["bench-cache", "--json", "--threads", "1", "a b"];

    let out = Command::new(&exe).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.starts_with("note: \"sluice bench-cache\" moved to \"sluice-bench cache\"\n"), "{stderr}");
    assert!(stderr.contains("cargo build --release -p sluice-bench"), "{stderr}");

    // A stand-in `sluice-bench` that writes down how it was called and exits 3.
    let record = dir.path().join("called.txt");
    let bench = dir.path().join("sluice-bench");
    std::fs::write(&bench, format!("#!/bin/sh\nprintf '%s\\n' \"$@\" > '{}'\nexit 3\n", record.display())).unwrap();
    std::fs::set_permissions(&bench, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(&exe).args(args).output().unwrap();
    assert_eq!(out.status.code(), Some(3), "sluice-bench's exit status is sluice's");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().filter(|l| l.starts_with("note:")).count(), 1, "{stderr}");
    let called = std::fs::read_to_string(&record).unwrap();
    assert_eq!(called.lines().collect::<Vec<_>>(), ["cache", "--json", "--threads", "1", "a b"]);

    let help = Command::new(&exe).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let listed: Vec<&str> = help.lines().filter_map(|l| l.strip_prefix("  ")?.split_whitespace().next()).collect();
    assert!(listed.contains(&"service"), "{help}");
    for old in ["bench", "bench-cache", "dispatcher", "worker", "up"] {
        assert!(!listed.contains(&old), "{old} is hidden:\n{help}");
    }
}

/// `sluice dispatcher` still runs the dispatcher, after one line saying it is now
/// `sluice service dispatcher` (which says nothing of the kind).
#[test]
fn an_old_service_name_says_where_it_went_and_still_runs() {
    let dir = tempfile::tempdir().unwrap();
    for (args, note) in [(&["dispatcher"][..], true), (&["service", "dispatcher"][..], false)] {
        let journal = dir.path().join(format!("journal-{note}"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(args)
            .args(["--listen", "127.0.0.1:0", "--journal"])
            .arg(&journal)
            .arg("--allow-root")
            .arg(dir.path())
            .env_remove("SLUICE_TOKEN")
            .env("SLUICE_LOG", "error")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
        assert!(line.starts_with("sluice dispatcher listening on 127.0.0.1:"), "{args:?}: {line:?}");
        child.kill().unwrap();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let said = stderr.lines().any(|l| l == "note: \"sluice dispatcher\" moved to \"sluice service dispatcher\"");
        assert_eq!(said, note, "{args:?}: {stderr}");
    }
}

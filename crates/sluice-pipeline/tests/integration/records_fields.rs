//! Metadata fields (docs/records.md, "Metadata fields"): float, int, multi-label, text and
//! JSON values read from each sample's sidecar, in a folder or in tar shards, arrive in their
//! sample's row after shuffling, for any thread count and across a resume; a missing or
//! mistyped value (or a hostile one: a huge caption, deeply nested JSON) fails its sample by
//! name under `on_error`; absurd field specs are refused with the field's path.

#![allow(clippy::unwrap_used)] // test fixtures: a failure to set up is a test failure

use std::path::Path;

use sluice_core::{Batch, ErrorPolicy, FieldKindName, FieldSpec, FieldValues, OpSpec, PipelineSpec, Size, SourceSpec};
use sluice_pipeline::{Loader, LoaderState, Shard};
use sluice_synth::{write_dataset, DatasetOptions};

const SIDE: u32 = 32;
const CLASSES: usize = 3;

fn field(name: &str, kind: FieldKindName, classes: Option<u64>) -> FieldSpec {
    FieldSpec { name: name.into(), kind, classes }
}

/// The fields `sluice gen-images --fields` writes, and a JSON one.
fn fields(classes: usize) -> Vec<FieldSpec> {
    vec![
        field("id", FieldKindName::Int, None),
        field("caption", FieldKindName::Text, None),
        field("score", FieldKindName::Float, None),
        field("tags", FieldKindName::MultiLabel, Some(classes as u64)),
    ]
}

fn spec(source: SourceSpec, classes: usize, threads: usize, on_error: ErrorPolicy) -> PipelineSpec {
    let mut s = PipelineSpec::train_default(source, SIDE, 5);
    s.ops = vec![OpSpec::Decode, OpSpec::resize(SIDE), OpSpec::CenterCrop { size: Size::square(SIDE) }];
    s.shuffle = sluice_core::ShuffleSpec::Global;
    s.seed = 7;
    s.threads = threads.into();
    s.on_error = on_error;
    s.fields = fields(classes);
    s
}

fn dataset(root: &Path, images: usize, classes: usize) {
    let options = DatasetOptions { images, classes, texture: 4, fields: true, ..Default::default() };
    write_dataset(root, &options, &|_| {}).unwrap();
}

fn all(loader: &Loader) -> Result<Vec<Batch>, String> {
    loader.iter().map(|b| b.map_err(|e| e.to_string())).collect()
}

/// Checks every row's fields against each other and the label (which reaches the batch by
/// another road, the manifest's entries): the generator wrote image `i` of class `c` with
/// `id = i`, `caption = "image i of class c"`, `score = i / 8`, `tags = [c, c + 1]`.
/// Returns (key, id) of every row.
fn check_rows(batches: &[Batch], classes: usize) -> Vec<(u64, i64)> {
    let mut out = Vec::new();
    for b in batches {
        let f = &b.fields.as_ref().unwrap().fields;
        let names: Vec<&str> = f.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["id", "caption", "score", "tags"]);
        let (FieldValues::Int(ids), FieldValues::Text(captions), FieldValues::Float(scores)) =
            (&f[0].values, &f[1].values, &f[2].values)
        else {
            panic!("kinds: {f:?}")
        };
        let FieldValues::MultiHot { classes: n, values: hot } = &f[3].values else { panic!("{:?}", f[3]) };
        assert_eq!((ids.len(), captions.len(), scores.len(), hot.len()), (b.len(), b.len(), b.len(), b.len() * n));
        for row in 0..b.len() {
            let (i, c) = (ids[row], b.labels[row]);
            assert_eq!(c, i % classes as i64, "row {row}: the label and the id come from one sample");
            assert_eq!(captions[row], format!("image {i} of class {c}"));
            assert_eq!(scores[row], i as f32 / 8.0);
            let mut want = vec![0f32; classes];
            want[c as usize] = 1.0;
            want[(c as usize + 1) % classes] = 1.0;
            assert_eq!(&hot[row * n..(row + 1) * n], &want[..], "row {row}: multi-hot tags of class {c}");
            out.push((b.keys[row], i));
        }
    }
    out
}

#[test]
fn sidecar_fields_arrive_in_their_rows_after_shuffling_for_any_thread_count_and_a_resume() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    dataset(&root, 23, CLASSES);
    let source = SourceSpec::Sidecar { root: root.clone(), masks: false };
    let one = Loader::new(spec(source.clone(), CLASSES, 1, ErrorPolicy::Fail), Shard::default()).unwrap();
    one.set_epoch(2);
    let reference = all(&one).unwrap();
    let rows = check_rows(&reference, CLASSES);
    assert_eq!(rows.len(), 23);
    let order: Vec<i64> = rows.iter().map(|r| r.1).collect();
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..23).collect::<Vec<_>>(), "every sample once");
    assert_ne!(order, sorted, "shuffled");

    let three = Loader::new(spec(source.clone(), CLASSES, 3, ErrorPolicy::Fail), Shard::default()).unwrap();
    three.set_epoch(2);
    assert_eq!(all(&three).unwrap(), reference, "3 threads give the same batches, fields included");

    // Stopped after two batches; the checkpoint resumes the rest with their fields.
    let first = Loader::new(spec(source.clone(), CLASSES, 2, ErrorPolicy::Fail), Shard::default()).unwrap();
    first.set_epoch(2);
    let head: Vec<Batch> = first.iter().take(2).map(Result::unwrap).collect();
    let saved = serde_json::to_string(&first.state()).unwrap();
    drop(first);
    let resumed = Loader::new(spec(source, CLASSES, 3, ErrorPolicy::Fail), Shard::default()).unwrap();
    resumed.load_state(&serde_json::from_str::<LoaderState>(&saved).unwrap()).unwrap();
    let tail = all(&resumed).unwrap();
    assert_eq!(head, reference[..2]);
    assert_eq!(tail, reference[2..]);
    // A manifest enumerated without the fields would give batches without them: refused.
    let bare = sluice_pipeline::source::build_manifest(&SourceSpec::Sidecar { root, masks: false }).unwrap();
    let spec = spec(SourceSpec::Sidecar { root: "unused".into(), masks: false }, CLASSES, 1, ErrorPolicy::Fail);
    let e = Loader::with_manifest(spec, bare, Shard::default()).err().unwrap().to_string();
    assert!(e.contains("enumerated without them"), "{e}");
}

#[test]
fn fields_join_the_fingerprint_so_a_checkpoint_of_other_values_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    dataset(&root, 6, CLASSES);
    let source = SourceSpec::Sidecar { root: root.clone(), masks: false };
    let before = Loader::new(spec(source.clone(), CLASSES, 1, ErrorPolicy::Fail), Shard::default()).unwrap();
    let state = before.state();
    let json = root.join("class_001/img_0000004.json");
    let text = std::fs::read_to_string(&json).unwrap().replace("\"score\": 0.5", "\"score\": 0.75");
    std::fs::write(&json, text).unwrap();
    let after = Loader::new(spec(source, CLASSES, 1, ErrorPolicy::Fail), Shard::default()).unwrap();
    assert_ne!(before.manifest().fingerprint, after.manifest().fingerprint);
    let e = after.load_state(&state).unwrap_err();
    assert!(e.to_string().contains("fingerprint"), "{e}");
}

#[test]
fn tar_sidecar_fields_arrive_in_their_rows() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    // One class: the shard's members (and so the keys) are in image order.
    dataset(&root, 12, 1);
    let shard = dir.path().join("fields.tar");
    crate::source_tar_sidecars::pack_folder(&root, &shard);
    let source = SourceSpec::Tar { shards: vec![shard], sidecars: true, masks: false };
    for threads in [1, 3] {
        let loader = Loader::new(spec(source.clone(), 1, threads, ErrorPolicy::Fail), Shard::default()).unwrap();
        let rows = check_rows(&all(&loader).unwrap(), 1);
        assert_eq!(rows.len(), 12);
        for (key, id) in rows {
            assert_eq!(key as i64, id, "the shard's sample {key} got another sample's fields");
        }
    }
}

/// A change to a sidecar's text.
type Edit = Box<dyn Fn(&str) -> String>;

/// Bad values, written over the generated sidecars of class 0 (images 0, 3, 6, ...):
/// (image, sidecar edit, what the sample's error says).
fn bad_fields() -> Vec<(usize, Edit, &'static str)> {
    let deep = format!("{}1{}", "[".repeat(5000), "]".repeat(5000));
    let huge = "x".repeat(1 << 20);
    vec![
        (
            3,
            Box::new(|s: &str| s.replace("\"score\": 0.375", "\"score\": \"high\"")),
            "field `score`: expected a number, found a string \"high\"",
        ),
        (6, Box::new(|s: &str| s.replace("\"caption\"", "\"kaption\"")), "unknown field `kaption`"),
        (
            9,
            Box::new(|s: &str| s.replace("\"tags\": [0, 1]", "\"tags\": [0, 7]")),
            "field `tags`: class 7 (item 1) is not in 0..3",
        ),
        (
            12,
            Box::new(|s: &str| s.replace("\"id\": 12", "\"id\": 12.5")),
            "field `id`: expected an integer (int64), found a number 12.5",
        ),
        (
            15,
            Box::new(move |s: &str| s.replace("image 15 of class 0", &huge)),
            "field `caption`: 1048576 bytes, over the limit of 65536 (limits.max_field_bytes)",
        ),
        (18, Box::new(move |s: &str| s.replace("\"score\": 2.25", &format!("\"score\": {deep}"))), "recursion limit"),
        (21, Box::new(|s: &str| s.replace(", \"id\": 21", "")), "field `id` is missing"),
    ]
}

#[test]
fn a_missing_mistyped_or_hostile_field_fails_its_sample_naming_sample_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    dataset(&root, 24, CLASSES);
    let sidecar = |i: usize| root.join(format!("class_000/img_{i:07}.json"));
    let bad = bad_fields();
    for (i, edit, _) in &bad {
        let text = std::fs::read_to_string(sidecar(*i)).unwrap();
        let edited = edit(&text);
        assert_ne!(edited, text, "the edit of sample {i} applies");
        std::fs::write(sidecar(*i), edited).unwrap();
    }
    let source = SourceSpec::Sidecar { root: root.clone(), masks: false };
    let loader = Loader::new(spec(source.clone(), CLASSES, 2, ErrorPolicy::Skip), Shard::default()).unwrap();
    let rows = check_rows(&all(&loader).unwrap(), CLASSES);
    assert_eq!(rows.len(), 24 - bad.len(), "the good samples load, with their own fields");
    let skipped = loader.stats().skipped;
    assert_eq!(skipped.len(), bad.len(), "{skipped:?}");
    for (i, _, says) in &bad {
        let image = format!("img_{i:07}.jpg");
        let s = skipped.iter().find(|s| s.path.ends_with(&image)).unwrap_or_else(|| panic!("{image}: {skipped:?}"));
        assert!(s.error.contains(says), "{image}: {} should say {says}", s.error);
        assert!(s.error.contains(&format!("img_{i:07}.json")), "names the sidecar: {}", s.error);
    }

    // Under "fail" the run stops with the first bad sample of the epoch, named.
    let e = all(&Loader::new(spec(source, CLASSES, 2, ErrorPolicy::Fail), Shard::default()).unwrap()).unwrap_err();
    assert!(
        e.contains("bad field")
            && bad.iter().any(|(i, _, says)| e.contains(&format!("img_{i:07}.jpg")) && e.contains(says)),
        "{e}"
    );
}

#[test]
fn absurd_field_specs_are_refused_with_the_fields_path() {
    let source = SourceSpec::Sidecar { root: "/data".into(), masks: false };
    let base = spec(source, CLASSES, 1, ErrorPolicy::Fail);
    assert!(base.validate().is_ok());
    let refused = |edit: &dyn Fn(&mut PipelineSpec)| {
        let mut s = base.clone();
        edit(&mut s);
        let e = s.validate().unwrap_err();
        (e.field.clone(), e.to_string())
    };
    let (f, m) = refused(&|s| s.fields[3].classes = Some(0));
    assert_eq!(f, "fields[3].classes", "{m}");
    let (f, m) = refused(&|s| s.fields[3].classes = Some(1_000_000_000));
    assert_eq!(f, "fields[3].classes", "{m}");
    let (f, m) = refused(&|s| s.fields.push(field("score", FieldKindName::Int, None)));
    assert!(f == "fields[4].name" && m.contains("named twice"), "{f}: {m}");
    for reserved in ["image", "label", "key", "boxes", "masks"] {
        let (f, m) = refused(&|s| s.fields[0].name = reserved.into());
        assert!(f == "fields[0].name" && m.contains("batch entry"), "{f}: {m}");
    }
    let (f, m) = refused(&|s| s.source = SourceSpec::ImageFolder { root: "/data".into() });
    assert!(f == "fields" && m.contains("sidecars"), "{f}: {m}");
    let (f, _) = refused(&|s| s.limits.max_field_bytes = 0);
    assert_eq!(f, "limits.max_field_bytes");
    // And from TOML, as a user writes it.
    let toml = r#"
        fields = [{ name = "tags", kind = "multi_label" }]
        ops = [{ op = "decode" }]
        [source]
        kind = "sidecar"
        root = "/data"
        [batch]
        size = 4
    "#;
    let e = PipelineSpec::from_toml_str(toml).unwrap_err();
    assert_eq!(e.field, "fields[0].classes", "{e}");
}

/// `path`: 10 rows in row groups of 4: `image` (a JPEG), `id` (int64, the row), `score`
/// (double, row / 4), `caption` (string, `"row i"`; null at row 7) and `meta` (string
/// holding JSON `{"i": row}`; not JSON at row 8).
fn write_fields_parquet(path: &Path) {
    use parquet::data_type::{ByteArray, ByteArrayType, DoubleType, Int64Type};
    use std::sync::Arc;
    let schema = "message schema { required binary image; required int64 id; required double score; \
                  optional binary caption (STRING); required binary meta (STRING); }";
    let schema = Arc::new(parquet::schema::parser::parse_message_type(schema).unwrap());
    let props = Arc::new(parquet::file::properties::WriterProperties::builder().build());
    let mut w =
        parquet::file::writer::SerializedFileWriter::new(std::fs::File::create(path).unwrap(), schema, props).unwrap();
    let rows: Vec<usize> = (0..10).collect();
    for group in rows.chunks(4) {
        let mut rg = w.next_row_group().unwrap();
        let images: Vec<ByteArray> =
            group.iter().map(|&i| ByteArray::from(sluice_synth::noise_jpeg(i, 24).unwrap())).collect();
        let mut col = rg.next_column().unwrap().unwrap();
        col.typed::<ByteArrayType>().write_batch(&images, None, None).unwrap();
        col.close().unwrap();
        let ids: Vec<i64> = group.iter().map(|&i| i as i64).collect();
        let mut col = rg.next_column().unwrap().unwrap();
        col.typed::<Int64Type>().write_batch(&ids, None, None).unwrap();
        col.close().unwrap();
        let scores: Vec<f64> = group.iter().map(|&i| i as f64 / 4.0).collect();
        let mut col = rg.next_column().unwrap().unwrap();
        col.typed::<DoubleType>().write_batch(&scores, None, None).unwrap();
        col.close().unwrap();
        let present: Vec<usize> = group.iter().copied().filter(|&i| i != 7).collect();
        let captions: Vec<ByteArray> = present.iter().map(|i| ByteArray::from(format!("row {i}").as_str())).collect();
        let defs: Vec<i16> = group.iter().map(|&i| i16::from(i != 7)).collect();
        let mut col = rg.next_column().unwrap().unwrap();
        col.typed::<ByteArrayType>().write_batch(&captions, Some(&defs), None).unwrap();
        col.close().unwrap();
        let metas: Vec<ByteArray> = group
            .iter()
            .map(|&i| ByteArray::from(if i == 8 { "not json".to_string() } else { format!("{{\"i\": {i}}}") }.as_str()))
            .collect();
        let mut col = rg.next_column().unwrap().unwrap();
        col.typed::<ByteArrayType>().write_batch(&metas, None, None).unwrap();
        col.close().unwrap();
        rg.close().unwrap();
    }
    w.close().unwrap();
}

#[test]
fn parquet_columns_are_fields_in_their_rows_and_a_null_or_bad_value_fails_its_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.parquet");
    write_fields_parquet(&path);
    let source = SourceSpec::Parquet { path: path.clone(), image_column: "image".into(), label_column: None };
    let mut s = spec(source.clone(), 1, 2, ErrorPolicy::Skip);
    s.fields = vec![
        field("id", FieldKindName::Int, None),
        field("score", FieldKindName::Float, None),
        field("caption", FieldKindName::Text, None),
        field("meta", FieldKindName::Json, None),
    ];
    let loader = Loader::new(s.clone(), Shard::default()).unwrap();
    let batches = all(&loader).unwrap();
    let mut ids = Vec::new();
    for b in &batches {
        let f = &b.fields.as_ref().unwrap().fields;
        let (FieldValues::Int(id), FieldValues::Float(score), FieldValues::Text(caption), FieldValues::Json(meta)) =
            (&f[0].values, &f[1].values, &f[2].values, &f[3].values)
        else {
            panic!("{f:?}")
        };
        for row in 0..b.len() {
            let i = id[row];
            assert_eq!(b.keys[row] as i64, i, "row {row}: key {} got row {i}'s fields", b.keys[row]);
            assert_eq!((score[row], caption[row].as_str()), (i as f32 / 4.0, format!("row {i}").as_str()));
            assert_eq!(meta[row], format!("{{\"i\":{i}}}"), "compact JSON");
            ids.push(i);
        }
    }
    ids.sort_unstable();
    assert_eq!(ids, [0, 1, 2, 3, 4, 5, 6, 9]);
    let skipped = loader.stats().skipped;
    for (row, says) in [(7, "field `caption` is missing"), (8, "field `meta`: the column's text is not JSON")] {
        let s = skipped.iter().find(|s| s.key == row).unwrap_or_else(|| panic!("row {row}: {skipped:?}"));
        assert!(s.error.contains(says) && s.path.contains("row=3") == (row == 7), "{s:?}");
    }
    // A field whose column is missing or of another type refuses the dataset, naming both.
    s.fields[1].name = "nope".into();
    let e = Loader::new(s.clone(), Shard::default()).err().unwrap().to_string();
    assert!(e.contains("nope") && e.contains("data.parquet"), "{e}");
    s.fields[1] = field("score", FieldKindName::Float, None);
    s.fields[2] = field("caption", FieldKindName::Int, None);
    let e = Loader::new(s.clone(), Shard::default()).err().unwrap().to_string();
    assert!(e.contains("caption") && e.contains("integer"), "{e}");
    // A multi-label field needs a list column; `caption` is a string one.
    s.fields[2] = field("caption", FieldKindName::MultiLabel, Some(3));
    let e = Loader::new(s.clone(), Shard::default()).err().unwrap().to_string();
    assert!(e.contains("caption") && e.contains("list of integers"), "{e}");
}

fn parquet_mix(a: &Path, b: &Path) -> SourceSpec {
    let member = |path: &Path, weight| sluice_core::MixedSource {
        source: SourceSpec::Parquet { path: path.to_path_buf(), image_column: "image".into(), label_column: None },
        weight,
    };
    SourceSpec::Mix { sources: vec![member(a, 0.6), member(b, 0.4)] }
}

#[test]
fn a_mix_reads_each_sources_fields_into_its_rows_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.parquet"), dir.path().join("b.parquet"));
    write_fields_parquet(&a);
    write_fields_parquet(&b);
    let mix_spec = |threads| {
        let mut s = spec(parquet_mix(&a, &b), 1, threads, ErrorPolicy::Skip);
        s.batch.size = 5;
        s.fields = vec![
            field("id", FieldKindName::Int, None),
            field("score", FieldKindName::Float, None),
            field("caption", FieldKindName::Text, None),
        ];
        s
    };
    let loader = Loader::new(mix_spec(1), Shard::default()).unwrap();
    let reference = all(&loader).unwrap();
    // Each row's fields are those of its own file's row (ids repeat across the files).
    let mut from = [Vec::new(), Vec::new()];
    for batch in &reference {
        let f = &batch.fields.as_ref().unwrap().fields;
        let (FieldValues::Int(id), FieldValues::Float(score), FieldValues::Text(caption)) =
            (&f[0].values, &f[1].values, &f[2].values)
        else {
            panic!("{f:?}")
        };
        assert_eq!((id.len(), score.len(), caption.len()), (batch.len(), batch.len(), batch.len()));
        for (i, &key) in batch.keys.iter().enumerate() {
            let sluice_core::LocationRef::ParquetRow { file, row_group, row, .. } =
                loader.manifest().at(key as usize).location
            else {
                panic!("key {key}")
            };
            let want = i64::from(row_group * 4 + row);
            assert_eq!(
                (id[i], score[i], caption[i].as_str()),
                (want, want as f32 / 4.0, format!("row {want}").as_str())
            );
            from[usize::from(file.ends_with("b.parquet"))].push(want);
        }
    }
    // 3 of a and 2 of b a batch; row 7 (a null caption) is skipped by name where drawn.
    assert!(!from[0].is_empty() && !from[1].is_empty(), "{from:?}");
    assert!(from.iter().all(|rows| !rows.contains(&7)), "{from:?}");
    let skipped = loader.stats().skipped;
    assert!(!skipped.is_empty(), "a's row 7 is drawn (all of a is)");
    for s in &skipped {
        assert!(s.path.ends_with("row_group=1:row=3") && s.error.contains("`caption` is missing"), "{s:?}");
    }

    // Stopped after two batches; the checkpoint resumes the rest, fields included.
    let first = Loader::new(mix_spec(2), Shard::default()).unwrap();
    let head: Vec<Batch> = first.iter().take(2).map(Result::unwrap).collect();
    let saved = serde_json::to_string(&first.state()).unwrap();
    drop(first);
    let resumed = Loader::new(mix_spec(3), Shard::default()).unwrap();
    resumed.load_state(&serde_json::from_str::<LoaderState>(&saved).unwrap()).unwrap();
    assert_eq!(head, reference[..2]);
    assert_eq!(all(&resumed).unwrap(), reference[2..]);

    // A member that carries no fields is refused, naming it.
    let mut s = mix_spec(1);
    let SourceSpec::Mix { sources } = &mut s.source else { unreachable!() };
    sources[1].source = SourceSpec::ImageFolder { root: dir.path().to_path_buf() };
    let e = s.validate().unwrap_err();
    assert_eq!(e.field, "source.sources[1]", "{e}");
    assert!(e.message.contains("no metadata fields"), "{e}");
}

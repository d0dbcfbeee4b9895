//! The pipeline's integration tests, in one binary (one link, one executable on disk): each file is a
//! module, named as its tests are (`cargo test -p sluice-pipeline <module>::`).

mod accelerator;
mod autoscale;
mod cache;
mod cache_disk;
mod ddp_importance;
mod elastic_resume;
mod hostile_peers;
mod hostile_records;
mod hostile_sizes;
mod loader;
mod locality;
mod locality_peers;
mod mix;
mod object_checks;
mod ops_geometry;
mod prefetch_auto;
mod records_fields;
mod source_azure;
mod source_file_list;
mod source_gcs;
mod source_http;
mod source_image_folder;
mod source_parquet;
mod source_s3;
mod source_tar;
mod source_tar_sidecars;
mod storage_local;
mod storage_throttled;
mod trace;

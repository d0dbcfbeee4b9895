//! sluice's shared vocabulary. Every other crate speaks in these types: a [`SampleKey`]
//! names a sample, a [`Manifest`] lists a dataset, a [`PipelineSpec`] says what to do with
//! it, an [`Image`] flows through the ops and a [`Batch`] comes out.

pub mod batch;
pub mod error;
pub mod fields;
pub mod image;
pub mod logging;
pub mod manifest;
pub mod placement;
pub mod record;
pub mod rng;
pub mod spec;

pub use batch::{Batch, SharedBytes, Tensor, TensorData};
pub use error::{SampleError, SampleErrorKind, SpecError, Stage};
pub use fields::{BatchField, BatchFields, FieldKindName, FieldSpec, FieldTable, FieldValues};
pub use image::{DType, Image, Layout, Pixels};
pub use manifest::{Entry, Location, LocationRef, Manifest, ManifestBuilder, SampleKey};
pub use placement::{Owners, Rendezvous};
pub use record::{Annotation, BatchBoxes, BoxTargets, Mask, MaskSource, Segmentation};
pub use rng::SampleRng;
pub use spec::{
    Assignment, AutoAugmentPolicy, BatchSpec, ByteBudget, CacheLevel, CachePolicyKind, CacheSpec, DecodeSpec,
    DiskCacheSpec, DiskPolicyKind, ErrorPolicy, Geometry, ImportanceSpec, Interpolation, Limits, LocalitySpec,
    MixedSource, OpSpec, PaddingMode, PeerToken, PipelineSpec, SamplingSpec, ShuffleSpec, Size, SourceSpec,
    StorageSpec, Threads, IOU_CROP_MAX_ROUNDS,
};

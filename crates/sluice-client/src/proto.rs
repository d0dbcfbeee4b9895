//! The wire messages and the gRPC client/server code, generated at build time from
//! `proto/sluice.proto` (package `sluice.v1`): the schema and its documentation live there.
//!
//! Enum fields are `i32` on the struct, read through the generated accessors
//! (`GetTaskReply::status()`); code that must refuse unknown values uses `try_from`.

tonic::include_proto!("sluice.v1");

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// Bytes as the hand-written prost structs before `sluice.proto` encoded them (the
    /// enums were plain `int32`/`uint32` fields then): old peers and new ones agree.
    #[test]
    fn enum_fields_keep_the_wire_format_of_the_integers_they_replaced() {
        let req = RunTaskRequest {
            job_id: 1,
            epoch: 2,
            start: 3,
            end: 6,
            compression: Compression::Zstd.into(),
            ..Default::default()
        };
        let old = [0x08, 1, 0x10, 2, 0x18, 3, 0x20, 6, 0x28, 1];
        assert_eq!(req.encode_to_vec(), old);
        assert_eq!(RunTaskRequest::decode(&old[..]).unwrap(), req);

        let reply = GetTaskReply { status: get_task_reply::Status::EpochDone.into(), task: None };
        assert_eq!(reply.encode_to_vec(), [0x08, 2]);
        assert_eq!(GetTaskReply::decode(&[0x08, 1][..]).unwrap().status(), get_task_reply::Status::Wait);

        let batch = BatchMessage {
            dtype: Dtype::F32.into(),
            layout: Layout::Chw.into(),
            compression: Compression::Zstd.into(),
            ..Default::default()
        };
        // dtype = 6, layout = 7, compression = 11: varints, as the old uint32 fields.
        assert_eq!(batch.encode_to_vec(), [0x30, 1, 0x38, 1, 0x58, 1]);
    }
}

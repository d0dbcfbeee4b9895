//! Generates the gRPC client and server code for the dispatcher and worker services from
//! the hand-written prost messages in `src/proto.rs`: no `.proto` file, so no `protoc`.

use tonic_build::manual::{Builder, Method, Service};

fn method(name: &str, route: &str, input: &str, output: &str) -> tonic_build::manual::MethodBuilder {
    Method::builder()
        .name(name)
        .route_name(route)
        .input_type(format!("crate::proto::{input}"))
        .output_type(format!("crate::proto::{output}"))
        .codec_path("tonic::codec::ProstCodec")
}

fn main() {
    let dispatcher = Service::builder()
        .name("Dispatcher")
        .package("sluice.v1")
        .method(method("register_worker", "RegisterWorker", "RegisterWorkerRequest", "RegisterWorkerReply").build())
        .method(method("worker_heartbeat", "WorkerHeartbeat", "WorkerHeartbeatRequest", "WorkerHeartbeatReply").build())
        .method(method("create_job", "CreateJob", "CreateJobRequest", "JobInfo").build())
        .method(method("get_job", "GetJob", "GetJobRequest", "JobDefinition").build())
        .method(method("get_task", "GetTask", "GetTaskRequest", "GetTaskReply").build())
        .method(method("ack_task", "AckTask", "AckTaskRequest", "Empty").build())
        .method(method("fail_task", "FailTask", "FailTaskRequest", "Empty").build())
        .method(method("client_heartbeat", "ClientHeartbeat", "ClientHeartbeatRequest", "Empty").build())
        .method(method("reset_job", "ResetJob", "ResetJobRequest", "JobInfo").build())
        .build();
    let worker = Service::builder()
        .name("Worker")
        .package("sluice.v1")
        .method(method("run_task", "RunTask", "RunTaskRequest", "BatchMessage").server_streaming().build())
        .build();
    Builder::new().compile(&[dispatcher, worker]);
    println!("cargo:rerun-if-changed=build.rs");
}

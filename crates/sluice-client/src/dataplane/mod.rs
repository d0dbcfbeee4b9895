//! The TCP data plane: batches from a worker to a client as a header and the raw pixel
//! buffer, written straight from the batch and read straight into the client's batch, so a
//! batch costs what the kernel's copies cost (gRPC over HTTP/2 moves 16 KiB frames and
//! copies each message twice more; see BENCHMARKS). Control stays on gRPC.
//!
//! One task per connection. Client → worker:
//!   `b"SLDP1"`, u32 token length, token, u32 request length, `RunTaskRequest` (prost).
//! Worker → client, repeated, each frame starting with a kind byte:
//!   `1` batch: u32 header length, `BatchMessage` without `data` (prost), u64 data length, data
//!       (the pixels, compressed when the request asked and the header says so), then, when
//!       the request asked for `masks_in_body`, the batch's masks (as many bytes as the
//!       header's `BatchMasks.body_bytes`; a header then carries none of their bytes);
//!   `2` end of task;
//!   `3` error: u32 gRPC status code, u32 message length, message (UTF-8).
//! Integers are little-endian. Sizes are bounded before anything is allocated, and so are
//! connections that have not yet authenticated (the worker's `ConnectionLimits`: 64, 5 s each).
//! With TLS configured the same bytes travel inside a rustls session.
//!
//! The local data plane (Linux) is the same protocol over a Unix socket in the abstract
//! namespace, for clients on the worker's machine, with the pixels in shared memory
//! ([`crate::shm`]). After the request the worker sends
//!   `4` region: u64 id, u32 slots, u64 slot bytes, with the region's memfd attached;
//! and then sends each batch as
//!   `5` batch in a slot: u32 header length, header, u32 slot, u64 data length, then the
//!       masks as in `1`;
//! (or as `1`, inline, when no slot is free or the batch is larger). The client copies the
//! pixels out and hands the slot back with a u32 slot number; the worker reuses a slot
//! only after that.
//! Nothing on this socket leaves the machine, so it carries no TLS; the token is checked
//! as on TCP.
//!
//! This module is the protocol both ends share (its constants, the hello) and the
//! client's end, [`TaskStream`] (`stream`, and `local` for the shared-memory plane); the
//! worker's end (serving tasks) is `sluice_service`'s `dataplane`.

use std::time::Duration;

use prost::Message;
use sluice_transport::frame::{write_frame, FrameError};
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::Status;

use crate::proto::RunTaskRequest;

#[cfg(target_os = "linux")]
mod local;
mod stream;
#[cfg(target_os = "linux")]
pub use local::MappedRegions;
pub use stream::TaskStream;

/// The first bytes of a task request.
pub const MAGIC: &[u8; 5] = b"SLDP1";
/// Frame kinds, worker → client.
pub const KIND_BATCH: u8 = 1;
pub const KIND_END: u8 = 2;
pub const KIND_ERROR: u8 = 3;
pub const KIND_REGION: u8 = 4;
pub const KIND_SLOT: u8 = 5;
/// Most slots in a region.
pub const MAX_SLOTS: u32 = 64;
/// Largest batch header (a `BatchMessage` without its pixels).
pub const MAX_HEADER: u32 = 16 << 20;
/// Largest token in a request.
pub const MAX_TOKEN: u32 = 4096;
/// Largest `RunTaskRequest`.
pub const MAX_REQUEST: u32 = 4096;
/// Largest message of an error frame (a longer one is cut there).
pub const MAX_ERROR_MESSAGE: u32 = 64 << 10;
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A socket error, as the status a data-plane call fails with.
pub fn io_status(e: std::io::Error) -> Status {
    Status::unavailable(format!("data plane: {e}"))
}

/// A frame that could not be read (`what` names it), as the status a data-plane call
/// fails with: a socket error, or a length over the cap.
pub fn frame_status(what: &'static str) -> impl Fn(FrameError) -> Status {
    move |e| match e {
        FrameError::Io(e) => io_status(e),
        FrameError::TooLarge { len, max } => {
            Status::invalid_argument(format!("{what} of {len} bytes is over the limit of {max}"))
        }
    }
}

/// A connection, plain or inside TLS.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// The hello that opens a task: magic, token, request (each a frame of the peer
/// transport's).
pub fn hello(token: Option<&str>, req: &RunTaskRequest) -> std::io::Result<Vec<u8>> {
    let mut hello = Vec::with_capacity(64);
    hello.extend_from_slice(MAGIC);
    write_frame(&mut hello, token.unwrap_or("").as_bytes())?;
    write_frame(&mut hello, &req.encode_to_vec())?;
    Ok(hello)
}

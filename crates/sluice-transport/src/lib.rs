//! The learners' peer transport: one length-prefixed TCP protocol, authenticated and
//! capped, for the collaborative cache (`sluice-pipeline`'s locality peers) and the
//! distributed rehearsal buffer (`sluice-stream`'s shards).
//!
//! Every frame is a little-endian `u32` body length, then the body; a reader refuses a
//! length above its cap before allocating anything ([`frame`]). With the `tokio` feature
//! the same frames (and, for bodies that need it, a `u64` length: [`frame::Prefix`]) are
//! read and written on tokio sockets too ([`frame::nonblocking`]): the service's data
//! plane frames its requests and batches with them. A connection opens with
//! the client's hello ([`auth`]):
//!
//! * client → server: `b"SLPR1"`, `u8` protocol-name length, the protocol name (say
//!   `sluice-locality/1`), then the job's token (the rest of the frame);
//! * server → client: `u8` 0 (accepted), or 1 and a UTF-8 reason, after which it closes.
//!
//! The server compares the token in constant time (`subtle`), gives a connection
//! [`ServerLimits::auth_timeout`] to send its hello, holds at most
//! [`ServerLimits::max_pending`] connections waiting to authenticate and
//! [`ServerLimits::max_connections`] in all (one thread each; more are refused at once),
//! and closes connections idle past [`ServerLimits::idle_timeout`]. After the hello each
//! request frame gets one reply frame; the bodies are in [`messages`]. The [`Client`]
//! keeps its connections open between requests, bounds the whole reply by its timeout
//! and a size cap, and leaves a peer that failed alone for a while (back-off).

pub mod auth;
pub mod client;
pub mod frame;
pub mod messages;
pub mod server;

pub use auth::{Token, TOKEN_ENV};
pub use client::{Client, ClientConfig};
pub use messages::Malformed;
pub use server::{Handler, Server, ServerLimits};

/// Why a peer could not be used, or a server not started.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("peer {peer} ({addr}): {source}")]
    Io { peer: usize, addr: String, source: std::io::Error },
    #[error("peer {peer} ({addr}) sent a frame of {len} bytes (at most {max})")]
    TooLarge { peer: usize, addr: String, len: u64, max: u64 },
    #[error("peer {peer} ({addr}) refused the connection: {reason}")]
    Refused { peer: usize, addr: String, reason: String },
    #[error("peer {peer} ({addr}) sent a malformed reply: {what}")]
    Malformed { peer: usize, addr: String, what: Malformed },
    #[error("peer {peer} ({addr}) is left alone for a while after a failure")]
    BackingOff { peer: usize, addr: String },
    #[error("no address for peer {peer}")]
    NoAddress { peer: usize },
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: String, source: std::io::Error },
    #[error(
        "{field}: the peer servers need the job's token (the same on every learner): set `{field}`, \
         or the environment variable {TOKEN_ENV}"
    )]
    NoToken { field: &'static str },
    #[error("{field}: {problem}")]
    BadToken { field: &'static str, problem: String },
}

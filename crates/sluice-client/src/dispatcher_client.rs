//! The gRPC client of the dispatcher, as workers and [`crate::RemoteLoader`] both use it:
//! connects lazily, reconnects by itself, attaches the token and speaks TLS when given a CA.

use std::time::Duration;

use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::error::ClientError;
use crate::proto::dispatcher_client::DispatcherClient;
use crate::security::TokenAttach;
use crate::tls::ClientTls;
use crate::MAX_CONTROL_MESSAGE_BYTES;

pub type DispatcherConn = DispatcherClient<InterceptedService<Channel, TokenAttach>>;

/// A lazily connecting, reconnecting client of the dispatcher; over TLS with `tls`.
pub fn dispatcher_client(
    addr: &str,
    token: Option<&str>,
    tls: Option<&ClientTls>,
) -> Result<DispatcherConn, ClientError> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let uri = match addr.split_once("://") {
        Some((_, rest)) => format!("{scheme}://{rest}"),
        None => format!("{scheme}://{addr}"),
    };
    let mut endpoint = Endpoint::from_shared(uri.clone())
        .map_err(|e| ClientError::Connect { addr: uri.clone(), message: e.to_string() })?
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true);
    if let Some(tls) = tls {
        endpoint =
            endpoint.tls_config(tls.grpc(addr)).map_err(|e| ClientError::Tls(format!("dispatcher {addr}: {e}")))?;
    }
    let channel = endpoint.connect_lazy();
    Ok(DispatcherClient::with_interceptor(channel, TokenAttach::new(token)?)
        .max_decoding_message_size(MAX_CONTROL_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_CONTROL_MESSAGE_BYTES))
}

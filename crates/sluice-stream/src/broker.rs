//! The Redis side: a connection that reconnects by itself (a broker restart is waited
//! out for `reconnect`), and the handful of stream commands sluice uses.

use std::time::{Duration, Instant};

use redis::streams::{StreamAutoClaimOptions, StreamAutoClaimReply, StreamId, StreamReadOptions, StreamReadReply};
use redis::{Commands, Connection, ErrorKind, RedisError, RedisResult};

use crate::error::StreamError;

/// Pause between reconnection attempts.
const RETRY: Duration = Duration::from_millis(50);

pub struct Broker {
    url: String,
    client: redis::Client,
    con: Option<Connection>,
    reconnect: Duration,
    /// Set when a connection was lost: a read in flight may have been delivered to this
    /// consumer without reaching it, so its pending entries must be read again.
    lost_connection: bool,
}

impl Broker {
    /// Connects lazily; `reconnect` is how long an operation keeps retrying a broker that
    /// is down or restarting before it fails.
    pub fn open(url: &str, reconnect: Duration) -> Result<Self, StreamError> {
        let client = redis::Client::open(url).map_err(|source| StreamError::Broker {
            url: url.to_string(),
            op: "parse the address",
            source,
        })?;
        Ok(Self { url: url.to_string(), client, con: None, reconnect, lost_connection: false })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether the connection was lost since the last call (and clears it).
    pub fn take_lost_connection(&mut self) -> bool {
        std::mem::take(&mut self.lost_connection)
    }

    /// Runs `f` on a live connection, reconnecting and retrying while the broker is
    /// unreachable or still loading its data, for up to `reconnect`.
    fn run<T>(
        &mut self,
        op: &'static str,
        mut f: impl FnMut(&mut Connection) -> RedisResult<T>,
    ) -> Result<T, StreamError> {
        let started = Instant::now();
        loop {
            let result = match &mut self.con {
                Some(con) => f(con),
                None => self.client.get_connection().and_then(|mut con| {
                    let r = f(&mut con);
                    self.con = Some(con);
                    r
                }),
            };
            match result {
                Ok(v) => return Ok(v),
                Err(e) if transient(&e) => {
                    self.con = None;
                    self.lost_connection = true;
                    if started.elapsed() >= self.reconnect {
                        return Err(StreamError::Unreachable {
                            url: self.url.clone(),
                            op,
                            after: started.elapsed(),
                            source: e,
                        });
                    }
                    tracing::debug!(url = %self.url, op, error = %e, "redis unavailable, retrying");
                    std::thread::sleep(RETRY);
                }
                Err(source) => return Err(StreamError::Broker { url: self.url.clone(), op, source }),
            }
        }
    }

    /// Creates `group` on `stream` reading from its first entry (and the stream if it does
    /// not exist yet); an existing group is kept as it is.
    pub fn ensure_group(&mut self, stream: &str, group: &str) -> Result<(), StreamError> {
        self.run("create the consumer group", |con| {
            match con.xgroup_create_mkstream::<_, _, _, ()>(stream, group, "0") {
                Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
                r => r,
            }
        })
    }

    /// Up to `count` entries: this consumer's own pending ones after `after` when `pending`
    /// (recovery), else new ones, waiting up to `block` for them.
    pub fn read_group(
        &mut self,
        stream: &str,
        group: &str,
        consumer: &str,
        pending_after: Option<&str>,
        count: usize,
        block: Duration,
    ) -> Result<Vec<StreamId>, StreamError> {
        let mut opts = StreamReadOptions::default().group(group, consumer).count(count.max(1));
        if pending_after.is_none() && !block.is_zero() {
            opts = opts.block(block.as_millis().max(1) as usize);
        }
        let id = pending_after.unwrap_or(">");
        let reply: Option<StreamReadReply> =
            self.run("read from the consumer group", |con| con.xread_options(&[stream], &[id], &opts))?;
        Ok(reply.map(|r| r.keys.into_iter().flat_map(|k| k.ids).collect()).unwrap_or_default())
    }

    /// Claims up to `count` entries other consumers of `group` have held unacknowledged
    /// for at least `min_idle` (XAUTOCLAIM): a dead reader's entries.
    pub fn autoclaim(
        &mut self,
        stream: &str,
        group: &str,
        consumer: &str,
        min_idle: Duration,
        count: usize,
    ) -> Result<Vec<StreamId>, StreamError> {
        let idle = min_idle.as_millis() as u64;
        let reply: StreamAutoClaimReply = self.run("claim idle pending entries", |con| {
            let opts = StreamAutoClaimOptions::default().count(count.max(1));
            con.xautoclaim_options(stream, group, consumer, idle, "0-0", opts)
        })?;
        Ok(reply.claimed)
    }

    pub fn ack(&mut self, stream: &str, group: &str, entries: &[String]) -> Result<(), StreamError> {
        if entries.is_empty() {
            return Ok(());
        }
        self.run("acknowledge entries", |con| con.xack::<_, _, _, ()>(stream, group, entries))
    }

    /// Entries in the stream.
    pub fn len(&mut self, stream: &str) -> Result<u64, StreamError> {
        self.run("read the stream length", |con| con.xlen(stream))
    }

    /// Entries of the stream not yet delivered to `group` (its lag).
    pub fn lag(&mut self, stream: &str, group: &str) -> Result<Option<u64>, StreamError> {
        let reply: redis::streams::StreamInfoGroupsReply =
            self.run("read the consumer group's lag", |con| con.xinfo_groups(stream))?;
        Ok(reply.groups.into_iter().find(|g| g.name == group).and_then(|g| g.lag).map(|l| l as u64))
    }

    /// Appends an entry of `fields`.
    pub fn add(&mut self, stream: &str, fields: &[(&str, &[u8])]) -> Result<String, StreamError> {
        self.run("append to the stream", |con| con.xadd(stream, "*", fields))
    }
}

/// Errors that a later attempt may not meet: the connection is gone, or the broker is
/// (re)starting.
fn transient(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || matches!(e.kind(), ErrorKind::BusyLoadingError | ErrorKind::TryAgain)
}

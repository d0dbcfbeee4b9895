//! The Redis side: a connection that reconnects by itself (a broker restart is waited
//! out for `reconnect`), and the handful of stream commands sluice uses.

use std::time::{Duration, Instant};

use redis::streams::{
    StreamClaimReply, StreamId, StreamPendingCountReply, StreamPendingReply, StreamReadOptions, StreamReadReply,
};
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

    /// Claims up to `count` entries that dead consumers of `group` hold: consumers other
    /// than `consumer` whose liveness key (`alive_key`) has expired, entries they have held
    /// unacknowledged for at least `min_idle`. A live consumer's entries are never taken,
    /// however long it holds them. XCLAIM checks the idle time again, atomically: a dead
    /// consumer restarted under its name re-reads its entries (which resets their idle
    /// time) before it could train them, so an entry is never in two hands.
    pub fn claim_from_dead(
        &mut self,
        stream: &str,
        group: &str,
        consumer: &str,
        alive_key: &dyn Fn(&str) -> String,
        min_idle: Duration,
        count: usize,
    ) -> Result<Vec<StreamId>, StreamError> {
        let idle = min_idle.as_millis() as u64;
        let summary: StreamPendingReply =
            self.run("list the consumer group's pending entries", |con| con.xpending(stream, group))?;
        let StreamPendingReply::Data(data) = summary else { return Ok(Vec::new()) };
        let mut claimed = Vec::new();
        for holder in data.consumers.iter().filter(|c| c.name != consumer && c.pending > 0) {
            let key = alive_key(&holder.name);
            let alive: bool = self.run("check a consumer's liveness", |con| con.exists(&key))?;
            if alive {
                continue;
            }
            let want = count.saturating_sub(claimed.len()).max(1);
            let pending: StreamPendingCountReply = self.run("list a dead consumer's pending entries", |con| {
                redis::cmd("XPENDING")
                    .arg(stream)
                    .arg(group)
                    .arg("IDLE")
                    .arg(idle)
                    .arg("-")
                    .arg("+")
                    .arg(want)
                    .arg(&holder.name)
                    .query(con)
            })?;
            let ids: Vec<&str> = pending.ids.iter().map(|p| p.id.as_str()).collect();
            if ids.is_empty() {
                continue;
            }
            let reply: StreamClaimReply =
                self.run("claim a dead consumer's entries", |con| con.xclaim(stream, group, consumer, idle, &ids))?;
            tracing::info!(from = %holder.name, entries = reply.ids.len(), "claimed entries a dead learner left unacknowledged");
            claimed.extend(reply.ids);
            if claimed.len() >= count {
                break;
            }
        }
        Ok(claimed)
    }

    /// Sets `key` for `ttl`: this learner is alive.
    pub fn set_alive(&mut self, key: &str, ttl: Duration) -> Result<(), StreamError> {
        let ms = ttl.as_millis().max(1) as u64;
        self.run("refresh this learner's liveness key", |con| con.pset_ex::<_, _, ()>(key, 1u8, ms))
    }

    pub fn del(&mut self, key: &str) -> Result<(), StreamError> {
        self.run("delete a key", |con| con.del::<_, ()>(key))
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

//! One connection's clock offset between a worker and this client, NTP-style: the client
//! sends the task's request at `t0` (its clock), the worker receives it at `t1` and sends a
//! batch at `t2` (its clock), the client receives that at `t3`. Whatever the delays either
//! way, the offset (worker minus client) lies within `bound` of
//! `((t1 - t0) + (t2 - t3)) / 2`, where `bound` is half the time on the wire,
//! `((t3 - t0) - (t2 - t1)) / 2`. Each batch of the connection is one more sample; the one
//! with the least wire time is kept (NTP's minimum-delay filter).

/// An estimated offset and its error bound, ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockOffset {
    /// Worker clock minus client clock.
    pub offset_ns: i64,
    /// The true offset is within this of `offset_ns`.
    pub bound_ns: u64,
}

impl ClockOffset {
    /// A worker timestamp in the client's clock.
    pub fn to_client(&self, worker_ns: u64) -> u64 {
        (i128::from(worker_ns) - i128::from(self.offset_ns)).clamp(0, i128::from(u64::MAX)) as u64
    }
}

/// The best estimate so far of one connection's offset.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct ConnClock {
    best: Option<ClockOffset>,
}

impl ConnClock {
    /// Folds in one request/response exchange; returns the best estimate so far.
    pub(super) fn observe(&mut self, t0: u64, t1: u64, t2: u64, t3: u64) -> ClockOffset {
        let (t0, t1, t2, t3) = (i128::from(t0), i128::from(t1), i128::from(t2), i128::from(t3));
        let wire = ((t3 - t0) - (t2 - t1)).max(0);
        let sample = ClockOffset {
            offset_ns: ((t1 - t0 + t2 - t3) / 2).clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64,
            // Rounded up: the halved offset above may be 0.5 ns off.
            bound_ns: ((wire + 1) / 2 + 1).min(i128::from(u64::MAX)) as u64,
        };
        let best = match self.best {
            Some(b) if b.bound_ns <= sample.bound_ns => b,
            _ => sample,
        };
        self.best = Some(best);
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_is_found_within_the_bound_and_the_least_delayed_exchange_wins() {
        // The worker's clock is 1_000 ahead; 30 ns out, 70 ns back, 500 ns of work.
        let mut c = ConnClock::default();
        let first = c.observe(100, 100 + 30 + 1_000, 100 + 30 + 1_000 + 500, 100 + 30 + 500 + 70);
        assert!((first.offset_ns - 1_000).unsigned_abs() <= first.bound_ns, "{first:?}");
        assert_eq!(first.bound_ns, 51);
        // A later batch that waited 400 ns in a queue on the way back: a worse sample.
        let later = c.observe(100, 1_130, 2_000, 2_000 - 1_000 + 400);
        assert_eq!(later, first, "the least delayed exchange is kept");
        // One that came straight back tightens the estimate.
        let tight = c.observe(100, 1_130, 3_000, 3_000 - 1_000 + 2);
        assert!(tight.bound_ns < first.bound_ns && (tight.offset_ns - 1_000).unsigned_abs() <= tight.bound_ns);
        assert_eq!(tight.to_client(5_000), 5_000 - tight.offset_ns as u64);
    }
}

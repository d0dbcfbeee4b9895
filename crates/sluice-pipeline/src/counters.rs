//! CPU counters per op, read on the worker thread at op boundaries while profiling is on
//! ([`crate::Loader::set_op_counters`]): `perf_event_open` software counters (task-clock,
//! page faults, context switches) and hardware ones (cycles, instructions, cache and branch
//! misses) where the machine has a PMU; `getrusage(RUSAGE_THREAD)` where perf events are
//! denied. Off, nothing is opened or read.

use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};

use perf_event::events::{Hardware, Software};
use perf_event::{Builder, Counter, Group};
use serde::Serialize;
use sluice_codec::StepProbe;

/// The counters, in the order of every `[u64; N]` here.
pub const COUNTER_NAMES: [&str; N] =
    ["task_clock_ns", "page_faults", "context_switches", "cycles", "instructions", "cache_misses", "branch_misses"];
pub(crate) const N: usize = 7;
const HARDWARE: [Hardware; 4] =
    [Hardware::CPU_CYCLES, Hardware::INSTRUCTIONS, Hardware::CACHE_MISSES, Hardware::BRANCH_MISSES];

/// Where the counts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CounterSource {
    /// perf events, software and hardware.
    PerfHardware,
    /// perf events, software only: the machine (a VM, often) exposes no PMU.
    PerfSoftware,
    /// `getrusage(RUSAGE_THREAD)`: perf events denied (`perf_event_paranoid`, no
    /// `CAP_PERFMON`). CPU time in µs steps, faults and context switches.
    Rusage,
}

/// One op's counts over all samples and threads; `None` where the source lacks a counter.
#[derive(Debug, Clone, Serialize)]
pub struct OpCounters {
    pub op: String,
    pub source: CounterSource,
    pub task_clock_ns: u64,
    pub page_faults: u64,
    pub context_switches: u64,
    pub cycles: Option<u64>,
    pub instructions: Option<u64>,
    pub cache_misses: Option<u64>,
    pub branch_misses: Option<u64>,
}

impl OpCounters {
    pub(crate) fn new(op: String, source: CounterSource, c: &[u64; N]) -> Self {
        let hw = |i: usize| (source == CounterSource::PerfHardware).then_some(c[i]);
        Self {
            op,
            source,
            task_clock_ns: c[0],
            page_faults: c[1],
            context_switches: c[2],
            cycles: hw(3),
            instructions: hw(4),
            cache_misses: hw(5),
            branch_misses: hw(6),
        }
    }
}

/// The machine has no PMU: said once per process.
static NO_PMU_SAID: AtomicBool = AtomicBool::new(false);
/// perf events see user space only: said once per process.
static USER_ONLY_SAID: AtomicBool = AtomicBool::new(false);
/// perf events are denied: said once per process.
static DENIED_SAID: AtomicBool = AtomicBool::new(false);

enum Backend {
    /// `kernel`: the counts include kernel time and events (privileged), without which
    /// perf sees no context switches.
    Perf {
        group: Group,
        members: Vec<Counter>,
        kernel: bool,
    },
    Rusage,
}

/// The calling thread's counters, and what they added up to per op since last taken.
pub struct ThreadCounters {
    backend: Backend,
    source: CounterSource,
    last: [u64; N],
    /// Index of the plan's step 0 in the op list, for the run now going on.
    pub base: usize,
    per_op: Vec<[u64; N]>,
}

impl std::fmt::Debug for ThreadCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadCounters").field("source", &self.source).field("base", &self.base).finish()
    }
}

impl ThreadCounters {
    /// Opens the best counters this thread can have, for `ops` ops.
    pub fn open(ops: usize) -> Self {
        let (backend, source) = match open_perf() {
            Ok(b) => b,
            Err(e) => {
                if !DENIED_SAID.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "perf events are not available ({e}); per-op counters come from getrusage(RUSAGE_THREAD) \
                         (CPU time, page faults, context switches)"
                    );
                }
                (Backend::Rusage, CounterSource::Rusage)
            }
        };
        if matches!(backend, Backend::Perf { kernel: false, .. }) && !USER_ONLY_SAID.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "perf events count user space only (perf_event_paranoid >= 2 without CAP_PERFMON): \
                 per-op context switches and kernel time are not counted"
            );
        }
        let mut c = Self { backend, source, last: [0; N], base: 0, per_op: vec![[0; N]; ops] };
        c.last = c.read();
        c
    }

    pub fn source(&self) -> CounterSource {
        self.source
    }

    /// The counters now; a failed read counts as no change.
    fn read(&mut self) -> [u64; N] {
        match &mut self.backend {
            Backend::Perf { group, members, .. } => match group.read() {
                Ok(data) => {
                    let mut v = [0; N];
                    for (slot, m) in v.iter_mut().zip(members.iter()) {
                        *slot = data.get(m).map_or(0, |e| e.value());
                    }
                    v
                }
                Err(_) => self.last,
            },
            Backend::Rusage => rusage_thread().unwrap_or(self.last),
        }
    }

    /// Starts a measurement: what follows until [`Self::done`] is one op's.
    pub fn mark(&mut self) {
        self.last = self.read();
    }

    /// Adds what the counters moved since the last mark to op `op`, and marks again.
    pub fn done(&mut self, op: usize) {
        let now = self.read();
        if let Some(acc) = self.per_op.get_mut(op) {
            for ((a, n), l) in acc.iter_mut().zip(now).zip(self.last) {
                *a += n.saturating_sub(l);
            }
        }
        self.last = now;
    }

    /// What each op added up to since the last take, zeroing it.
    pub fn take(&mut self) -> Vec<[u64; N]> {
        let zero = vec![[0; N]; self.per_op.len()];
        std::mem::replace(&mut self.per_op, zero)
    }
}

impl StepProbe for ThreadCounters {
    fn begin(&mut self) {
        self.mark();
    }

    fn step_done(&mut self, step: usize) {
        self.done(self.base + step);
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

fn open_perf() -> std::io::Result<(Backend, CounterSource)> {
    let software = [Software::TASK_CLOCK, Software::PAGE_FAULTS, Software::CONTEXT_SWITCHES];
    let mut group = Group::new()?;
    let mut members = Vec::with_capacity(N);
    let mut kernel = true;
    for e in software {
        // Context switches happen in the kernel: counted only with kernel events, which
        // `perf_event_paranoid` >= 2 denies without CAP_PERFMON; then user-only counts.
        let counter = match group.add(Builder::new(e).observe_self().any_cpu().include_kernel()) {
            Ok(c) => c,
            Err(_) => {
                kernel = false;
                group.add(Builder::new(e).observe_self().any_cpu())?
            }
        };
        members.push(counter);
    }
    let mut hardware = Vec::with_capacity(HARDWARE.len());
    for e in HARDWARE {
        match group.add(Builder::new(e).observe_self().any_cpu()) {
            Ok(c) => hardware.push(c),
            Err(e) => {
                if !NO_PMU_SAID.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "no hardware performance counters on this machine ({e}): no PMU (a VM, often); \
                         per-op counters are software only (task-clock, page faults, context switches)"
                    );
                }
                hardware.clear();
                break;
            }
        }
    }
    let source = if hardware.is_empty() { CounterSource::PerfSoftware } else { CounterSource::PerfHardware };
    members.extend(hardware);
    group.enable()?;
    Ok((Backend::Perf { group, members, kernel }, source))
}

/// This thread's CPU time (ns), page faults and context switches from `getrusage`.
fn rusage_thread() -> Option<[u64; N]> {
    // SAFETY: a zeroed rusage is a valid value for getrusage to overwrite.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_THREAD with a pointer to a live rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) } != 0 {
        return None;
    }
    let ns = |tv: libc::timeval| (tv.tv_sec as u64) * 1_000_000_000 + (tv.tv_usec as u64) * 1000;
    let mut v = [0; N];
    v[0] = ns(ru.ru_utime) + ns(ru.ru_stime);
    v[1] = (ru.ru_minflt + ru.ru_majflt) as u64;
    v[2] = (ru.ru_nvcsw + ru.ru_nivcsw) as u64;
    Some(v)
}

/// Forces the `getrusage` fallback, as where perf events are denied.
#[cfg(test)]
pub(crate) fn open_rusage(ops: usize) -> ThreadCounters {
    let mut c = ThreadCounters {
        backend: Backend::Rusage,
        source: CounterSource::Rusage,
        last: [0; N],
        base: 0,
        per_op: vec![[0; N]; ops],
    };
    c.last = c.read();
    c
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// This thread's CPU time, from the kernel's thread clock.
    fn thread_cpu_ns() -> u64 {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: a valid clock id and a pointer to a live timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }

    /// Burns `ms` of this thread's CPU time (not wall time: the machine is shared).
    fn spin(ms: u64) -> u64 {
        let t = thread_cpu_ns();
        let mut x = 0u64;
        while thread_cpu_ns() - t < ms * 1_000_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        x
    }

    /// Touches `pages` fresh pages.
    fn fault(pages: usize) -> usize {
        let mut v = vec![0u8; pages * 4096];
        for p in 0..pages {
            v[p * 4096] = 1;
        }
        std::hint::black_box(&v).iter().map(|&b| usize::from(b)).sum()
    }

    fn check(mut c: ThreadCounters) {
        c.mark();
        std::hint::black_box(spin(30));
        c.done(0);
        std::hint::black_box(fault(2000));
        c.done(1);
        std::thread::sleep(std::time::Duration::from_millis(20));
        c.done(2);
        let [cpu, faults, sleep] = &c.take()[..] else { panic!() };
        assert!((28_000_000..60_000_000).contains(&cpu[0]), "{:?}: spinning 30 ms of CPU: {cpu:?}", c.source);
        assert!(faults[1] >= 1000, "{:?}: 2000 fresh pages: {faults:?}", c.source);
        assert!(sleep[0] < 10_000_000, "{:?}: a sleep is not CPU: {sleep:?}", c.source);
        // Without kernel events (unprivileged, paranoid >= 2) perf cannot see switches.
        if matches!(c.backend, Backend::Rusage | Backend::Perf { kernel: true, .. }) {
            assert!(sleep[2] >= 1, "{:?}: a sleep is a context switch: {sleep:?}", c.source);
        }
        assert!(c.take().iter().all(|op| op.iter().all(|&v| v == 0)), "take zeroes");
    }

    #[test]
    fn perf_counters_attribute_cpu_faults_and_switches_to_the_op_that_caused_them() {
        let c = ThreadCounters::open(3);
        if c.source() == CounterSource::Rusage {
            eprintln!("perf events denied here: this test ran the getrusage fallback");
        }
        check(c);
    }

    #[test]
    fn the_getrusage_fallback_attributes_the_same_things() {
        check(open_rusage(3));
    }
}

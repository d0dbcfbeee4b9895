//! Processes on a real, bandwidth-limited network (`sluice-bench locality --netns-mbit`,
//! `sluice-bench s3`): each (a learner, a server) runs in a network namespace of its own,
//! its `eth0` one end of a veth pair whose other end joins a bridge in a hub namespace,
//! and its egress is shaped by `tc` (`tbf` for the rate, under `netem` for a delay when
//! one is asked), as a node's NIC would be. Member r is 10.77.0.(r + 1) inside its
//! namespace; nothing leaves the
//! namespaces. Names carry the process id and a run number, and every namespace is
//! deleted when the [`Net`] is dropped, also after a failure.

use std::process::Command;

/// Learners one /24 can address.
pub const MAX_LEARNERS: usize = 250;

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("`{cmd}` could not run: {source}")]
    Spawn { cmd: String, source: std::io::Error },
    #[error("`{cmd}` failed: {stderr}")]
    Failed { cmd: String, stderr: String },
    #[error("{learners} learners: network namespaces address at most {MAX_LEARNERS}")]
    TooMany { learners: usize },
}

/// The namespaces of one run.
pub struct Net {
    hub: String,
    learners: Vec<String>,
}

fn ip(args: &[&str]) -> Result<String, NetnsError> {
    let cmd = format!("ip {}", args.join(" "));
    let out =
        Command::new("ip").args(args).output().map_err(|source| NetnsError::Spawn { cmd: cmd.clone(), source })?;
    if !out.status.success() {
        return Err(NetnsError::Failed { cmd, stderr: String::from_utf8_lossy(&out.stderr).trim().to_string() });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Net {
    /// `p` learner namespaces on one bridge, each sending at most `mbit` Mbit/s, after
    /// `delay_ms` (0: no delay; needs the kernel's netem).
    pub fn create(tag: &str, p: usize, mbit: f64, delay_ms: f64) -> Result<Self, NetnsError> {
        if p > MAX_LEARNERS {
            return Err(NetnsError::TooMany { learners: p });
        }
        let mut net = Self { hub: format!("sluice-{tag}-hub"), learners: Vec::with_capacity(p) };
        ip(&["netns", "add", &net.hub])?;
        ip(&["-n", &net.hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &net.hub, "link", "set", "br0", "up"])?;
        let rate = format!("{mbit}mbit");
        for r in 0..p {
            let ns = format!("sluice-{tag}-{r}");
            ip(&["netns", "add", &ns])?;
            net.learners.push(ns.clone());
            let hub_end = format!("h{r}");
            ip(&["-n", &net.hub, "link", "add", &hub_end, "type", "veth", "peer", "name", "eth0", "netns", &ns])?;
            ip(&["-n", &net.hub, "link", "set", &hub_end, "master", "br0", "up"])?;
            ip(&["-n", &ns, "addr", "add", &format!("{}/24", net.addr(r)), "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            let tbf = ["tbf", "rate", &rate, "burst", "32kb", "latency", "400ms"];
            if delay_ms > 0.0 {
                let delay = format!("{delay_ms}ms");
                ip(&[
                    "netns", "exec", &ns, "tc", "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "netem",
                    "delay", &delay,
                ])?;
                let mut child =
                    vec!["netns", "exec", &ns, "tc", "qdisc", "add", "dev", "eth0", "parent", "1:1", "handle", "10:"];
                child.extend(tbf);
                ip(&child)?;
            } else {
                let mut root = vec!["netns", "exec", &ns, "tc", "qdisc", "add", "dev", "eth0", "root"];
                root.extend(tbf);
                ip(&root)?;
            }
        }
        Ok(net)
    }

    /// Learner `rank`'s address inside its namespace.
    pub fn addr(&self, rank: usize) -> String {
        format!("10.77.0.{}", rank + 1)
    }

    /// A command that runs `program` inside learner `rank`'s namespace.
    pub fn command(&self, rank: usize, program: &std::path::Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.learners[rank]]).arg(program);
        c
    }

    /// Bytes each learner has sent through its shaped link (tc's counters).
    pub fn sent_bytes(&self) -> Result<u64, NetnsError> {
        let mut total = 0;
        for ns in &self.learners {
            let out = ip(&["netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", "eth0"])?;
            let sent = out.split_whitespace().skip_while(|w| *w != "Sent").nth(1).and_then(|b| b.parse::<u64>().ok());
            total += sent.unwrap_or(0);
        }
        Ok(total)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of the veth pair, and with it the other end.
        for ns in self.learners.iter().chain(std::iter::once(&self.hub)) {
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("warning: could not delete network namespace {ns}: {e}");
            }
        }
    }
}

//! Shared memory between a worker and a client on the same machine (Linux): a region of
//! batch-sized slots in a memfd, handed to the client over a Unix socket (`SCM_RIGHTS`),
//! and the abstract-namespace sockets they meet on. The local data plane
//! ([`crate::dataplane`]) builds on these: a worker's loader builds each batch in a slot
//! and the client copies it out once, with no kernel socket copies, TCP processing or
//! per-chunk wake-ups (about 60 µs of CPU per 224² image over loopback TCP, BENCHMARKS).
//!
//! Trust: a region is sealed before it is handed out, so the client's view is read-only
//! and cannot shrink under the worker; and a client connects only to a listener running
//! as its own uid (`SO_PEERCRED`). Client and worker must therefore run as the same user
//! to share memory; otherwise the client uses TCP.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use tokio::io::Interest;
use tokio::net::{UnixListener, UnixStream};

/// A shared-memory region of `slots` slots of `slot_bytes` each, mapped into this process.
/// The worker creates it (read-write); the client maps what it received (read-only).
pub struct Region {
    id: u64,
    fd: OwnedFd,
    base: *mut u8,
    slots: u32,
    slot_bytes: usize,
    writable: bool,
}

// SAFETY: the mapping lives as long as the Region; who may touch which slot when is the
// data plane's protocol (a slot is written only after its reader has handed it back).
unsafe impl Send for Region {}
// SAFETY: as for Send: shared handles touch only the slots the protocol gives them.
unsafe impl Sync for Region {}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn region_len(slots: u32, slot_bytes: usize) -> io::Result<usize> {
    (slots as usize)
        .checked_mul(slot_bytes)
        .filter(|&n| n > 0 && n <= isize::MAX as usize)
        .ok_or_else(|| invalid(format!("a region of {slots} slots of {slot_bytes} bytes")))
}

/// Maps `len` bytes of `fd`, shared.
fn map(fd: &OwnedFd, len: usize, prot: libc::c_int) -> io::Result<*mut u8> {
    // SAFETY: a fresh mapping at an address the kernel picks; `fd` is open; errors checked.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p.cast())
}

/// A random id (regions and socket names must not collide between workers).
pub fn random_u64() -> u64 {
    let mut v = 0u64;
    // SAFETY: getrandom writes at most 8 bytes into `v`.
    let n = unsafe { libc::getrandom((&mut v as *mut u64).cast(), size_of::<u64>(), 0) };
    if n == size_of::<u64>() as isize {
        return v;
    }
    // No entropy source: time and pid, still distinct between processes and calls.
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    xxhash_rust::xxh3::xxh3_64(&[t.to_le_bytes().as_slice(), &std::process::id().to_le_bytes()].concat())
}

impl Region {
    /// A new region, zero-filled (the kernel allocates its pages as they are first written).
    /// Once this process has mapped it writable, it is sealed: its size is fixed and no one
    /// can write to it any more except through that mapping, so a client holding the fd
    /// can neither shrink it (the worker would die of SIGBUS) nor scribble on batches.
    pub fn create(slots: u32, slot_bytes: usize) -> io::Result<Self> {
        let len = region_len(slots, slot_bytes)?;
        // SAFETY: a NUL-terminated name; the returned fd is checked before use.
        let raw =
            unsafe { libc::memfd_create(c"sluice-batches".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain syscall on our fd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let base = map(&fd, len, libc::PROT_READ | libc::PROT_WRITE)?;
        let region = Self { id: random_u64(), fd, base, slots, slot_bytes, writable: true };
        // The writable mapping above outlives the seal; every later one is read-only.
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL;
        // SAFETY: plain fcntl on our fd.
        if unsafe { libc::fcntl(region.fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(region)
    }

    /// Maps a region received from a worker, read-only, after checking that the memory
    /// behind `fd` is as large as the worker says and sealed against shrinking (memory
    /// that could shrink under the mapping would kill this process with SIGBUS).
    pub fn open(fd: OwnedFd, id: u64, slots: u32, slot_bytes: usize) -> io::Result<Self> {
        let len = region_len(slots, slot_bytes)?;
        // SAFETY: plain fcntl on an open fd; a negative result is an error.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(invalid("shared region is not sealed against shrinking".into()));
        }
        // SAFETY: fstat fills a zeroed, valid stat struct for an open fd.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above: `st` is a valid stat struct and `fd` is open.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if (st.st_size as u64) < len as u64 {
            return Err(invalid(format!(
                "shared region of {} bytes is smaller than {slots} slots of {slot_bytes}",
                st.st_size
            )));
        }
        let base = map(&fd, len, libc::PROT_READ)?;
        Ok(Self { id, fd, base, slots, slot_bytes, writable: false })
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn slots(&self) -> u32 {
        self.slots
    }

    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }

    fn check(&self, slot: u32, len: usize) -> io::Result<*mut u8> {
        if slot >= self.slots || len > self.slot_bytes {
            return Err(invalid(format!(
                "slot {slot} with {len} bytes does not fit a region of {} slots of {} bytes",
                self.slots, self.slot_bytes
            )));
        }
        // SAFETY: slot < slots, so the offset stays inside the mapping.
        Ok(unsafe { self.base.add(slot as usize * self.slot_bytes) })
    }

    /// Where `slot` starts, for filling it in place (writable regions only). The caller
    /// makes sure nobody reads the slot meanwhile.
    pub fn slot_ptr(&self, slot: u32) -> io::Result<std::ptr::NonNull<u8>> {
        if !self.writable {
            return Err(invalid("a region mapped read-only cannot be written".into()));
        }
        std::ptr::NonNull::new(self.check(slot, 0)?).ok_or_else(|| invalid("null mapping".into()))
    }

    /// Copies `bytes` into `slot`. The caller makes sure nobody reads the slot meanwhile
    /// (its reader handed it back).
    pub fn write(&self, slot: u32, bytes: &[u8]) -> io::Result<()> {
        if !self.writable {
            return Err(invalid("a region mapped read-only cannot be written".into()));
        }
        let dst = self.check(slot, bytes.len())?;
        // SAFETY: in bounds (checked) of a writable mapping; the source is a distinct buffer.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
        Ok(())
    }

    /// The first `len` bytes of `slot`, copied out into a fresh buffer (one pass: the
    /// buffer is not zeroed first).
    pub fn read(&self, slot: u32, len: usize) -> io::Result<Vec<u8>> {
        let src = self.check(slot, len)?;
        let mut out = Vec::with_capacity(len);
        // SAFETY: in bounds (checked) of a readable mapping; `out` has room for `len` bytes,
        // which the copy initialises before the length is set.
        unsafe {
            std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), len);
            out.set_len(len);
        }
        Ok(out)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Ok(len) = region_len(self.slots, self.slot_bytes) {
            // SAFETY: unmapping exactly the mapping made in create/open, used by nobody now.
            unsafe { libc::munmap(self.base.cast(), len) };
        }
    }
}

/// Space for one control message carrying one fd, aligned as `cmsghdr` needs.
#[repr(C, align(8))]
struct FdSpace([u8; 32]);

/// Sends `bytes` (a small frame) with `fd` attached to its first byte.
pub async fn send_with_fd(sock: &UnixStream, bytes: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
    let sent = loop {
        sock.writable().await?;
        match sock.try_io(Interest::WRITABLE, || sendmsg_fd(sock.as_raw_fd(), bytes, fd.as_raw_fd())) {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    };
    // The fd went with the first byte; whatever did not fit follows as plain bytes.
    let mut rest = &bytes[sent..];
    while !rest.is_empty() {
        sock.writable().await?;
        match sock.try_write(rest) {
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn sendmsg_fd(sock: RawFd, bytes: &[u8], fd: RawFd) -> io::Result<usize> {
    let mut space = FdSpace([0; 32]);
    let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
    // SAFETY: an all-zero msghdr is valid; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = space.0.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is a pure size computation.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<RawFd>() as u32) } as _;
    // SAFETY: the control buffer is aligned and at least CMSG_SPACE(4) (≤ 24) bytes long,
    // so the first header and its data fit.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
    }
    // SAFETY: msg points at live buffers; MSG_NOSIGNAL turns a closed peer into EPIPE.
    let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Receives up to `buf.len()` bytes and the fd attached to them, if any. Read the first
/// byte of a frame sent by [`send_with_fd`] this way (a plain read would drop the fd).
pub async fn recv_with_fd(sock: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    loop {
        sock.readable().await?;
        match sock.try_io(Interest::READABLE, || recvmsg_fd(sock.as_raw_fd(), buf)) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

fn recvmsg_fd(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut space = FdSpace([0; 32]);
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: as in sendmsg_fd.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = space.0.as_mut_ptr().cast();
    msg.msg_controllen = space.0.len() as _;
    // SAFETY: msg points at live buffers of the sizes given.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut got: Option<OwnedFd> = None;
    // SAFETY: walking the control messages the kernel wrote into `space`, within
    // msg_controllen; each SCM_RIGHTS payload holds whole fds, which become ours.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c);
                let count = ((*c).cmsg_len as usize - (data as usize - c as usize)) / size_of::<RawFd>();
                for i in 0..count {
                    let fd = OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.cast::<RawFd>().add(i)));
                    // One fd is expected; any others are closed on drop.
                    if got.is_none() {
                        got = Some(fd);
                    }
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, got))
}

/// Listens on `name` in the abstract socket namespace: no file to clean up after a crash,
/// reachable from this network namespace only (like a loopback port).
pub fn listen_abstract(name: &str) -> io::Result<UnixListener> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let l = std::os::unix::net::UnixListener::bind_addr(&addr)?;
    l.set_nonblocking(true)?;
    UnixListener::from_std(l)
}

/// Connects to an abstract socket `name` (fails at once on another machine or namespace),
/// and only to a listener running as this process's user: abstract names are not files and
/// have no permissions, so any local process could bind a dead worker's name and collect
/// the tokens of the clients that still try it.
pub fn connect_abstract(name: &str) -> io::Result<UnixStream> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let s = std::os::unix::net::UnixStream::connect_addr(&addr)?;
    s.set_nonblocking(true)?;
    let s = UnixStream::from_std(s)?;
    // SAFETY: geteuid cannot fail.
    same_user(&s, name, unsafe { libc::geteuid() })?;
    Ok(s)
}

/// Refuses a peer that does not run as `uid` (its credentials as the kernel saw them).
fn same_user(s: &UnixStream, name: &str, uid: u32) -> io::Result<()> {
    let peer = s.peer_cred()?.uid();
    if peer != uid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("the listener on @{name} runs as uid {peer}, not as this process (uid {uid})"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_region_passed_over_a_socket_shows_the_writers_bytes_and_refuses_bad_slots() {
        let name = format!("sluice-test-{:x}", random_u64());
        let listener = listen_abstract(&name).unwrap();
        let region = Region::create(2, 1000).unwrap();
        region.write(1, &[7u8; 1000]).unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            send_with_fd(&s, b"Rhello", region.fd()).await.unwrap();
            s.write_all(b"after").await.unwrap();
            region.write(0, b"late").unwrap();
            // Keep the writer's mapping until the reader is done.
            let mut done = [0u8; 1];
            s.read_exact(&mut done).await.unwrap();
            region.id()
        });
        let mut c = connect_abstract(&name).unwrap();
        let mut first = [0u8; 1];
        let (n, fd) = recv_with_fd(&c, &mut first).await.unwrap();
        assert_eq!((n, &first), (1, b"R"));
        let fd = fd.expect("the fd arrives with the first byte");
        let mut rest = [0u8; 10];
        c.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"helloafter");

        let mapped = Region::open(fd.try_clone().unwrap(), 5, 2, 1000).unwrap();
        assert_eq!(mapped.read(1, 1000).unwrap(), vec![7u8; 1000]);
        assert!(mapped.read(2, 1).is_err(), "slot out of range");
        assert!(mapped.read(0, 1001).is_err(), "longer than a slot");
        assert!(mapped.write(0, b"x").is_err(), "the reader's mapping is read-only");
        // A worker claiming more memory than the fd has is refused.
        assert!(Region::open(fd, 5, 3, 1000).is_err());
        c.write_all(b"!").await.unwrap();
        server.await.unwrap();
        // Writes after the hand-over show through the shared pages.
        assert_eq!(mapped.read(0, 4).unwrap(), b"late");
    }

    /// What a client holds after the hand-over: the fd as `SCM_RIGHTS` delivers it.
    fn received(region: &Region) -> OwnedFd {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        sendmsg_fd(a.as_raw_fd(), b"R", region.fd().as_raw_fd()).unwrap();
        let (n, fd) = recvmsg_fd(b.as_raw_fd(), &mut [0u8; 1]).unwrap();
        assert_eq!(n, 1);
        fd.unwrap()
    }

    #[test]
    #[allow(clippy::undocumented_unsafe_blocks)] // one SAFETY comment below covers the syscalls
    fn a_client_cannot_resize_or_write_the_region_it_received() {
        let region = Region::create(2, 4096).unwrap();
        region.write(1, b"batch").unwrap();
        let fd = received(&region);
        let raw = fd.as_raw_fd();
        // SAFETY (all below): plain syscalls on an fd we own; results checked.
        assert_ne!(
            unsafe { libc::ftruncate(raw, 0) },
            0,
            "the client shrank the region (the worker would die of SIGBUS)"
        );
        assert_ne!(unsafe { libc::ftruncate(raw, 1 << 20) }, 0, "the client grew the region");
        assert!(unsafe { libc::pwrite(raw, b"x".as_ptr().cast(), 1, 0) } < 0, "the client wrote into the region");
        let len = 2 * 4096;
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, raw, 0)
        };
        if p != libc::MAP_FAILED {
            unsafe { libc::munmap(p, len) };
            panic!("the client mapped the region writable");
        }
        // A read-only mapping cannot be made writable later either.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, raw, 0) };
        assert_ne!(p, libc::MAP_FAILED);
        let upgraded = unsafe { libc::mprotect(p, len, libc::PROT_READ | libc::PROT_WRITE) };
        unsafe { libc::munmap(p, len) };
        assert_ne!(upgraded, 0, "the client made its mapping writable");
        // And it still reads the worker's batches.
        let mapped = Region::open(fd, region.id(), 2, 4096).unwrap();
        assert_eq!(mapped.read(1, 5).unwrap(), b"batch");
        region.write(0, b"later").unwrap();
        assert_eq!(mapped.read(0, 5).unwrap(), b"later");
    }

    #[test]
    fn a_client_refuses_memory_its_sender_could_still_shrink() {
        // SAFETY: a fresh memfd, sized, owned below.
        let fd = unsafe {
            let raw = libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC);
            assert!(raw >= 0);
            assert_eq!(libc::ftruncate(raw, 8192), 0);
            OwnedFd::from_raw_fd(raw)
        };
        let e = Region::open(fd, 1, 2, 4096).err().expect("an unsealed region is refused");
        assert!(e.to_string().contains("not sealed"), "{e}");
    }

    #[tokio::test]
    async fn a_listener_of_another_user_is_refused() {
        let name = format!("sluice-test-{:x}", random_u64());
        let _listener = listen_abstract(&name).unwrap();
        let ours = connect_abstract(&name).expect("a listener of this user is fine");
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        let e = same_user(&ours, &name, me + 1).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        if me != 0 {
            return; // only root can run a listener as another user below
        }
        // A squatter: a process of another user on the name. The child makes raw
        // syscalls only (no allocation after fork), on an address built before it.
        let squat = format!("sluice-test-{:x}", random_u64());
        // SAFETY: an all-zero sockaddr_un is valid; the name fits (it is short).
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (i, b) in squat.bytes().enumerate() {
            addr.sun_path[i + 1] = b as libc::c_char;
        }
        let len = (size_of::<libc::sa_family_t>() + 1 + squat.len()) as libc::socklen_t;
        let (tx, rx) = std::os::unix::net::UnixStream::pair().unwrap();
        // SAFETY: fork; the child below never returns.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: async-signal-safe syscalls on the child's own fds and the address above.
            unsafe {
                if libc::setuid(65534) == 0 {
                    let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                    let bound = libc::bind(fd, (&addr as *const libc::sockaddr_un).cast(), len) == 0;
                    if fd >= 0 && bound && libc::listen(fd, 8) == 0 {
                        libc::write(tx.as_raw_fd(), b"!".as_ptr().cast(), 1);
                        loop {
                            libc::pause();
                        }
                    }
                }
                libc::_exit(1);
            }
        }
        drop(tx);
        let mut ready = [0u8; 1];
        use std::io::Read;
        let got = (&rx).read(&mut ready);
        let e = connect_abstract(&squat).err();
        // SAFETY: ending and reaping our own child.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        assert_eq!(got.unwrap(), 1, "the squatter could not listen");
        let e = e.expect("connected to another user's listener");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    }

    #[test]
    fn connecting_to_a_name_nobody_listens_on_fails_at_once() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let _g = rt.enter();
        let e = connect_abstract(&format!("sluice-nobody-{:x}", random_u64())).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
    }
}

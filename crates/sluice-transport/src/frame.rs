//! The one length-prefixed framing of peer traffic: a little-endian `u32` body length,
//! then the body. Lengths are checked against the reader's cap before anything is
//! allocated, and a [`Deadline`] bounds the time a whole frame may take to arrive (a
//! per-read socket timeout alone would let a peer trickle one byte at a time).
//!
//! [`nonblocking`] (feature `tokio`) reads and writes the same frames on tokio sockets,
//! with the length's width a parameter ([`Prefix`]): the data plane's batch pixels carry a
//! `u64` length.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("a frame of {len} bytes (at most {max})")]
    TooLarge { len: u64, max: u64 },
}

/// How wide a frame's length is: `u32` (peer messages, the data plane's requests and
/// headers) or `u64` (the data plane's batch pixels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefix {
    U32,
    U64,
}

/// Reads one frame of at most `max` body bytes.
pub fn read_frame<R: Read>(r: &mut R, max: u32) -> Result<Vec<u8>, FrameError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    read_body(r, u32::from_le_bytes(len), max)
}

/// Reads the body of a frame whose length `len` was read already.
pub fn read_body<R: Read>(r: &mut R, len: u32, max: u32) -> Result<Vec<u8>, FrameError> {
    if len > max {
        return Err(FrameError::TooLarge { len: len.into(), max: max.into() });
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)?;
    Ok(body)
}

/// Writes one frame (length and body in one write, so a small frame is one segment).
pub fn write_frame<W: Write>(w: &mut W, body: &[u8]) -> io::Result<()> {
    let len = u32::try_from(body.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("a frame of {} bytes", body.len())))?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(body);
    w.write_all(&frame)
}

/// The same frames on tokio sockets: the service's data plane.
#[cfg(feature = "tokio")]
pub mod nonblocking {
    use std::io;

    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

    use super::{FrameError, Prefix};

    /// Reads a frame's length and checks it against `max` before anything is allocated.
    pub async fn read_len<R: AsyncRead + Unpin>(r: &mut R, prefix: Prefix, max: u64) -> Result<usize, FrameError> {
        let len = match prefix {
            Prefix::U32 => u64::from(r.read_u32_le().await?),
            Prefix::U64 => r.read_u64_le().await?,
        };
        if len > max {
            return Err(FrameError::TooLarge { len, max });
        }
        usize::try_from(len).map_err(|_| FrameError::TooLarge { len, max: usize::MAX as u64 })
    }

    /// Reads exactly `len` body bytes into a fresh buffer without zeroing it first: the
    /// kernel's copy is the only pass over the bytes (a zeroed `vec!` costs a second one,
    /// per batch on the data plane).
    pub async fn read_body<R: AsyncRead + Unpin>(r: &mut R, len: usize) -> io::Result<Vec<u8>> {
        use bytes::BufMut;
        let mut body = Vec::with_capacity(len);
        while body.len() < len {
            // Never past `len`: the next frame follows on the same connection.
            let want = len - body.len();
            if r.read_buf(&mut (&mut body).limit(want)).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        Ok(body)
    }

    /// Reads one frame of at most `max` body bytes.
    pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R, prefix: Prefix, max: u64) -> Result<Vec<u8>, FrameError> {
        let len = read_len(r, prefix, max).await?;
        Ok(read_body(r, len).await?)
    }

    /// Writes a frame's length (its body follows, written by the caller: a large body
    /// goes straight from where it is).
    pub async fn write_len<W: AsyncWrite + Unpin>(w: &mut W, prefix: Prefix, len: usize) -> io::Result<()> {
        let too_long = || io::Error::new(io::ErrorKind::InvalidInput, format!("a frame of {len} bytes"));
        match prefix {
            Prefix::U32 => w.write_u32_le(u32::try_from(len).map_err(|_| too_long())?).await,
            Prefix::U64 => w.write_u64_le(u64::try_from(len).map_err(|_| too_long())?).await,
        }
    }

    /// Writes one frame.
    pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, prefix: Prefix, body: &[u8]) -> io::Result<()> {
        write_len(w, prefix, body.len()).await?;
        w.write_all(body).await
    }
}

/// Reads from a socket until a deadline: every read waits at most the time left.
pub struct Deadline<'a> {
    stream: &'a TcpStream,
    until: Instant,
}

impl<'a> Deadline<'a> {
    pub fn after(stream: &'a TcpStream, limit: Duration) -> Self {
        Self { stream, until: Instant::now() + limit }
    }
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the frame did not arrive in time"));
        }
        self.stream.set_read_timeout(Some(left))?;
        let mut s = self.stream;
        s.read(buf).map_err(|e| match e.kind() {
            // A socket timeout reads as WouldBlock on Unix: it is the deadline passing.
            io::ErrorKind::WouldBlock => io::Error::new(io::ErrorKind::TimedOut, "the frame did not arrive in time"),
            _ => e,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn frames_round_trip_and_a_length_past_the_cap_allocates_nothing() {
        let mut wire = Vec::new();
        write_frame(&mut wire, b"abc").unwrap();
        write_frame(&mut wire, b"").unwrap();
        let mut r = io::Cursor::new(&wire);
        assert_eq!(read_frame(&mut r, 3).unwrap(), b"abc");
        assert_eq!(read_frame(&mut r, 3).unwrap(), b"");
        let huge = u32::MAX.to_le_bytes();
        assert!(matches!(read_frame(&mut &huge[..], 1 << 20), Err(FrameError::TooLarge { len: 0xffff_ffff, .. })));
        let truncated = [5, 0, 0, 0, 1, 2];
        assert!(matches!(read_frame(&mut &truncated[..], 10), Err(FrameError::Io(_))));
    }

    #[cfg(feature = "tokio")]
    #[tokio::test]
    async fn async_frames_match_the_blocking_ones_and_a_long_length_past_the_cap_allocates_nothing() {
        use super::nonblocking;
        let mut wire = Vec::new();
        write_frame(&mut wire, b"abc").unwrap();
        let mut r = &wire[..];
        assert_eq!(nonblocking::read_frame(&mut r, Prefix::U32, 3).await.unwrap(), b"abc");
        let mut out = Vec::new();
        nonblocking::write_frame(&mut out, Prefix::U32, b"abc").await.unwrap();
        assert_eq!(out, wire, "the same bytes as the blocking writer");

        let mut long = Vec::new();
        nonblocking::write_frame(&mut long, Prefix::U64, b"pixels").await.unwrap();
        assert_eq!(long[..8], 6u64.to_le_bytes());
        assert_eq!(nonblocking::read_frame(&mut &long[..], Prefix::U64, 6).await.unwrap(), b"pixels");
        let huge = u64::MAX.to_le_bytes();
        let err = nonblocking::read_frame(&mut &huge[..], Prefix::U64, 256 << 20).await.unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { len: u64::MAX, max } if max == 256 << 20), "{err}");
        let truncated = [5, 0, 0, 0, 1, 2];
        let err = nonblocking::read_frame(&mut &truncated[..], Prefix::U32, 10).await.unwrap_err();
        assert!(matches!(&err, FrameError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof), "{err}");
    }

    #[test]
    fn a_trickling_sender_is_cut_off_at_the_deadline() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let sender = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(&[100, 0, 0, 0]).unwrap();
            for _ in 0..20 {
                if s.write_all(&[1]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let (conn, _) = listener.accept().unwrap();
        let t = Instant::now();
        let err = read_frame(&mut Deadline::after(&conn, Duration::from_millis(300)), 1000).unwrap_err();
        assert!(matches!(&err, FrameError::Io(e) if e.kind() == io::ErrorKind::TimedOut), "{err}");
        assert!(t.elapsed() < Duration::from_millis(600), "{:?}", t.elapsed());
        drop(conn);
        sender.join().unwrap();
    }
}

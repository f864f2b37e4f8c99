//! The server's end of a REPL's control socket, as a reader and a writer
//! that the reactor watches separately: the reader for data only, the
//! writer only while a write is waiting for room.
//!
//! tokio's `UnixStream` asks epoll for both directions. Each time the REPL
//! reads a frame, the kernel announces room to write on the server's end,
//! and that woke a server thread for nothing, paid for by the REPL's read
//! (200 µs on a VM whose other vCPU idles) just as it starts the exec.
//! Frames to the REPL are small next to the socket's buffer, so a write
//! almost never waits; when one does, it registers a duplicate of the
//! descriptor for writability until it is done.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use bytes::BytesMut;
use nix::sys::socket::{send, MsgFlags};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// How much one read takes at most.
const READ_CHUNK: usize = 64 * 1024;

/// Split the server's end of a control socket. Neither half shuts the
/// socket down when dropped (tokio's write half does): the family's shim
/// keeps a copy of it across a server restart.
pub fn split(control: tokio::net::UnixStream) -> io::Result<(ControlReader, ControlWriter)> {
    let fd = OwnedFd::from(control.into_std()?);
    let writer = ControlWriter { fd: fd.try_clone()? };
    let reader = ControlReader { fd: watch(fd, Interest::READABLE)?, chunk: vec![0; READ_CHUNK] };
    Ok((reader, writer))
}

fn watch(fd: OwnedFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the AsyncFd owns the descriptor, which stays open and the same for its life.
    unsafe { AsyncFd::register_with_interest(fd, interest) }.map_err(|e| e.into_parts().1)
}

pub struct ControlReader {
    fd: AsyncFd<OwnedFd>,
    chunk: Vec<u8>,
}

impl ControlReader {
    /// Wait for data and append it to `buf`: the number of bytes, 0 at
    /// end of stream.
    pub async fn read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        loop {
            let mut ready = self.fd.readable().await?;
            match ready.try_io(|fd| rustix::io::read(fd.get_ref(), &mut self.chunk[..]).map_err(io::Error::from)) {
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Ok(n)) => {
                    buf.extend_from_slice(&self.chunk[..n]);
                    return Ok(n);
                }
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => {}
            }
        }
    }
}

pub struct ControlWriter {
    fd: OwnedFd,
}

impl ControlWriter {
    pub async fn write_all(&mut self, mut data: &[u8]) -> io::Result<()> {
        let mut waiting: Option<AsyncFd<OwnedFd>> = None;
        while !data.is_empty() {
            let sent = match send(self.fd.as_raw_fd(), data, MsgFlags::MSG_NOSIGNAL) {
                Err(nix::errno::Errno::EAGAIN) => {
                    let room = match &waiting {
                        Some(w) => w,
                        None => waiting.insert(watch(self.fd.try_clone()?, Interest::WRITABLE)?),
                    };
                    let mut ready = room.writable().await?;
                    match ready.try_io(|fd| send(fd.as_raw_fd(), data, MsgFlags::MSG_NOSIGNAL).map_err(io::Error::from)) {
                        Ok(sent) => sent,
                        Err(_would_block) => continue,
                    }
                }
                other => other.map_err(io::Error::from),
            };
            match sent {
                Ok(n) => data = &data[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn a_write_larger_than_the_socket_buffer_waits_for_room_and_arrives_whole() {
        let (ours, mut peer) = tokio::net::UnixStream::pair().unwrap();
        let (_reader, mut writer) = split(ours).unwrap();
        let data: Vec<u8> = (0..(8usize << 20)).map(|i| (i % 251) as u8).collect();
        let reading = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut chunk = vec![0u8; 4096];
            while got.len() < 8 << 20 {
                tokio::time::sleep(std::time::Duration::from_micros(50)).await;
                let n = peer.read(&mut chunk).await.unwrap();
                assert!(n > 0, "end of stream after {} bytes", got.len());
                got.extend_from_slice(&chunk[..n]);
            }
            (got, peer)
        });
        writer.write_all(&data).await.unwrap();
        let (got, _peer) = reading.await.unwrap();
        assert!(got == data, "the bytes differ");
    }

    #[tokio::test]
    async fn the_reader_gets_what_the_peer_sends_then_the_end() {
        let (ours, mut peer) = tokio::net::UnixStream::pair().unwrap();
        let (mut reader, _writer) = split(ours).unwrap();
        let mut buf = BytesMut::new();
        peer.write_all(b"frame one").await.unwrap();
        assert_eq!(reader.read_buf(&mut buf).await.unwrap(), 9);
        peer.write_all(b", two").await.unwrap();
        drop(peer);
        while reader.read_buf(&mut buf).await.unwrap() > 0 {}
        assert_eq!(&buf[..], b"frame one, two");
    }

    #[tokio::test]
    async fn a_write_to_a_closed_peer_is_an_error() {
        let (ours, peer) = tokio::net::UnixStream::pair().unwrap();
        let (_reader, mut writer) = split(ours).unwrap();
        drop(peer);
        let e = writer.write_all(b"X").await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }
}

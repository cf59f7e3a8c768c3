//! Passing open files over unix sockets (`SCM_RIGHTS`).
//!
//! virt-handler hands the launcher an open disk image with the protocol command `passFile`
//! ([`crate::protocol`]), and the launcher hands it on to QEMU with QMP `add-fd`
//! ([`crate::qmp`]). Both send one line of bytes together with one descriptor:
//! [`send_with_fd`] writes the whole line and attaches the descriptor to the first `sendmsg`,
//! so it travels with the line's first byte. [`FdLineReader`] reads lines with `recvmsg` and
//! queues the descriptors that came along, oldest first, for the lines that claim them.
//!
//! # Guarantees
//! - A received descriptor is an [`OwnedFd`] from the moment it is received, close-on-exec
//!   (`MSG_CMSG_CLOEXEC`: no child inherits it by accident); one that no line claims is closed.
//! - The kernel returns a `sendmsg`'s descriptors with the first byte of its data, and ends a
//!   read right after the data they came with, so a descriptor is never received before the
//!   first byte of its line. [`FdLineReader::next_line`] therefore closes the descriptors still
//!   queued whenever every line received so far has been handed out and no partial line is
//!   buffered: no later line can be the one they were sent with.
//! - The control buffer holds [`MAX_FDS_PER_MESSAGE`] descriptors, the most one `sendmsg` may
//!   carry, and one read never returns the descriptors of two `sendmsg` calls, so the control
//!   data is never truncated (the kernel would install the descriptors that fit, which could
//!   then not be handed out).
//! - [`FdLineReader::next_line`] is cancel-safe (for `tokio::select!`): received bytes and
//!   descriptors are stored before it can be suspended again.
//!
//! # Caveats
//! - Descriptors are matched to lines by order, not by byte position: a peer that sends a
//!   descriptor with a line that claims none and, in the same read, a line that claims one but
//!   carries none, has the first descriptor given to the second line. A peer that sends a
//!   descriptor only with the lines that claim one never meets this.

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use tokio::io::Interest;
use tokio::net::UnixStream;

/// The most descriptors one `sendmsg` may carry on Linux (`SCM_MAX_FD`).
pub const MAX_FDS_PER_MESSAGE: usize = 253;

/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 16 * 1024;

/// Writes all of `bytes` on `stream`, with `fd` attached to the first chunk the kernel takes.
///
/// # Errors
/// The socket's error; `InvalidInput` for empty `bytes` (a descriptor needs a byte to travel
/// with).
pub async fn send_with_fd(stream: &UnixStream, bytes: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
    if bytes.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a descriptor cannot be sent without data",
        ));
    }
    let fds = [fd.as_raw_fd()];
    let rights = [ControlMessage::ScmRights(&fds)];
    let mut sent = 0;
    while sent < bytes.len() {
        stream.writable().await?;
        let cmsgs: &[ControlMessage] = if sent == 0 { &rights } else { &[] };
        let written = stream.try_io(Interest::WRITABLE, || {
            let iov = [IoSlice::new(&bytes[sent..])];
            sendmsg::<()>(
                stream.as_raw_fd(),
                &iov,
                cmsgs,
                MsgFlags::MSG_NOSIGNAL,
                None,
            )
            .map_err(io::Error::from)
        });
        match written {
            Ok(n) => sent += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads `\n`-terminated lines from a unix stream and keeps the descriptors that arrive with
/// them (see the module's Guarantees).
#[derive(Debug)]
pub struct FdLineReader<S> {
    stream: S,
    buffer: Vec<u8>,
    control: Vec<u8>,
    fds: VecDeque<OwnedFd>,
    at_end: bool,
}

impl<S: AsRef<UnixStream>> FdLineReader<S> {
    /// A reader of `stream` (a [`UnixStream`] or one of its read halves).
    pub fn new(stream: S) -> Self {
        Self {
            stream,
            buffer: Vec::new(),
            control: nix::cmsg_space!([RawFd; MAX_FDS_PER_MESSAGE]),
            fds: VecDeque::new(),
            at_end: false,
        }
    }

    /// The next line without its line ending (`\n` or `\r\n`); `None` at the end of the
    /// stream. A last line without `\n` is returned too.
    ///
    /// # Errors
    /// The socket's error; `InvalidData` for a line that is not UTF-8.
    pub async fn next_line(&mut self) -> io::Result<Option<String>> {
        loop {
            if self.buffer.is_empty() {
                self.close_unclaimed();
            }
            if let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                let mut line: Vec<u8> = self.buffer.drain(..=end).collect();
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return utf8(line).map(Some);
            }
            if self.at_end {
                if self.buffer.is_empty() {
                    return Ok(None);
                }
                return utf8(std::mem::take(&mut self.buffer)).map(Some);
            }
            self.fill().await?;
        }
    }

    /// The oldest descriptor received and not yet taken, for the line just returned.
    pub fn take_fd(&mut self) -> Option<OwnedFd> {
        self.fds.pop_front()
    }

    fn close_unclaimed(&mut self) {
        if !self.fds.is_empty() {
            tracing::warn!(
                count = self.fds.len(),
                "closing file descriptors that no line claimed"
            );
            self.fds.clear();
        }
    }

    /// Reads once from the socket: appends the bytes and queues the descriptors.
    async fn fill(&mut self) -> io::Result<()> {
        let stream = self.stream.as_ref();
        loop {
            stream.readable().await?;
            let start = self.buffer.len();
            self.buffer.resize(start + READ_CHUNK, 0);
            let (buffer, control, fds) = (&mut self.buffer, &mut self.control, &mut self.fds);
            let received = stream.try_io(Interest::READABLE, || {
                receive(stream.as_raw_fd(), &mut buffer[start..], control, fds)
            });
            match received {
                Ok(n) => {
                    self.buffer.truncate(start + n);
                    self.at_end = n == 0;
                    return Ok(());
                }
                Err(e) => {
                    self.buffer.truncate(start);
                    if !matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) {
                        return Err(e);
                    }
                }
            }
        }
    }
}

/// One `recvmsg` into `into`; the descriptors that came along are pushed onto `fds`.
fn receive(
    socket: RawFd,
    into: &mut [u8],
    control: &mut [u8],
    fds: &mut VecDeque<OwnedFd>,
) -> io::Result<usize> {
    let mut iov = [IoSliceMut::new(into)];
    let message = recvmsg::<()>(socket, &mut iov, Some(control), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(io::Error::from)?;
    match message.cmsgs() {
        Ok(cmsgs) => {
            for cmsg in cmsgs {
                if let ControlMessageOwned::ScmRights(received) = cmsg {
                    fds.extend(received.into_iter().map(owned));
                }
            }
        }
        // Cannot happen with a buffer for MAX_FDS_PER_MESSAGE (see the module's Guarantees).
        Err(e) => tracing::warn!(error = %e, "truncated control data: descriptors were lost"),
    }
    Ok(message.bytes)
}

/// Takes ownership of a descriptor `recvmsg` has just installed.
#[allow(unsafe_code)]
fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: the kernel installed `fd` in this process's descriptor table for the `recvmsg`
    // that returned it a moment ago; nothing else has seen the number, so this is its only
    // owner and it is open.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn utf8(line: Vec<u8>) -> io::Result<String> {
    String::from_utf8(line).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsFd;

    use super::*;
    use crate::test_support::{assert_closed, pipe};

    /// A connected pair: the client's stream and the server's read half.
    fn pair() -> (UnixStream, tokio::net::unix::OwnedReadHalf) {
        let (client, server) = UnixStream::pair().unwrap();
        (client, server.into_split().0)
    }

    #[tokio::test]
    async fn a_descriptor_arrives_with_its_line_and_refers_to_the_same_file() {
        let (client, server) = pair();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(b"disk contents").unwrap();
        send_with_fd(&client, b"first\n", file.as_fd())
            .await
            .unwrap();
        let mut reader = FdLineReader::new(server);
        assert_eq!(reader.next_line().await.unwrap().as_deref(), Some("first"));
        let mut received = std::fs::File::from(reader.take_fd().expect("a descriptor"));
        assert!(reader.take_fd().is_none(), "exactly one");
        received.rewind().unwrap();
        let mut contents = String::new();
        received.read_to_string(&mut contents).unwrap();
        assert_eq!(contents, "disk contents");
        let flags = nix::fcntl::fcntl(&received, nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert_ne!(flags & nix::libc::FD_CLOEXEC, 0, "received close-on-exec");
    }

    #[tokio::test]
    async fn a_line_longer_than_the_socket_buffer_arrives_whole_with_one_descriptor() {
        let (client, server) = pair();
        let (mut read, write) = pipe();
        let mut line = "x".repeat(4 << 20);
        line.push('\n');
        let reading = tokio::spawn(async move {
            let mut reader = FdLineReader::new(server);
            let got = reader.next_line().await.unwrap().unwrap();
            let fd = reader.take_fd();
            let more = reader.take_fd();
            (got.len(), fd, more.is_none())
        });
        send_with_fd(&client, line.as_bytes(), write.as_fd())
            .await
            .unwrap();
        drop(write);
        let (len, fd, only_one) = reading.await.unwrap();
        assert_eq!(len, 4 << 20);
        assert!(only_one);
        let fd = fd.expect("the descriptor");
        drop(fd);
        assert_closed(&mut read).await;
    }

    #[tokio::test]
    async fn descriptors_no_line_claims_are_closed_once_their_lines_are_handled() {
        let (client, server) = pair();
        let (mut read, write) = pipe();
        send_with_fd(&client, b"unclaimed\n", write.as_fd())
            .await
            .unwrap();
        drop(write);
        client.try_write(b"next\n").unwrap();
        let mut reader = FdLineReader::new(server);
        assert_eq!(
            reader.next_line().await.unwrap().as_deref(),
            Some("unclaimed")
        );
        // The line is handled without taking the descriptor; reading on closes it.
        assert_eq!(reader.next_line().await.unwrap().as_deref(), Some("next"));
        assert!(reader.take_fd().is_none());
        assert_closed(&mut read).await;
    }

    #[tokio::test]
    async fn descriptors_are_taken_in_arrival_order_and_the_end_is_reported() {
        let (client, server) = pair();
        let (first, second) = (tempfile::tempfile().unwrap(), tempfile::tempfile().unwrap());
        first.set_len(1).unwrap();
        second.set_len(2).unwrap();
        send_with_fd(&client, b"a\n", first.as_fd()).await.unwrap();
        send_with_fd(&client, b"b\r\nc", second.as_fd())
            .await
            .unwrap();
        drop(client);
        let mut reader = FdLineReader::new(server);
        let mut sizes = Vec::new();
        for expected in ["a", "b", "c"] {
            assert_eq!(reader.next_line().await.unwrap().as_deref(), Some(expected));
            if let Some(fd) = reader.take_fd() {
                sizes.push(std::fs::File::from(fd).metadata().unwrap().len());
            }
        }
        assert_eq!(sizes, [1, 2]);
        assert_eq!(reader.next_line().await.unwrap(), None);
    }
}

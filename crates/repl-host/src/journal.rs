//! A REPL's output journal: what it held back but had not yet written when
//! it died (docs/repl-protocol.md, *Output is held briefly*).
//!
//! The REPL keeps every byte it means to write to its control socket in a
//! memfd at fd 8 as well, mapped shared, until the socket has taken it. The
//! server takes its own copy of that memfd while the REPL lives
//! (`pidfd_getfd`), counts the bytes the socket brings, and after the REPL's
//! death reads the journal's tail beyond that count: output printed just
//! before a kill that the REPL had no chance to send.
//!
//! Layout: a 24-byte header, little-endian (u64 stream offset of the first
//! byte kept, u32 length, u32 *open frame*, u32 *foreign writes*, 4 spare
//! bytes), then that many bytes of frames. The open frame, if the word is
//! not 0, starts at that offset minus one and runs to the end: the output
//! still pending in the REPL, whose length field the REPL does not keep up
//! to date (one store less per write); it is worked out here. Foreign
//! writes, if not 0, say that a fork child of user code wrote frames of its
//! own on the REPL's socket: the REPL's offsets no longer match the stream,
//! and the journal is not read.
//! The REPL runs the sandbox's code, so the descriptor and its contents are
//! untrusted: it must be a memfd, at most `MAX_SIZE` is read, and what comes
//! out is only fed to the same bounded frame parser as the socket.

use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{fcntl_get_seals, fstat, FileType};
use rustix::io::pread;
use rustix::process::{pidfd_getfd, PidfdGetfdFlags};

/// The REPL's journal descriptor.
pub const FD: i32 = 8;
const HEADER: usize = 24;
/// More than the REPL's journal ever holds (33 pages).
const MAX_SIZE: usize = 256 << 10;

pub struct Journal {
    memfd: OwnedFd,
}

impl Journal {
    /// Take a copy of the journal of the live process behind `pidfd`; None
    /// if it has none (an older REPL, a failed memfd) or put something else
    /// at fd 8.
    pub fn take(pidfd: impl AsFd) -> Option<Journal> {
        let fd = pidfd_getfd(pidfd, FD, PidfdGetfdFlags::empty()).ok()?;
        let st = fstat(&fd).ok()?;
        // Seals exist only on memfds (and shmem): not a file whose read
        // could block, nor one the sandbox can grow without bound.
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || fcntl_get_seals(&fd).is_err() {
            return None;
        }
        Some(Journal { memfd: fd })
    }

    /// The bytes of the REPL's control stream from offset `received` on that
    /// the journal still holds (empty when it holds nothing past it, or when
    /// its header does not describe a range that starts at or before it).
    pub fn unsent(&self, received: u64) -> Vec<u8> {
        let mut header = [0u8; HEADER];
        if pread(&self.memfd, &mut header, 0).ok() != Some(HEADER) {
            return Vec::new();
        }
        let word = |at: usize| u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]]);
        let start = u64::from(word(0)) | u64::from(word(4)) << 32;
        let (len, open, foreign) = (word(8) as usize, word(12) as usize, word(16));
        if foreign != 0 {
            return Vec::new();
        }
        let Some(skip) = received.checked_sub(start).and_then(|s| usize::try_from(s).ok()) else { return Vec::new() };
        if len > MAX_SIZE - HEADER || skip >= len {
            return Vec::new();
        }
        let mut data = vec![0u8; len];
        match pread(&self.memfd, &mut data, HEADER as u64) {
            Ok(n) if n == len => {}
            _ => return Vec::new(),
        }
        if let Some(at) = open.checked_sub(1).filter(|at| at + 5 <= len) {
            let frame_len = (len - at - 4) as u32;
            data[at..at + 4].copy_from_slice(&frame_len.to_be_bytes());
        }
        data.split_off(skip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::{ftruncate, memfd_create, MemfdFlags};
    use rustix::io::pwrite;

    fn journal(start: u64, data: &[u8]) -> Journal {
        journal_open(start, data, 0)
    }

    fn journal_open(start: u64, data: &[u8], open: u32) -> Journal {
        journal_with(start, data, open, 0)
    }

    fn journal_with(start: u64, data: &[u8], open: u32, foreign: u32) -> Journal {
        let fd = memfd_create("test-journal", MemfdFlags::CLOEXEC).unwrap();
        ftruncate(&fd, (HEADER + 4096) as u64).unwrap();
        let mut header = [0u8; HEADER];
        header[..8].copy_from_slice(&start.to_le_bytes());
        header[8..12].copy_from_slice(&(data.len() as u32).to_le_bytes());
        header[12..16].copy_from_slice(&open.to_le_bytes());
        header[16..20].copy_from_slice(&foreign.to_le_bytes());
        pwrite(&fd, &header, 0).unwrap();
        pwrite(&fd, data, HEADER as u64).unwrap();
        Journal { memfd: fd }
    }

    #[test]
    fn gives_what_the_socket_did_not_bring() {
        let j = journal(100, b"abcdef");
        assert_eq!(j.unsent(100), b"abcdef");
        // a write cut short: the socket brought the first two bytes
        assert_eq!(j.unsent(102), b"cdef");
        assert_eq!(j.unsent(106), b"");
    }

    #[test]
    fn the_open_frame_gets_its_length() {
        // a whole frame, then an open one whose length field is stale
        let data = b"\0\0\0\x03Oab\0\0\0\x01Ehello";
        let j = journal_open(7, data, 7 + 1);
        assert_eq!(j.unsent(7), b"\0\0\0\x03Oab\0\0\0\x06Ehello");
        assert_eq!(j.unsent(14), b"\0\0\0\x06Ehello");
        // an open frame said to start past the end is left alone
        assert_eq!(journal_open(0, b"\0\0\0\x03Oab", 7).unsent(0), b"\0\0\0\x03Oab");
    }

    #[test]
    fn foreign_writes_void_the_journal() {
        assert_eq!(journal_with(5, b"\0\0\0\x03Oab", 0, 0).unsent(5), b"\0\0\0\x03Oab");
        assert_eq!(journal_with(5, b"\0\0\0\x03Oab", 0, 1).unsent(5), b"");
    }

    #[test]
    fn a_header_that_does_not_fit_gives_nothing() {
        // the journal starts past what the socket brought: bytes between
        // were lost or the offsets are not ours (never guess)
        assert_eq!(journal(100, b"abc").unsent(99), b"");
        // more than was ever received and kept
        assert_eq!(journal(0, b"abc").unsent(10), b"");
        // a length past the file (the sandbox wrote the header): what is there
        let fd = memfd_create("test-journal", MemfdFlags::CLOEXEC).unwrap();
        ftruncate(&fd, 32).unwrap();
        pwrite(&fd, &[0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f], 0).unwrap();
        assert_eq!(Journal { memfd: fd }.unsent(0), b"");
    }

    /// A process that puts what `setup` (Python) opens at fd 8, says so
    /// and waits.
    fn holding(setup: &str) -> (std::process::Child, OwnedFd) {
        use std::io::BufRead;
        let code = format!("import os, sys, time\nfd = {setup}\nos.dup2(fd, 8)\nprint('ok', flush=True)\ntime.sleep(30)");
        let mut child = std::process::Command::new("python3").args(["-c", &code]).stdout(std::process::Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line, "ok\n");
        let pidfd = jail::sys::pidfd_open(nix::unistd::Pid::from_raw(child.id() as i32)).unwrap();
        (child, pidfd)
    }

    #[test]
    fn only_a_memfd_is_taken() {
        for (setup, taken) in [
            ("os.memfd_create('j')", true),
            ("os.open('/etc/passwd', os.O_RDONLY)", false),
            ("os.pipe()[0]", false),
            ("os.open('/dev/zero', os.O_RDONLY)", false),
        ] {
            let (mut child, pidfd) = holding(setup);
            assert_eq!(Journal::take(&pidfd).is_some(), taken, "{setup}");
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }
}

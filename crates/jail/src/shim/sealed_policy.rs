//! The compiled seccomp policy, carried from the shim into each member's
//! init across its exec. Compiling `policy/seccomp.json` costs about
//! 1 ms of CPU (JSON twice, then BPF), and every member's init did it
//! afresh: for a fork(32) that built 24 members on the spot, and for every
//! member the warm pool makes under load. The shim compiles it once, at
//! start, into a sealed memfd that no process can change; an init reads
//! its programs from there (fd [`INIT_FD`]) and closes it before it
//! serves. An init without one (a solo member's, exec'd with its standard
//! streams only) compiles the policy itself.
//!
//! The layout: [`MAGIC`], then for each of `member`, `member_enosys` and
//! `repl`: its instruction count (u32), then each instruction (code u16,
//! jt u8, jf u8, k u32), all native-endian: the same binary writes and
//! reads it on the same machine.

use std::io::{Seek, Write};
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use seccompiler::{sock_filter, BpfProgram};

use crate::policy::SeccompPolicy;

/// Where an exec'd init finds the memfd.
pub const INIT_FD: RawFd = 5;
const MAGIC: &[u8; 8] = b"FKSECC01";
/// A real filter has a few hundred instructions; the kernel takes at most
/// 4096 per program (BPF_MAXINSNS).
const MAX_INSTRUCTIONS: usize = 4096;
const SEALS: SealFlag = SealFlag::F_SEAL_SEAL.union(SealFlag::F_SEAL_SHRINK).union(SealFlag::F_SEAL_GROW).union(SealFlag::F_SEAL_WRITE);

/// Why a memfd could not be read as a policy (the init then compiles it).
#[derive(Debug, thiserror::Error)]
pub enum SealedPolicyError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Sys(#[from] nix::Error),
    #[error("the memfd is not sealed against writes")]
    NotSealed,
    #[error("not a compiled policy: {0}")]
    Malformed(&'static str),
}

/// `policy`, in a new sealed memfd (close-on-exec).
pub fn seal(policy: &SeccompPolicy) -> Result<OwnedFd, SealedPolicyError> {
    let flags = nix::sys::memfd::MFdFlags::MFD_CLOEXEC | nix::sys::memfd::MFdFlags::MFD_ALLOW_SEALING;
    let fd = nix::sys::memfd::memfd_create(c"forkbox-seccomp", flags)?;
    let mut bytes = MAGIC.to_vec();
    for program in [&policy.member, &policy.member_enosys, &policy.repl] {
        bytes.extend_from_slice(&(program.len() as u32).to_ne_bytes());
        for insn in program {
            bytes.extend_from_slice(&insn.code.to_ne_bytes());
            bytes.extend_from_slice(&[insn.jt, insn.jf]);
            bytes.extend_from_slice(&insn.k.to_ne_bytes());
        }
    }
    let mut file = std::fs::File::from(fd);
    file.write_all(&bytes)?;
    file.rewind()?;
    fcntl(&file, FcntlArg::F_ADD_SEALS(SEALS))?;
    Ok(OwnedFd::from(file))
}

/// In an exec'd init: the policy in the memfd at [`INIT_FD`], which is
/// closed either way. `None` if there is none there.
pub fn take_inherited() -> Option<Result<SeccompPolicy, SealedPolicyError>> {
    // SAFETY: only a stat of the descriptor number, which may be closed.
    let open = nix::sys::stat::fstat(unsafe { BorrowedFd::borrow_raw(INIT_FD) }).is_ok();
    if !open {
        return None;
    }
    // SAFETY: open (checked above) and nothing else in this process owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(INIT_FD) };
    Some(read(fd.as_fd()))
}

/// The policy in sealed memfd `fd`, read from its start.
pub fn read(fd: BorrowedFd<'_>) -> Result<SeccompPolicy, SealedPolicyError> {
    let seals = SealFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GET_SEALS)?);
    if !seals.contains(SealFlag::F_SEAL_WRITE | SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW) {
        return Err(SealedPolicyError::NotSealed);
    }
    // By position, never through the file offset: every init the shim
    // forks shares this description's offset with the others.
    let file = std::fs::File::from(fd.try_clone_to_owned()?);
    let mut bytes = vec![0; file.metadata()?.len() as usize];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut bytes, 0)?;
    let rest = bytes.strip_prefix(MAGIC.as_slice()).ok_or(SealedPolicyError::Malformed("no magic"))?;
    let mut cursor = Cursor(rest);
    let member = cursor.program()?;
    let member_enosys = cursor.program()?;
    let repl = cursor.program()?;
    if !cursor.0.is_empty() {
        return Err(SealedPolicyError::Malformed("bytes after the last program"));
    }
    Ok(SeccompPolicy { member, member_enosys, repl })
}

struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], SealedPolicyError> {
        let (head, rest) = self.0.split_first_chunk::<N>().ok_or(SealedPolicyError::Malformed("truncated"))?;
        self.0 = rest;
        Ok(*head)
    }

    fn program(&mut self) -> Result<BpfProgram, SealedPolicyError> {
        let n = u32::from_ne_bytes(self.take()?) as usize;
        if n == 0 || n > MAX_INSTRUCTIONS {
            return Err(SealedPolicyError::Malformed("a program's length is out of range"));
        }
        (0..n)
            .map(|_| {
                let insn: [u8; 8] = self.take()?;
                Ok(sock_filter {
                    code: u16::from_ne_bytes([insn[0], insn[1]]),
                    jt: insn[2],
                    jf: insn[3],
                    k: u32::from_ne_bytes([insn[4], insn[5], insn[6], insn[7]]),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn compiled() -> SeccompPolicy {
        crate::policy::seccomp().expect("the policy compiles")
    }

    #[test]
    fn a_sealed_policy_reads_back_as_compiled() {
        let policy = compiled();
        let fd = seal(&policy).unwrap();
        let back = read(fd.as_fd()).unwrap();
        assert_eq!(back.member, policy.member);
        assert_eq!(back.member_enosys, policy.member_enosys);
        assert_eq!(back.repl, policy.repl);
    }

    #[test]
    fn the_memfd_cannot_be_written_or_resized() {
        let fd = seal(&compiled()).unwrap();
        let mut file = std::fs::File::from(fd.try_clone().unwrap());
        assert!(file.write_all(b"x").is_err());
        assert!(file.set_len(8).is_err());
        assert!(fcntl(&fd, FcntlArg::F_ADD_SEALS(SealFlag::empty())).is_err(), "F_SEAL_SEAL");
        read(fd.as_fd()).unwrap();
    }

    fn memfd_with(bytes: &[u8], sealed: bool) -> OwnedFd {
        let flags = nix::sys::memfd::MFdFlags::MFD_CLOEXEC | nix::sys::memfd::MFdFlags::MFD_ALLOW_SEALING;
        let mut file = std::fs::File::from(nix::sys::memfd::memfd_create(c"test", flags).unwrap());
        file.write_all(bytes).unwrap();
        if sealed {
            fcntl(&file, FcntlArg::F_ADD_SEALS(SEALS)).unwrap();
        }
        OwnedFd::from(file)
    }

    #[test]
    fn anything_but_a_sealed_well_formed_image_is_refused() {
        let good = {
            let fd = seal(&compiled()).unwrap();
            let mut bytes = Vec::new();
            std::fs::File::from(fd).read_to_end(&mut bytes).unwrap();
            bytes
        };
        assert!(matches!(read(memfd_with(&good, false).as_fd()), Err(SealedPolicyError::NotSealed)));
        assert!(matches!(read(memfd_with(&good[..good.len() - 1], true).as_fd()), Err(SealedPolicyError::Malformed(_))));
        let mut longer = good.clone();
        longer.push(0);
        assert!(matches!(read(memfd_with(&longer, true).as_fd()), Err(SealedPolicyError::Malformed(_))));
        let mut bad_magic = good.clone();
        bad_magic[0] ^= 1;
        assert!(matches!(read(memfd_with(&bad_magic, true).as_fd()), Err(SealedPolicyError::Malformed(_))));
        let mut huge = MAGIC.to_vec();
        huge.extend_from_slice(&(MAX_INSTRUCTIONS as u32 + 1).to_ne_bytes());
        assert!(matches!(read(memfd_with(&huge, true).as_fd()), Err(SealedPolicyError::Malformed(_))));
        read(memfd_with(&good, true).as_fd()).unwrap();
    }
}

//! Running criu as a family's host root rather than as host root (see
//! `Criu::command_as`).

/// Become `id` (real, effective and saved uid and gid, no supplementary
/// groups) keeping every capability held now, as ambient capabilities so
/// they survive the next execve. Makes system calls only (safe between
/// fork and exec).
pub(crate) fn become_keeping_caps(id: u32) -> std::io::Result<()> {
    // linux/capability.h: version 3 takes two data structs (64 capabilities).
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let fail = || Err(std::io::Error::last_os_error());
    let mut header = Header { version: VERSION_3, pid: 0 };
    let mut data = [Data { effective: 0, permitted: 0, inheritable: 0 }; 2];
    // SAFETY: capget/capset/prctl/set*id with valid pointers to locals.
    unsafe {
        if libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) != 0 {
            return fail();
        }
        if libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0 || libc::setgroups(0, std::ptr::null()) != 0 {
            return fail();
        }
        if libc::setresgid(id, id, id) != 0 || libc::setresuid(id, id, id) != 0 {
            return fail();
        }
        // The uid change cleared the effective set; the permitted one was kept.
        for d in &mut data {
            d.effective = d.permitted;
            d.inheritable = d.permitted;
        }
        if libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) != 0 {
            return fail();
        }
        for cap in 0..64u32 {
            let held = data[(cap / 32) as usize].permitted & (1 << (cap % 32)) != 0;
            if held && libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_RAISE, cap as libc::c_ulong, 0, 0) != 0 {
                return fail();
            }
        }
    }
    Ok(())
}

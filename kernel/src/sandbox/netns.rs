//! The network a sandboxed command gets when it may use one: a network namespace of keel's
//! making whose only way out is keel's proxy.
//!
//! bubblewrap's `--unshare-net` gives a command a namespace with nothing in it, and nothing can
//! be added from outside later: a process outside cannot enter it without privileges. So for a
//! command with a network grant the kernel makes the namespace itself. In the forked child,
//! before bubblewrap starts, [`enter`] creates a user and a network namespace, brings up its
//! loopback interface, opens a listening socket on `127.0.0.1:`[`PROXY_PORT`] inside it, and
//! hands that socket to keel over a Unix socket pair (`SCM_RIGHTS`); bubblewrap then runs with
//! `--share-net`, so the command lives in that namespace. The namespace has no interface but
//! loopback and no route anywhere; keel accepts on the handed-over socket and every connection
//! the command makes to the proxy passes keel's network gate ([`super::proxy`]).
//!
//! The port is fixed: the namespace is new, so nothing else can hold it.

use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};

use nix::libc;

/// Where the proxy listens inside the command's network namespace.
pub(crate) const PROXY_PORT: u16 = 3128;

/// The proxy's address as the command's environment gives it.
pub(crate) fn proxy_url() -> String {
    format!("http://127.0.0.1:{PROXY_PORT}")
}

/// The socket pair the child hands the listener over, and the identity maps it writes.
pub(crate) struct Handoff {
    keel_end: OwnedFd,
    child_end: OwnedFd,
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
}

/// A control-message buffer for one descriptor, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct OneFd([u8; 64]);

impl Handoff {
    /// A socket pair, and maps that keep the command's identity (its own uid and gid only).
    pub(crate) fn new() -> io::Result<Handoff> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: socketpair writes two descriptors into `fds`, which has room for them.
        #[allow(unsafe_code)]
        let rc = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just created and are owned by nothing else.
        #[allow(unsafe_code)]
        let (keel_end, child_end) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let uid = nix::unistd::getuid();
        let gid = nix::unistd::getgid();
        Ok(Handoff {
            keel_end,
            child_end,
            uid_map: format!("{uid} {uid} 1\n").into_bytes(),
            gid_map: format!("{gid} {gid} 1\n").into_bytes(),
        })
    }

    /// What the forked child needs for [`enter`], made before the fork (the child may not
    /// allocate). Its descriptor stays open as long as `self`, which outlives the spawn.
    pub(crate) fn child_side(&self) -> ChildSide {
        ChildSide {
            fd: self.child_end.as_raw_fd(),
            uid_map: self.uid_map.clone(),
            gid_map: self.gid_map.clone(),
        }
    }

    /// The listener the child sent, once the command has started (the child sends it before
    /// bubblewrap runs, so it is waiting by the time the spawn returns).
    pub(crate) fn receive(self) -> io::Result<std::net::TcpListener> {
        drop(self.child_end);
        let mut byte = [0u8; 1];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let mut control = OneFd([0; 64]);
        // SAFETY: msghdr is plain data; every pointer set below points at a live local buffer
        // of the stated length, and recvmsg writes only within them. The descriptor is read
        // from the first control message only if it is an SCM_RIGHTS message of one fd.
        #[allow(unsafe_code)]
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.0.as_mut_ptr().cast();
            msg.msg_controllen = control.0.len() as _;
            let n = libc::recvmsg(
                self.keel_end.as_raw_fd(),
                &mut msg,
                libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
            );
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let header = libc::CMSG_FIRSTHDR(&msg);
            if header.is_null()
                || (*header).cmsg_level != libc::SOL_SOCKET
                || (*header).cmsg_type != libc::SCM_RIGHTS
                || (*header).cmsg_len as usize != libc::CMSG_LEN(4) as usize
            {
                return Err(io::Error::other(
                    "the sandbox's network namespace sent no listening socket",
                ));
            }
            let fd = std::ptr::read_unaligned(libc::CMSG_DATA(header).cast::<RawFd>());
            Ok(std::net::TcpListener::from_raw_fd(fd))
        }
    }
}

/// The child's half of a [`Handoff`], moved into the `pre_exec` closure.
pub(crate) struct ChildSide {
    fd: RawFd,
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
}

/// In the forked child, before bubblewrap starts: a new user and network namespace, loopback
/// up, a listener on `127.0.0.1:PROXY_PORT` sent to keel.
///
/// Runs between fork and exec, so it only makes system calls (no allocation, no locks): the
/// maps were formatted before the fork.
#[allow(unsafe_code)]
pub(crate) fn enter(side: &ChildSide) -> io::Result<()> {
    fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(rc)
        }
    }
    fn write_file(path: &std::ffi::CStr, data: &[u8]) -> io::Result<()> {
        // SAFETY: open/write/close on a NUL-terminated path and a live buffer.
        unsafe {
            let fd = check(libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC))?;
            let written = libc::write(fd, data.as_ptr().cast(), data.len());
            let error = io::Error::last_os_error();
            libc::close(fd);
            if written != data.len() as isize {
                return Err(error);
            }
        }
        Ok(())
    }
    // SAFETY: plain system calls on descriptors this function owns and on buffers that live
    // on its stack; `ifreq`, `sockaddr_in`, `msghdr` are plain data for which zero is valid.
    unsafe {
        check(libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET))?;
        // An unprivileged process may map only its own ids, and only once setgroups is off.
        write_file(c"/proc/self/setgroups", b"deny")?;
        write_file(c"/proc/self/uid_map", &side.uid_map)?;
        write_file(c"/proc/self/gid_map", &side.gid_map)?;

        let probe = check(libc::socket(
            libc::AF_INET,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            0,
        ))?;
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (slot, byte) in ifr.ifr_name.iter_mut().zip(b"lo") {
            *slot = *byte as libc::c_char;
        }
        let up = check(libc::ioctl(probe, libc::SIOCGIFFLAGS as _, &mut ifr)).and_then(|_| {
            ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            check(libc::ioctl(probe, libc::SIOCSIFFLAGS as _, &ifr))
        });
        libc::close(probe);
        up?;

        let listener = check(libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
        ))?;
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        addr.sin_family = libc::AF_INET as libc::sa_family_t;
        addr.sin_port = PROXY_PORT.to_be();
        addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        let listening = check(libc::bind(
            listener,
            (&raw const addr).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        ))
        .and_then(|_| check(libc::listen(listener, 128)));
        if let Err(e) = listening {
            libc::close(listener);
            return Err(e);
        }

        let mut byte = [0u8; 1];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let mut control = OneFd([0; 64]);
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(4) as _;
        let header = libc::CMSG_FIRSTHDR(&msg);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(4) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<RawFd>(), listener);
        let sent = check(libc::sendmsg(side.fd, &msg, 0) as libc::c_int);
        // keel holds it now; the command must not (it would be inherited otherwise, though
        // close-on-exec already drops it).
        libc::close(listener);
        sent?;
    }
    Ok(())
}

/// Whether keel can make a command's network namespace here: a child enters one, hands the
/// listener over and exits. Checked once per process.
pub(crate) fn probe() -> Result<(), String> {
    static PROBED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    PROBED
        .get_or_init(|| {
            use std::os::unix::process::CommandExt as _;
            let handoff = Handoff::new().map_err(|e| e.to_string())?;
            let side = handoff.child_side();
            let mut command = std::process::Command::new("true");
            // SAFETY: `enter` only makes system calls (see there).
            #[allow(unsafe_code)]
            unsafe {
                command.pre_exec(move || enter(&side));
            }
            let status = command
                .stdin(std::process::Stdio::null())
                .status()
                .map_err(|e| format!("cannot make a network namespace for commands: {e}"))?;
            if !status.success() {
                return Err("the network namespace probe failed".to_owned());
            }
            handoff.receive().map(drop).map_err(|e| e.to_string())
        })
        .clone()
}

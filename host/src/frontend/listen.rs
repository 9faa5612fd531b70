//! Where the frontends listen and how they accept: a TCP address
//! (`--http-address=0.0.0.0`) or a Unix-domain socket
//! (`--http-address=unix:/run/tern/http.sock`, the port then unused), the
//! socket file's mode and owner, and the accept loop that survives running
//! out of descriptors. Every frontend (HTTP, gRPC, metrics) binds here.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use tern_core::error::{Error, Result};

/// The prefix that makes an address a Unix-domain socket path.
pub const UNIX_PREFIX: &str = "unix:";

/// The socket file's permissions and owner (`--unix-socket-mode`,
/// `--unix-socket-owner`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnixSocketSettings {
    /// Permission bits given to the socket file (connecting needs write).
    pub mode: u32,
    /// User id the file is given, if any.
    pub uid: Option<u32>,
    /// Group id the file is given, if any.
    pub gid: Option<u32>,
}

impl Default for UnixSocketSettings {
    fn default() -> Self {
        UnixSocketSettings {
            mode: 0o660,
            uid: None,
            gid: None,
        }
    }
}

impl UnixSocketSettings {
    /// Parses `--unix-socket-mode` (octal, e.g. `0660`) and
    /// `--unix-socket-owner` (`user`, `user:group` or `:group`, names or
    /// numeric ids).
    pub fn parse(mode: &str, owner: Option<&str>) -> Result<UnixSocketSettings> {
        let digits = mode.strip_prefix("0o").unwrap_or(mode);
        let mode = u32::from_str_radix(digits, 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .ok_or_else(|| {
                Error::invalid_arg(format!(
                    "--unix-socket-mode: '{mode}' is not an octal permission mode (e.g. 0660)"
                ))
            })?;
        let (uid, gid) = match owner.map(str::trim).filter(|o| !o.is_empty()) {
            None => (None, None),
            Some(owner) => {
                let (user, group) = match owner.split_once(':') {
                    Some((u, g)) => (u, Some(g)),
                    None => (owner, None),
                };
                let uid = (!user.is_empty())
                    .then(|| lookup_id(user, IdKind::User))
                    .transpose()?;
                let gid = group
                    .filter(|g| !g.is_empty())
                    .map(|g| lookup_id(g, IdKind::Group))
                    .transpose()?;
                (uid, gid)
            }
        };
        Ok(UnixSocketSettings { mode, uid, gid })
    }
}

#[derive(Clone, Copy)]
enum IdKind {
    User,
    Group,
}

/// A user or group name (or a number) as an id, through the system's
/// account databases (`getpwnam_r`/`getgrnam_r`).
fn lookup_id(name: &str, kind: IdKind) -> Result<u32> {
    if let Ok(id) = name.parse::<u32>() {
        return Ok(id);
    }
    let what = match kind {
        IdKind::User => "user",
        IdKind::Group => "group",
    };
    let unknown = || Error::invalid_arg(format!("--unix-socket-owner: unknown {what} '{name}'"));
    let cname = std::ffi::CString::new(name).map_err(|_| unknown())?;
    let mut size = 16 * 1024;
    loop {
        let mut buf = vec![0 as libc::c_char; size];
        // SAFETY: the out-parameters point to live, writable memory of the sizes
        // passed; the result pointer is only read when the call succeeded.
        let (rc, id) = unsafe {
            match kind {
                IdKind::User => {
                    let mut pw: libc::passwd = std::mem::zeroed();
                    let mut out: *mut libc::passwd = std::ptr::null_mut();
                    let rc = libc::getpwnam_r(
                        cname.as_ptr(),
                        &mut pw,
                        buf.as_mut_ptr(),
                        buf.len(),
                        &mut out,
                    );
                    (rc, (!out.is_null()).then_some(pw.pw_uid))
                }
                IdKind::Group => {
                    let mut gr: libc::group = std::mem::zeroed();
                    let mut out: *mut libc::group = std::ptr::null_mut();
                    let rc = libc::getgrnam_r(
                        cname.as_ptr(),
                        &mut gr,
                        buf.as_mut_ptr(),
                        buf.len(),
                        &mut out,
                    );
                    (rc, (!out.is_null()).then_some(gr.gr_gid))
                }
            }
        };
        match (rc, id) {
            (0, Some(id)) => return Ok(id),
            (0, None) => break,
            // A large group (LDAP, sssd): a bigger buffer.
            (libc::ERANGE, _) if size < (1 << 24) => size *= 4,
            (rc, _) => {
                return Err(Error::invalid_arg(format!(
                    "--unix-socket-owner: looking up {what} '{name}' failed: {}",
                    io::Error::from_raw_os_error(rc)
                )))
            }
        }
    }
    Err(unknown())
}

/// What a frontend is bound to, as logged (`0.0.0.0:8000`,
/// `unix:/run/tern/http.sock`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bound {
    /// A TCP address (with the port picked when 0 was asked for).
    Tcp(SocketAddr),
    /// A Unix-domain socket file.
    Unix(PathBuf),
}

impl Bound {
    /// The TCP address, if this is one.
    pub fn tcp(&self) -> Option<SocketAddr> {
        match self {
            Bound::Tcp(a) => Some(*a),
            Bound::Unix(_) => None,
        }
    }
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bound::Tcp(a) => write!(f, "{a}"),
            Bound::Unix(p) => write!(f, "{UNIX_PREFIX}{}", p.display()),
        }
    }
}

/// A bound listener. A Unix socket's file is removed when it is dropped
/// (if it is still this listener's: a file another server has since bound
/// at the same path is left alone).
pub enum Listener {
    /// TCP.
    Tcp(TcpListener),
    /// A Unix-domain socket, its file, and the file's device and inode.
    Unix(UnixListener, PathBuf, (u64, u64)),
}

impl Drop for Listener {
    fn drop(&mut self) {
        use std::os::unix::fs::MetadataExt;
        if let Listener::Unix(_, path, id) = self {
            let ours = std::fs::symlink_metadata(&*path).is_ok_and(|m| (m.dev(), m.ino()) == *id);
            if ours {
                if let Err(e) = std::fs::remove_file(&*path) {
                    tracing::debug!("removing socket file {}: {e}", path.display());
                }
            }
        }
    }
}

impl Listener {
    async fn accept(&self) -> io::Result<Stream> {
        match self {
            Listener::Tcp(l) => {
                let (s, _) = l.accept().await?;
                // Small request/response messages: no Nagle delay.
                let _ = s.set_nodelay(true);
                Ok(Stream::Tcp(s))
            }
            Listener::Unix(l, _, _) => Ok(Stream::Unix(l.accept().await?.0)),
        }
    }
}

/// One accepted connection's byte stream.
pub enum Stream {
    /// Over TCP.
    Tcp(TcpStream),
    /// Over a Unix-domain socket.
    Unix(UnixStream),
}

impl Stream {
    /// The peer's TCP address (none over a Unix socket).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        match self {
            Stream::Tcp(s) => s.peer_addr().ok(),
            Stream::Unix(_) => None,
        }
    }

    /// The local and peer TCP addresses, as tonic reports them.
    pub fn tcp_info(&self) -> tonic::transport::server::TcpConnectInfo {
        match self {
            Stream::Tcp(s) => tonic::transport::server::TcpConnectInfo {
                local_addr: s.local_addr().ok(),
                remote_addr: s.peer_addr().ok(),
            },
            Stream::Unix(_) => tonic::transport::server::TcpConnectInfo {
                local_addr: None,
                remote_addr: None,
            },
        }
    }

    /// Reads what has arrived without consuming it.
    pub async fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.peek(buf).await,
            Stream::Unix(s) => {
                use std::os::fd::AsRawFd;
                loop {
                    s.readable().await?;
                    let fd = s.as_raw_fd();
                    let got = s.try_io(tokio::io::Interest::READABLE, || {
                        // SAFETY: `buf` is valid for `buf.len()` writable bytes and
                        // `fd` is this stream's open socket.
                        let n = unsafe {
                            libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_PEEK)
                        };
                        if n < 0 {
                            Err(io::Error::last_os_error())
                        } else {
                            Ok(n as usize)
                        }
                    });
                    match got {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                        other => return other,
                    }
                }
            }
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Tcp(s) => s.is_write_vectored(),
            Stream::Unix(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Binds every address of a frontend's address flag: one address, or several
/// separated by commas (`127.0.0.1,unix:/run/tern/http.sock` serves loopback
/// TCP and a Unix socket alike). A failure closes what was already bound.
pub async fn bind_all(
    what: &str,
    addresses: &str,
    port: u16,
    unix: &UnixSocketSettings,
) -> Result<Vec<(Listener, Bound)>> {
    let mut bound = Vec::new();
    for address in addresses.split(',').map(str::trim) {
        bound.push(bind(what, address, port, unix).await?);
    }
    Ok(bound)
}

/// Binds a frontend's listener: `address:port` over TCP, or the socket file
/// of a `unix:<path>` address. Failures read as tritonserver's
/// (`failed to start GRPC service: Unavailable - Socket '0.0.0.0:8001' already
/// in use`), since operators grep for them.
pub async fn bind(
    what: &str,
    address: &str,
    port: u16,
    unix: &UnixSocketSettings,
) -> Result<(Listener, Bound)> {
    let failed = |addr: &str, why: String| {
        Error::unavailable(format!(
            "failed to start {what} service: {} - Socket '{addr}' {why}",
            tern_core::error::Code::Unavailable.as_str()
        ))
    };
    if let Some(path) = address.strip_prefix(UNIX_PREFIX) {
        let path = PathBuf::from(path);
        if path.as_os_str().is_empty() {
            return Err(failed(
                address,
                "cannot be bound: the socket path is empty".into(),
            ));
        }
        clear_stale(&path)
            .await
            .map_err(|why| failed(address, why))?;
        let (listener, id) = bind_unix(&path, unix).map_err(|why| failed(address, why))?;
        let listener = Listener::Unix(listener, path.clone(), id);
        return Ok((listener, Bound::Unix(path)));
    }
    let addr = format!("{address}:{port}");
    let listener = TcpListener::bind(&addr).await.map_err(|e| {
        if e.kind() == io::ErrorKind::AddrInUse {
            failed(&addr, "already in use".into())
        } else {
            failed(&addr, format!("cannot be bound: {e}"))
        }
    })?;
    let local = listener
        .local_addr()
        .map_err(|e| failed(&addr, format!("has no local address: {e}")))?;
    Ok((Listener::Tcp(listener), Bound::Tcp(local)))
}

/// A socket file left by a server that is gone is removed; one a live
/// server answers on is "already in use", as a busy TCP port is; any other
/// kind of file is never touched.
async fn clear_stale(path: &Path) -> std::result::Result<(), String> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("cannot be bound: {e}")),
    };
    if !meta.file_type().is_socket() {
        return Err("cannot be bound: the path exists and is not a socket".into());
    }
    // Non-blocking, and bounded: a live server with a full accept queue
    // answers EAGAIN (or nothing) instead of holding the start.
    let probe = tokio::time::timeout(Duration::from_secs(2), UnixStream::connect(path)).await;
    match probe {
        Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionRefused => {
            tracing::info!("removing stale socket file {}", path.display());
            std::fs::remove_file(path).map_err(|e| format!("cannot be bound: {e}"))
        }
        Ok(Ok(_)) | Err(_) => Err("already in use".into()),
        Ok(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => Err("already in use".into()),
        Ok(Err(e)) => Err(format!("cannot be bound: {e}")),
    }
}

/// Binds the socket in a private (0700) folder beside `path`, gives it its
/// owner and mode, then renames it into place: no client can connect before
/// the socket has the permissions asked for, whatever the umask.
fn bind_unix(
    path: &Path,
    unix: &UnixSocketSettings,
) -> std::result::Result<(UnixListener, (u64, u64)), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| "cannot be bound: the socket path has no file name".to_string())?;
    let private = parent.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&private);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .map_err(|e| format!("cannot be bound: {e}"))?;
    let staged = private.join("s");
    let bound = UnixListener::bind(&staged)
        .map_err(|e| format!("cannot be bound: {e}"))
        .and_then(|l| set_owner_and_mode(&staged, unix).map(|()| l))
        .and_then(|l| {
            std::fs::rename(&staged, path)
                .map(|()| l)
                .map_err(|e| format!("cannot be bound: {e}"))
        });
    let _ = std::fs::remove_dir_all(&private);
    let listener = bound?;
    let meta = std::fs::symlink_metadata(path).map_err(|e| format!("cannot be bound: {e}"))?;
    Ok((listener, (meta.dev(), meta.ino())))
}

fn set_owner_and_mode(path: &Path, unix: &UnixSocketSettings) -> std::result::Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    if unix.uid.is_some() || unix.gid.is_some() {
        std::os::unix::fs::chown(path, unix.uid, unix.gid)
            .map_err(|e| format!("cannot be given its owner (--unix-socket-owner): {e}"))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(unix.mode))
        .map_err(|e| format!("cannot be given its mode (--unix-socket-mode): {e}"))
}

/// A listener's accept loop state: accept errors (out of file descriptors
/// and the like) are retried with a pause that doubles from 50 ms to 1 s
/// instead of spinning or stopping the listener, and logged once, then at
/// most once per [`ACCEPT_LOG_EVERY`] with how many there were, and once
/// more when accepting works again. Kept across calls, because the caller's
/// `select!` may drop an `accept` future at any time.
pub struct Acceptor {
    what: &'static str,
    failures: u64,
    unlogged: u64,
    logged_at: Option<Instant>,
    recovered_at: Option<Instant>,
    pause: Duration,
}

impl Acceptor {
    /// The accept loop of the listener called `what` in log lines.
    pub fn new(what: &'static str) -> Acceptor {
        Acceptor {
            what,
            failures: 0,
            unlogged: 0,
            logged_at: None,
            recovered_at: None,
            pause: Duration::from_millis(50),
        }
    }

    /// The next connection on `listener`.
    pub async fn accept(&mut self, listener: &Listener) -> Stream {
        let what = self.what;
        loop {
            match listener.accept().await {
                Ok(stream) => {
                    // At the limit, accepting flaps as descriptors free up: the
                    // reports stay at one per interval either way.
                    if self.failures > 0
                        && self
                            .recovered_at
                            .is_none_or(|t| t.elapsed() >= ACCEPT_LOG_EVERY)
                    {
                        tracing::warn!(
                            "{what}: accepting connections again after {} failed accept(s)",
                            self.failures
                        );
                        self.failures = 0;
                        self.recovered_at = Some(Instant::now());
                    }
                    self.pause = Duration::from_millis(50);
                    return stream;
                }
                Err(e) => {
                    self.failures += 1;
                    self.unlogged += 1;
                    if self
                        .logged_at
                        .is_none_or(|t| t.elapsed() >= ACCEPT_LOG_EVERY)
                    {
                        let also = if self.unlogged > 1 {
                            format!(" ({} failures since the last report)", self.unlogged)
                        } else {
                            String::new()
                        };
                        tracing::warn!("{what}: accept failed: {e}{also}; retrying (raise the open-file limit, LimitNOFILE, if this is EMFILE)");
                        self.logged_at = Some(Instant::now());
                        self.unlogged = 0;
                    }
                    let pause = self.pause;
                    self.pause = (pause * 2).min(Duration::from_secs(1));
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }
}

/// How often a listener that keeps failing to accept logs it.
pub const ACCEPT_LOG_EVERY: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn settings_parse_modes_and_owners() {
        let s = UnixSocketSettings::parse("0660", None).unwrap();
        assert_eq!(s, UnixSocketSettings::default());
        assert_eq!(UnixSocketSettings::parse("600", None).unwrap().mode, 0o600);
        assert_eq!(
            UnixSocketSettings::parse("0o777", None).unwrap().mode,
            0o777
        );
        for bad in ["", "0999", "rw", "1777"] {
            let e = UnixSocketSettings::parse(bad, None).unwrap_err();
            assert!(e.to_string().contains("--unix-socket-mode"), "{e}");
        }
        let s = UnixSocketSettings::parse("0660", Some("root:0")).unwrap();
        assert_eq!((s.uid, s.gid), (Some(0), Some(0)));
        let s = UnixSocketSettings::parse("0660", Some(":12")).unwrap();
        assert_eq!((s.uid, s.gid), (None, Some(12)));
        let s = UnixSocketSettings::parse("0660", Some("1000")).unwrap();
        assert_eq!((s.uid, s.gid), (Some(1000), None));
        let e = UnixSocketSettings::parse("0660", Some("no-such-user-tern")).unwrap_err();
        assert!(
            e.to_string()
                .contains("--unix-socket-owner: unknown user 'no-such-user-tern'"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn unix_socket_binds_serves_and_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.sock");
        let address = format!("unix:{}", path.display());
        let settings = UnixSocketSettings::parse("0600", None).unwrap();
        let (listener, bound) = bind("HTTP", &address, 0, &settings).await.unwrap();
        assert_eq!(bound.to_string(), address);
        assert_eq!(bound.tcp(), None);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);

        let client = tokio::spawn({
            let path = path.clone();
            async move {
                let mut c = UnixStream::connect(&path).await.unwrap();
                c.write_all(b"ping").await.unwrap();
                let mut back = [0u8; 4];
                c.read_exact(&mut back).await.unwrap();
                back
            }
        });
        let mut acceptor = Acceptor::new("test");
        let mut conn = acceptor.accept(&listener).await;
        assert!(conn.peer_addr().is_none());
        let mut peeked = [0u8; 4];
        let mut n = 0;
        while n < 4 {
            n = conn.peek(&mut peeked).await.unwrap();
            assert!(n > 0, "the client's bytes, not EOF");
        }
        assert_eq!(&peeked, b"ping", "peek leaves the bytes in place");
        let mut got = [0u8; 4];
        conn.read_exact(&mut got).await.unwrap();
        conn.write_all(&got).await.unwrap();
        assert_eq!(&client.await.unwrap(), b"ping");
        // A second server on the same live socket is refused, as a busy port is
        // (its probe is a connection that closes at once).
        let e = bind("HTTP", &address, 0, &settings)
            .await
            .err()
            .expect("in use");
        assert!(
            e.to_string()
                .ends_with(&format!("Socket '{address}' already in use")),
            "{e}"
        );

        drop(listener);
        assert!(!path.exists(), "the socket file goes with the listener");
    }

    #[tokio::test]
    async fn several_addresses_bind_together_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.sock");
        let settings = UnixSocketSettings::default();
        let list = format!("127.0.0.1, unix:{}", path.display());
        let bound = bind_all("HTTP", &list, 0, &settings).await.unwrap();
        assert!(bound[0].1.tcp().is_some());
        assert_eq!(bound[1].1, Bound::Unix(path.clone()));
        drop(bound);
        assert!(!path.exists());
        // The second address fails: the first one's socket is closed again.
        let list = format!("unix:{},unix:/no/such/dir/x.sock", path.display());
        assert!(bind_all("HTTP", &list, 0, &settings).await.is_err());
        assert!(!path.exists());
    }

    #[tokio::test]
    async fn a_socket_another_server_now_owns_is_not_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.sock");
        let address = format!("unix:{}", path.display());
        let (ours, _) = bind("HTTP", &address, 0, &UnixSocketSettings::default())
            .await
            .unwrap();
        // Another server took the path over (ours was unlinked under us).
        std::fs::remove_file(&path).unwrap();
        let theirs = std::os::unix::net::UnixListener::bind(&path).unwrap();
        drop(ours);
        assert!(path.exists(), "the other server's socket stays");
        drop(theirs);
        // No private staging folder is left beside the socket.
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[tokio::test]
    async fn stale_sockets_are_replaced_and_other_files_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stale.sock");
        // A socket file nobody listens on, as a killed server leaves it.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let address = format!("unix:{}", path.display());
        let settings = UnixSocketSettings::default();
        let (listener, _) = bind("GRPC", &address, 0, &settings).await.unwrap();
        drop(listener);

        let file = dir.path().join("plain");
        std::fs::write(&file, b"keep").unwrap();
        let e = bind("GRPC", &format!("unix:{}", file.display()), 0, &settings)
            .await
            .err()
            .expect("not a socket");
        assert!(e.to_string().contains("is not a socket"), "{e}");
        assert_eq!(std::fs::read(&file).unwrap(), b"keep");

        let e = bind("GRPC", "unix:/no/such/dir/x.sock", 0, &settings)
            .await
            .err()
            .expect("no folder");
        assert!(
            e.to_string().contains("failed to start GRPC service"),
            "{e}"
        );
    }
}

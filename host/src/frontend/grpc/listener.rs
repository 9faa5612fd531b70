//! Accepting gRPC connections: TCP (no Nagle) or a Unix-domain socket
//! ([`crate::frontend::listen`]), optional TLS/mutual TLS with
//! rustls, and the PING rules of [`super::pings`] on the plaintext side of
//! every connection. TLS is done here rather than by tonic so that the PING
//! rules see HTTP/2 frames, not ciphertext.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::authority::{fix_authority, Rewritten};
use super::pings::{PingGuard, PingPolicy};
use super::TlsSettings;
use crate::frontend::listen::{Acceptor, Listener, Stream};
use tern_core::error::{Error, Result};

/// How long a client gets to finish the TLS handshake, or on plaintext to
/// send the HTTP/2 preface: a connection that stays silent is closed instead
/// of holding a socket forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Waits until the 24-byte HTTP/2 client preface has arrived (without
/// consuming it: tonic reads it next).
async fn preface(tcp: &Stream) -> io::Result<()> {
    let mut buf = [0u8; 24];
    loop {
        match tcp.peek(&mut buf).await? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n if n >= buf.len() => return Ok(()),
            // Part of it: peek would answer at once again, so poll gently.
            _ => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

/// A connection's byte stream, plain or TLS.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// The TCP addresses of the connection (none over a Unix socket).
    fn tcp_info(&self) -> TcpConnectInfo;
}

impl Io for Stream {
    fn tcp_info(&self) -> TcpConnectInfo {
        Stream::tcp_info(self)
    }
}

impl Io for tokio_rustls::server::TlsStream<Stream> {
    fn tcp_info(&self) -> TcpConnectInfo {
        self.get_ref().0.tcp_info()
    }
}

impl<S: Io> Io for Rewritten<S> {
    fn tcp_info(&self) -> TcpConnectInfo {
        TcpConnectInfo {
            local_addr: None,
            remote_addr: None,
        }
    }
}

/// The connection as tonic gets it: on a Unix socket, with the clients'
/// socket-path `:authority` made valid ([`super::authority`]).
fn boxed<S: Io>(io: S, unix: bool) -> Box<dyn Io> {
    if unix {
        Box::new(fix_authority(io))
    } else {
        Box::new(io)
    }
}

/// One accepted gRPC connection as tonic sees it.
pub type Conn = PingGuard<Box<dyn Io>>;

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.get_ref().tcp_info()
    }
}

/// Builds the rustls acceptor (ALPN h2; client certificates required and
/// verified against `client_ca` for mutual TLS). Bad PEM is an error naming
/// the flag.
pub fn tls_acceptor(tls: &TlsSettings) -> Result<TlsAcceptor> {
    let bad = |flag: &str, e: &dyn std::fmt::Display| {
        Error::invalid_arg(format!("gRPC TLS configuration: {flag}: {e}"))
    };
    let certs = CertificateDer::pem_slice_iter(&tls.cert)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad("--grpc-server-cert", &e))?;
    if certs.is_empty() {
        return Err(bad("--grpc-server-cert", &"no PEM certificate found"));
    }
    let key = PrivateKeyDer::from_pem_slice(&tls.key).map_err(|e| bad("--grpc-server-key", &e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("protocol versions", &e))?;
    let builder = match &tls.client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca) {
                let cert = cert.map_err(|e| bad("--grpc-root-cert", &e))?;
                roots.add(cert).map_err(|e| bad("--grpc-root-cert", &e))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| bad("--grpc-root-cert", &e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| bad("--grpc-server-cert/--grpc-server-key", &e))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Accepts connections on every listener until the returned stream is
/// dropped. TLS handshakes run concurrently, so a slow client delays nobody
/// else.
pub fn accept(
    listeners: Vec<Listener>,
    tls: Option<TlsAcceptor>,
    policy: PingPolicy,
) -> ReceiverStream<io::Result<Conn>> {
    let (tx, rx) = mpsc::channel(64);
    for listener in listeners {
        accept_on(listener, tls.clone(), policy, tx.clone());
    }
    ReceiverStream::new(rx)
}

fn accept_on(
    listener: Listener,
    tls: Option<TlsAcceptor>,
    policy: PingPolicy,
    tx: mpsc::Sender<io::Result<Conn>>,
) {
    tokio::spawn(async move {
        let mut acceptor = Acceptor::new("gRPC");
        loop {
            let tcp = tokio::select! {
                _ = tx.closed() => return,
                tcp = acceptor.accept(&listener) => tcp,
            };
            match &tls {
                None => {
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        let peer = tcp.peer_addr();
                        let unix = matches!(tcp, Stream::Unix(_));
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, preface(&tcp)).await {
                            Ok(Ok(())) => {
                                let conn: Conn = PingGuard::new(boxed(tcp, unix), policy);
                                let _ = tx.send(Ok(conn)).await;
                            }
                            Ok(Err(e)) => tracing::debug!("gRPC connection from {peer:?}: {e}"),
                            Err(_) => tracing::debug!(
                                "gRPC connection from {peer:?} sent no HTTP/2 preface in time"
                            ),
                        }
                    });
                }
                Some(acceptor) => {
                    let (acceptor, tx) = (acceptor.clone(), tx.clone());
                    tokio::spawn(async move {
                        let peer = tcp.peer_addr();
                        let unix = matches!(tcp, Stream::Unix(_));
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                            Ok(Ok(stream)) => {
                                let conn: Conn = PingGuard::new(boxed(stream, unix), policy);
                                let _ = tx.send(Ok(conn)).await;
                            }
                            Ok(Err(e)) => {
                                tracing::debug!("gRPC TLS handshake with {peer:?} failed: {e}")
                            }
                            Err(_) => tracing::debug!("gRPC TLS handshake with {peer:?} timed out"),
                        }
                    });
                }
            }
        }
    });
}

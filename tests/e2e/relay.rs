//! A TCP relay: connections accepted on one address are forwarded, byte for byte, to another.
//! It joins two network namespaces without touching the processes at either end: etcd listens
//! on loopback only, and the second API server's certificate names loopback only, so each is
//! reached through a relay listening where the other side can connect.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};

/// A running relay; dropping it closes the listener and every relayed connection.
pub struct Relay {
    stop: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    acceptor: Option<JoinHandle<()>>,
}

impl Relay {
    /// Listens on `listen` and forwards each connection to `target`.
    pub fn start(listen: SocketAddr, target: SocketAddr) -> Result<Relay> {
        let listener = TcpListener::bind(listen)
            .with_context(|| format!("relay: cannot listen on {listen}"))?;
        // Polled, so that a stop is seen without a connection to wake the accept.
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(Mutex::new(Vec::new()));
        let (stopping, conns) = (stop.clone(), open.clone());
        let acceptor = std::thread::Builder::new()
            .name(format!("relay {listen}"))
            .spawn(move || {
                while !stopping.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((client, _)) => {
                            let _ = forward(client, target, &conns);
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            })?;
        Ok(Relay {
            stop,
            open,
            acceptor: Some(acceptor),
        })
    }
}

/// Connects to `target` and copies both ways on two threads; the sockets are kept in `open` so
/// that a stop can close them.
fn forward(client: TcpStream, target: SocketAddr, open: &Mutex<Vec<TcpStream>>) -> Result<()> {
    client.set_nonblocking(false)?;
    let server = match TcpStream::connect_timeout(&target, Duration::from_secs(5)) {
        Ok(server) => server,
        Err(e) => {
            let _ = client.shutdown(Shutdown::Both);
            return Err(e.into());
        }
    };
    for stream in [&client, &server] {
        stream.set_nodelay(true)?;
    }
    if let Ok(mut open) = open.lock() {
        // Closed ones are dropped now and then: a relay lives for one scenario.
        open.retain(|s| s.peer_addr().is_ok());
        open.push(client.try_clone()?);
        open.push(server.try_clone()?);
    }
    let (client_in, server_out) = (client.try_clone()?, server.try_clone()?);
    std::thread::spawn(move || copy(client_in, server_out));
    std::thread::spawn(move || copy(server, client));
    Ok(())
}

/// Copies until either side ends, then ends both directions.
fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        if let Ok(open) = self.open.lock() {
            for stream in open.iter() {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
    }
}

//! A fake `yard` node for the client tests: a Unix socket listener that decodes every
//! connection with the real [`Decoder`] and [`Session`] and hands the results to the test.

#![allow(dead_code)] // each test binary uses a different part

use std::io::Read;
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use yard_diagnosis::event::Event;
use yard_diagnosis::wire::{Decoder, Message, Session, WireError};

/// What the fake node saw, in order.
#[derive(Debug)]
pub enum Seen {
    /// A client connected (connections are numbered from 0).
    Connected(usize),
    /// A decoded message on a connection, with the event the session made of it.
    Msg(usize, Message, Event),
    /// The connection broke the protocol (the test fails on this).
    Error(usize, WireError),
}

pub struct FakeNode {
    pub path: PathBuf,
    rx: Receiver<Seen>,
    conns: Arc<Mutex<Vec<UnixStream>>>,
    /// Everything received so far.
    pub seen: Vec<Seen>,
}

impl FakeNode {
    /// Listens at `path` (replacing a stale socket file) on a background thread.
    pub fn start(path: &Path) -> FakeNode {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).expect("bind the fake node socket");
        let (tx, rx) = channel();
        let conns = Arc::new(Mutex::new(Vec::new()));
        let keep = Arc::clone(&conns);
        std::thread::spawn(move || {
            for (id, stream) in listener.incoming().enumerate() {
                let Ok(mut stream) = stream else { return };
                if let Ok(clone) = stream.try_clone() {
                    keep.lock().expect("conns lock").push(clone);
                }
                if tx.send(Seen::Connected(id)).is_err() {
                    return;
                }
                let tx = tx.clone();
                std::thread::spawn(move || {
                    let mut dec = Decoder::new();
                    let mut session = Session::new("node1", "198.18.0.1");
                    let mut buf = [0u8; 8192];
                    loop {
                        let n = match stream.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        dec.feed(&buf[..n]);
                        loop {
                            let seen = match dec.next_message() {
                                Ok(None) => break,
                                Ok(Some(m)) => match session.accept(m.clone()) {
                                    Ok(Some(ev)) => Seen::Msg(id, m, ev),
                                    Ok(None) => continue,
                                    Err(e) => Seen::Error(id, e),
                                },
                                Err(e) => Seen::Error(id, e),
                            };
                            let failed = matches!(seen, Seen::Error(..));
                            if tx.send(seen).is_err() || failed {
                                return;
                            }
                        }
                    }
                });
            }
        });
        FakeNode {
            path: path.to_owned(),
            rx,
            conns,
            seen: Vec::new(),
        }
    }

    /// Dies like a crashed node: every connection is cut and the socket file disappears (the
    /// listener thread lingers unreachable until the test ends).
    pub fn kill(self) {
        let _ = std::fs::remove_file(&self.path);
        for c in self.conns.lock().expect("conns lock").iter() {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    /// Collects until `done` holds for everything seen, or panics after `timeout`.
    pub fn wait_until(&mut self, timeout: Duration, done: impl Fn(&[Seen]) -> bool) {
        let deadline = Instant::now() + timeout;
        while !done(&self.seen) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(s) => {
                    if let Seen::Error(id, e) = &s {
                        panic!("connection {id} broke the protocol: {e}");
                    }
                    self.seen.push(s);
                }
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {
                    panic!("timed out; the fake node saw {:#?}", self.seen)
                }
            }
        }
    }

    /// The messages seen so far, without connection ids.
    pub fn messages(&self) -> Vec<&Message> {
        self.seen
            .iter()
            .filter_map(|s| match s {
                Seen::Msg(_, m, _) => Some(m),
                _ => None,
            })
            .collect()
    }

    /// The events seen so far, heartbeats left out.
    pub fn events(&self) -> Vec<&Event> {
        self.seen
            .iter()
            .filter_map(|s| match s {
                Seen::Msg(_, _, Event::Heartbeat { .. }) => None,
                Seen::Msg(_, _, e) => Some(e),
                _ => None,
            })
            .collect()
    }
}

/// Counts messages matching `pred`.
pub fn count(seen: &[Seen], pred: impl Fn(&Message) -> bool) -> usize {
    seen.iter()
        .filter(|s| matches!(s, Seen::Msg(_, m, _) if pred(m)))
        .count()
}

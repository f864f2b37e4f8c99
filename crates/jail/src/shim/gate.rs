//! Network gates: a member whose gate is closed has its network `socket`
//! calls wait in the shim until the server has started its way out
//! (docs/network.md#the-way-out-starts-on-first-use). The first waiting call
//! of a closed gate is told to the server (`ShimEvent::NetworkWanted`);
//! `OpenNetwork` lets every waiting call through and every later one at once.
//!
//! A member is known here by the inode of its mount namespace, as the
//! notify view names callers (`notify::Caller::member`).

use std::collections::HashMap;

use crate::notify::{Listener, Verdict};

/// The closed gates, by member.
#[derive(Default)]
pub struct NetworkGates {
    closed: HashMap<u64, Closed>,
}

struct Closed {
    name: String,
    /// Calls waiting for the gate to open: the listener each came on (a
    /// second handle, as listeners are retired when their filter is unused)
    /// and its notification.
    waiting: Vec<(Listener, u64)>,
    /// The server was told (`NetworkWanted`) since the gate closed.
    told: bool,
}

/// What the shim does about a network `socket` call.
#[derive(Debug, PartialEq, Eq)]
pub enum OnSocket {
    /// Answered: it went through (its member's gate is open).
    Through,
    /// Waiting; the server is to be told that `member` wants its network.
    Tell(String),
    /// Waiting; the server was told already.
    Wait,
}

impl NetworkGates {
    /// Close `member`'s gate (`mnt` its mount namespace's inode). A gate
    /// that is closed stays so, with its waiting calls.
    pub fn close(&mut self, mnt: u64, member: &str) {
        self.closed.entry(mnt).or_insert_with(|| Closed { name: member.to_string(), waiting: Vec::new(), told: false });
    }

    /// Whether no gate is closed (every network socket goes through).
    pub fn all_open(&self) -> bool {
        self.closed.is_empty()
    }

    /// A network `socket` call (notification `id` on `listener`) of a
    /// process whose mount namespace is `mnt`: through at once when its
    /// member's gate is open (or it is in no member), else it waits.
    pub fn on_socket(&mut self, mnt: u64, listener: &Listener, id: u64) -> OnSocket {
        let Some(gate) = self.closed.get_mut(&mnt) else {
            let _ = listener.respond(id, Verdict::Continue);
            return OnSocket::Through;
        };
        match listener.try_clone() {
            Ok(handle) => gate.waiting.push((handle, id)),
            // Out of descriptors: through without its way out rather than
            // waiting for an answer that could never reach it.
            Err(_) => {
                let _ = listener.respond(id, Verdict::Continue);
                return OnSocket::Through;
            }
        }
        if std::mem::replace(&mut gate.told, true) {
            OnSocket::Wait
        } else {
            OnSocket::Tell(gate.name.clone())
        }
    }

    /// Open `mnt`'s gate: its waiting calls go through.
    pub fn open(&mut self, mnt: u64) {
        if let Some(gate) = self.closed.remove(&mnt) {
            release(gate);
        }
    }

    /// Open every gate (the server is gone: nobody would open them).
    pub fn open_all(&mut self) {
        for (_, gate) in self.closed.drain() {
            release(gate);
        }
    }

    /// The member is destroyed: its waiting callers die with it.
    pub fn forget(&mut self, mnt: u64) {
        self.closed.remove(&mnt);
    }
}

fn release(gate: Closed) {
    for (listener, id) in gate.waiting {
        // A caller killed meanwhile is no error (`respond` ignores ENOENT).
        let _ = listener.respond(id, Verdict::Continue);
    }
}

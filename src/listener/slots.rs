//! Connection slots: at most `total` connections at once, and at most `per_peer` from one
//! peer, so one client cannot hold every slot (a slow or hostile one, or a scraper gone
//! wrong). A slot is a [`Slot`] guard: dropping it frees it.
//!
//! A peer is what one party can use at will: an IPv4 address, but every loopback address
//! (all of 127/8 and `::1`, which any local user can bind) is one peer, and an IPv6 address
//! counts by its /64 (what one host is handed).
//!
//! A connection whose request has not yet been answered is pending: it has proven nothing,
//! and may be a client that sends its request slowly to hold the slot. When a new connection
//! finds no room, it takes the slot of the oldest pending connection (of its own peer when
//! that peer holds all it may, else of any peer): that connection is told to go
//! ([`Slot::evicted`]) and its slot is the newcomer's. A connection being answered
//! ([`Slot::answering`]) is never evicted; with no pending one to evict, the newcomer is
//! refused. So slow clients, from however many local addresses, cannot keep a scraper or a
//! prober out: each newcomer displaces them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;
use tokio::sync::Notify;

/// How many connections a listener holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub total: usize,
    pub per_peer: usize,
}

/// Who a connection comes from, as the limits count it (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Peer {
    Loopback,
    V4([u8; 4]),
    V6Prefix([u16; 4]),
}

impl Peer {
    pub fn of(ip: IpAddr) -> Peer {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match ip {
            _ if ip.is_loopback() => Peer::Loopback,
            IpAddr::V4(v4) => Peer::V4(v4.octets()),
            IpAddr::V6(v6) => {
                let s = v6.segments();
                Peer::V6Prefix([s[0], s[1], s[2], s[3]])
            }
        }
    }
}

/// What a connection and the slots share of its slot.
#[derive(Debug)]
struct SlotState {
    peer: Peer,
    since: Instant,
    /// Its request is being answered: it is not evicted.
    answering: AtomicBool,
    /// Told to go (its slot is another's now).
    evicted: AtomicBool,
    notify: Notify,
}

#[derive(Debug, Default)]
struct Held {
    /// The slots held, by a number of their own.
    slots: HashMap<u64, Arc<SlotState>>,
    by_peer: HashMap<Peer, usize>,
    next: u64,
}

impl Held {
    fn release(&mut self, id: u64) {
        if let Some(state) = self.slots.remove(&id) {
            if let Some(n) = self.by_peer.get_mut(&state.peer) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.by_peer.remove(&state.peer);
                }
            }
        }
    }

    /// The oldest pending slot (of `peer`, when given).
    fn oldest_pending(&self, peer: Option<Peer>) -> Option<u64> {
        self.slots
            .iter()
            .filter(|(_, s)| !s.answering.load(Ordering::Acquire))
            .filter(|(_, s)| peer.is_none_or(|p| s.peer == p))
            .min_by_key(|(id, s)| (s.since, **id))
            .map(|(id, _)| *id)
    }
}

/// The slots of one listener.
#[derive(Debug, Clone)]
pub struct Slots {
    limits: Limits,
    held: Arc<Mutex<Held>>,
}

/// One connection's slot.
#[derive(Debug)]
pub struct Slot {
    id: u64,
    state: Arc<SlotState>,
    held: Arc<Mutex<Held>>,
}

impl Slots {
    pub fn new(limits: Limits) -> Slots {
        Slots {
            limits,
            held: Arc::default(),
        }
    }

    /// A slot for a connection from `ip`: a free one, or the oldest pending connection's (see
    /// the module documentation); `None` when every slot it could have is being answered.
    pub fn take(&self, ip: IpAddr) -> Option<Slot> {
        let peer = Peer::of(ip);
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let of_peer = held.by_peer.get(&peer).copied().unwrap_or(0);
        let evict = if of_peer >= self.limits.per_peer {
            Some(held.oldest_pending(Some(peer))?)
        } else if held.slots.len() >= self.limits.total {
            Some(held.oldest_pending(None)?)
        } else {
            None
        };
        if let Some(id) = evict {
            if let Some(victim) = held.slots.get(&id) {
                victim.evicted.store(true, Ordering::Release);
                victim.notify.notify_one();
            }
            held.release(id);
        }
        held.next += 1;
        let id = held.next;
        let state = Arc::new(SlotState {
            peer,
            since: Instant::now(),
            answering: AtomicBool::new(false),
            evicted: AtomicBool::new(false),
            notify: Notify::new(),
        });
        held.slots.insert(id, state.clone());
        *held.by_peer.entry(peer).or_insert(0) += 1;
        Some(Slot {
            id,
            state,
            held: self.held.clone(),
        })
    }
}

impl Slot {
    /// Its request is being answered: from now on it is not evicted.
    pub fn answering(&self) {
        self.state.answering.store(true, Ordering::Release);
    }

    /// A handle that says when this slot is evicted (to hand to the request's answer).
    pub fn answering_flag(&self) -> AnsweringFlag {
        AnsweringFlag(self.state.clone())
    }

    /// Resolves when the slot was given to a newcomer: the connection is to be closed.
    pub async fn evicted(&self) {
        loop {
            let notified = self.state.notify.notified();
            if self.state.evicted.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }
}

/// What the answer of a request sets on its connection's slot (see [`Slot::answering`]).
#[derive(Debug, Clone)]
pub struct AnsweringFlag(Arc<SlotState>);

impl AnsweringFlag {
    pub fn set(&self) {
        self.0.answering.store(true, Ordering::Release);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        // An evicted slot's place was released already (and may be another's id never).
        if !self.state.evicted.load(Ordering::Acquire) {
            held.release(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn one_peer_cannot_take_every_slot() {
        let slots = Slots::new(Limits {
            total: 5,
            per_peer: 2,
        });
        let (a, b, c) = (ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.3"));
        let a1 = slots.take(a).unwrap();
        let a2 = slots.take(a).unwrap();
        a1.answering();
        a2.answering();
        assert!(
            slots.take(a).is_none(),
            "a third for one peer, the two being answered"
        );
        let b: Vec<Slot> = (0..2).map(|_| slots.take(b).unwrap()).collect();
        b.iter().for_each(Slot::answering);
        let c1 = slots.take(c).unwrap();
        c1.answering();
        assert!(
            slots.take(c).is_none(),
            "past the total, all being answered"
        );
        drop(a1);
        let _a3 = slots.take(a).expect("a freed slot is taken again");
        assert_eq!(slots.held.lock().unwrap().slots.len(), 5);
    }

    #[test]
    fn loopback_is_one_peer_and_v6_counts_by_its_64() {
        assert_eq!(Peer::of(ip("127.0.0.1")), Peer::of(ip("127.8.9.10")));
        assert_eq!(Peer::of(ip("::1")), Peer::Loopback);
        assert_eq!(Peer::of(ip("::ffff:127.0.0.2")), Peer::Loopback);
        assert_eq!(Peer::of(ip("::ffff:10.0.0.1")), Peer::of(ip("10.0.0.1")));
        assert_eq!(
            Peer::of(ip("2001:db8:1:2::1")),
            Peer::of(ip("2001:db8:1:2:ffff::9"))
        );
        assert_ne!(
            Peer::of(ip("2001:db8:1:2::1")),
            Peer::of(ip("2001:db8:1:3::1"))
        );
        let slots = Slots::new(Limits {
            total: 32,
            per_peer: 2,
        });
        let held: Vec<Slot> = ["127.0.0.5", "127.0.0.6"]
            .iter()
            .map(|a| slots.take(ip(a)).unwrap())
            .collect();
        held.iter().for_each(Slot::answering);
        assert!(
            slots.take(ip("127.0.0.7")).is_none(),
            "a third local address"
        );
    }

    #[tokio::test]
    async fn a_newcomer_takes_the_oldest_pending_slot() {
        let slots = Slots::new(Limits {
            total: 3,
            per_peer: 3,
        });
        // Three slow clients from three local addresses: all of the total, none answered.
        let slow: Vec<Slot> = ["127.0.0.5", "127.0.0.6", "127.0.0.7"]
            .iter()
            .map(|a| slots.take(ip(a)).unwrap())
            .collect();
        let scraper = slots
            .take(ip("127.0.0.1"))
            .expect("the oldest pending one's slot");
        tokio::time::timeout(std::time::Duration::from_secs(1), slow[0].evicted())
            .await
            .expect("the oldest was told to go");
        assert!(!slow[1].state.evicted.load(Ordering::Acquire));
        scraper.answering();
        // The evicted one goes; its drop frees nothing more.
        let mut slow = slow;
        drop(slow.remove(0));
        assert_eq!(slots.held.lock().unwrap().slots.len(), 3);
        // Another newcomer takes the next pending one, never the scraper being answered.
        let _next = slots.take(ip("127.0.0.8")).unwrap();
        assert!(slow[0].state.evicted.load(Ordering::Acquire));
        assert!(!scraper.state.evicted.load(Ordering::Acquire));
    }

    #[test]
    fn freed_peers_are_forgotten() {
        let slots = Slots::new(Limits {
            total: 4,
            per_peer: 4,
        });
        let peers: Vec<Slot> = (1..=4u8)
            .map(|i| slots.take(IpAddr::from([10, 0, 0, i])).unwrap())
            .collect();
        drop(peers);
        let held = slots.held.lock().unwrap();
        assert_eq!((held.slots.len(), held.by_peer.len()), (0, 0));
    }
}

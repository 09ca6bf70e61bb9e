//! Connection slots: at most `total` connections at once, and at most `per_peer` from one
//! address, so one client cannot hold every slot (a slow or hostile one, or a scraper gone
//! wrong). A slot is a [`Slot`] guard: dropping it frees it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// How many connections a listener holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub total: usize,
    pub per_peer: usize,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    by_peer: HashMap<IpAddr, usize>,
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
    peer: IpAddr,
    held: Arc<Mutex<Held>>,
}

impl Slots {
    pub fn new(limits: Limits) -> Slots {
        Slots {
            limits,
            held: Arc::default(),
        }
    }

    /// A slot for a connection from `peer`, or `None` when the listener or that peer holds
    /// all it may.
    pub fn take(&self, peer: IpAddr) -> Option<Slot> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let of_peer = held.by_peer.get(&peer).copied().unwrap_or(0);
        if held.total >= self.limits.total || of_peer >= self.limits.per_peer {
            return None;
        }
        held.total += 1;
        held.by_peer.insert(peer, of_peer + 1);
        Some(Slot {
            peer,
            held: self.held.clone(),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.total = held.total.saturating_sub(1);
        if let Some(n) = held.by_peer.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.by_peer.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_peer_cannot_take_every_slot() {
        let slots = Slots::new(Limits {
            total: 5,
            per_peer: 2,
        });
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let c: IpAddr = "10.0.0.3".parse().unwrap();
        let a1 = slots.take(a).unwrap();
        let _a2 = slots.take(a).unwrap();
        assert!(slots.take(a).is_none(), "a third for one peer");
        let _b: Vec<Slot> = (0..2).map(|_| slots.take(b).unwrap()).collect();
        let _c1 = slots.take(c).unwrap();
        assert!(slots.take(c).is_none(), "past the total");
        drop(a1);
        let _a3 = slots.take(a).expect("a freed slot is taken again");
        assert_eq!(slots.held.lock().unwrap().total, 5);
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
        assert_eq!((held.total, held.by_peer.len()), (0, 0));
    }
}

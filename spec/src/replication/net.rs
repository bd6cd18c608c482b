//! The network plumbing every replication model shares: replica sets as bitmasks and the
//! network as a sorted multiset of packets.
//!
//! It owns no model's packets, messages or faults: each model keeps its own packet type and
//! decides what a drop, a duplicate or a delivery does. Keeping the network sorted makes two
//! states that hold the same packets in a different order one state for the checker.

/// The bitmask of the one replica (or coordinator) `index`; masks are `u8`, so `index < 8`.
#[inline]
pub fn bit(index: usize) -> u8 {
    assert!(index < 8, "a mask holds at most eight members");
    1 << index
}

/// How many members the bitmask `mask` holds.
#[inline]
pub fn count(mask: u8) -> usize {
    mask.count_ones() as usize
}

/// Adds `packet` to `network`, kept sorted: after every packet not greater than it, so that
/// equal packets (a duplicate) sit side by side and the order never depends on arrival.
#[inline]
pub fn push_sorted<P: Ord>(network: &mut Vec<P>, packet: P) {
    let at = network.partition_point(|p| *p <= packet);
    network.insert(at, packet);
}

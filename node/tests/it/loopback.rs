//! Loopback ports for in-process cluster members. A port is reserved by a listener that stays
//! open until its member serves on it, so no other test can take the port in between (binding
//! port 0, closing it and binding again races with every other test of the binary).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};

/// One open listener per node on 127.0.0.1, each on a port the system chose.
pub fn reserve(nodes: impl IntoIterator<Item = u16>) -> BTreeMap<u16, std::net::TcpListener> {
    nodes
        .into_iter()
        .map(|node| {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            (node, listener)
        })
        .collect()
}

/// The addresses of `reserved`.
pub fn addresses(reserved: &BTreeMap<u16, std::net::TcpListener>) -> BTreeMap<u16, SocketAddr> {
    reserved
        .iter()
        .map(|(node, listener)| (*node, listener.local_addr().expect("an address")))
        .collect()
}

/// The member's peer listener on `address`: the reserved one at its first start, a new one
/// (with `SO_REUSEADDR`, as a restarted server binds) after a restart. Call inside a runtime.
pub fn listener(
    reserved: Option<std::net::TcpListener>,
    address: SocketAddr,
) -> tokio::net::TcpListener {
    if let Some(listener) = reserved {
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        return tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
    }
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket.set_reuseaddr(true).expect("SO_REUSEADDR");
    socket
        .bind(address)
        .expect("the member's peer port is free again");
    socket.listen(128).expect("listen")
}

/// Where `consecutive_free` looks next in this test binary, so two tests never probe the same
/// ports.
static NEXT_OFFSET: AtomicU32 = AtomicU32::new(0);

/// The first of `count` consecutive ports free on 127.0.0.1, for node processes, which cannot
/// be handed a listener. They are below the system's ephemeral range, so no socket binding
/// port 0 (every other test) can take one before the process binds it; each is probed by
/// binding it. The search starts at an offset of the process id, so test binaries running at
/// once spread out.
pub fn consecutive_free(count: u16) -> u16 {
    let ephemeral_start: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768);
    let low: u32 = 10_000;
    let span = ephemeral_start
        .checked_sub(low + u32::from(count))
        .filter(|span| *span > 0)
        .expect("ports free below the ephemeral range");
    let start = std::process::id().wrapping_mul(7_919);
    for _ in 0..1_000 {
        let offset = NEXT_OFFSET.fetch_add(u32::from(count), Ordering::Relaxed);
        let base = u16::try_from(low + start.wrapping_add(offset) % span).expect("below 65536");
        let free = (base..base + count)
            .all(|port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
        if free {
            return base;
        }
    }
    panic!("no {count} consecutive free ports found");
}

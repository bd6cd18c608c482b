//! Loopback ports for in-process cluster members. A port is reserved by a listener that stays
//! open until its member serves on it, so no other test can take the port in between (binding
//! port 0, closing it and binding again races with every other test of the binary).

use std::collections::BTreeMap;
use std::net::SocketAddr;

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

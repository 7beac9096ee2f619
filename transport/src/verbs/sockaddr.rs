//! `SocketAddr` <-> `sockaddr` for librdmacm.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// `addr` as a `sockaddr_storage` holding a `sockaddr_in` / `sockaddr_in6`.
pub(crate) fn to_storage(addr: &SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: sockaddr_storage is plain C data; all-zero is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in.
            unsafe {
                std::ptr::addr_of_mut!(ss)
                    .cast::<libc::sockaddr_in>()
                    .write(sin)
            };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in6.
            unsafe {
                std::ptr::addr_of_mut!(ss)
                    .cast::<libc::sockaddr_in6>()
                    .write(sin6)
            };
        }
    }
    ss
}

/// The address at `sa` (a `sockaddr` of the family it says); None for other families or
/// an unset (AF_UNSPEC) address.
///
/// # Safety
/// `sa` must point to a readable socket address at least as large as its family requires
/// (librdmacm's address unions are `sockaddr_storage`-sized).
pub(crate) unsafe fn from_sockaddr(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees `sa` is readable.
    let family = i32::from(unsafe { (*sa).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: the family says this is a sockaddr_in; read unaligned to be safe.
            let sin = unsafe { sa.cast::<libc::sockaddr_in>().read_unaligned() };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this is a sockaddr_in6.
            let sin6 = unsafe { sa.cast::<libc::sockaddr_in6>().read_unaligned() };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for a in [
            "10.10.0.1:4420",
            "[fe80::1%2]:4421",
            "0.0.0.0:0",
            "[::ffff:10.0.0.1]:1",
        ] {
            let addr: SocketAddr = a.parse().unwrap();
            let ss = to_storage(&addr);
            // SAFETY: `ss` is a full sockaddr_storage.
            let back = unsafe { from_sockaddr(std::ptr::addr_of!(ss).cast()) };
            assert_eq!(back, Some(addr), "{a}");
        }
        // SAFETY: zeroed storage is AF_UNSPEC, readable.
        let unspec: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let none = unsafe { from_sockaddr(std::ptr::addr_of!(unspec).cast()) };
        assert_eq!(none, None);
        // SAFETY: null is handled.
        assert_eq!(unsafe { from_sockaddr(std::ptr::null()) }, None);
    }

    #[test]
    fn network_order() {
        let ss = to_storage(&"10.10.0.1:4420".parse().unwrap());
        // SAFETY: written as a sockaddr_in above.
        let sin = unsafe { std::ptr::addr_of!(ss).cast::<libc::sockaddr_in>().read() };
        assert_eq!(sin.sin_port.to_ne_bytes(), 4420u16.to_be_bytes());
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [10, 10, 0, 1]);
    }
}

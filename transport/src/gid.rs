//! Choosing the GID index that serves an IP address: the decision behind the classic
//! "failed to modify QP state to RTR" when a RoCE user passes the wrong index.

use std::net::IpAddr;

use crate::error::{Result, TransportError};
use crate::types::{Gid, GidEntry, GidType};

/// The GID an address is carried in on RoCE v2: IPv4-mapped for IPv4, the address itself for
/// IPv6.
pub fn gid_of_ip(ip: IpAddr) -> Gid {
    match ip {
        IpAddr::V4(v4) => Gid::from_ipv4(v4),
        IpAddr::V6(v6) => Gid(v6.octets()),
    }
}

/// The index of the RoCE v2 GID that carries `ip`. When none does, the error lists the whole
/// table so the user sees which index to use instead (or that the address is not on the device).
pub fn roce_v2_index(table: &[GidEntry], ip: IpAddr) -> Result<u32> {
    let want = gid_of_ip(ip);
    table
        .iter()
        .find(|e| e.gid_type == GidType::RoceV2 && e.gid == want)
        .map(|e| e.index)
        .ok_or_else(|| TransportError::NoGidForAddress {
            ip,
            candidates: table.to_vec(),
        })
}

/// Explains why `index` is not usable for `ip`, naming the right one, or None when it is.
pub fn check_index(table: &[GidEntry], index: u32, ip: IpAddr) -> Option<String> {
    let entry = table.iter().find(|e| e.index == index);
    let right = roce_v2_index(table, ip).ok();
    if right == Some(index) {
        return None;
    }
    let what = match entry {
        None => format!("GID index {index} is empty or out of the table"),
        Some(e) => format!("GID index {index} holds {} ({:?})", e.gid, e.gid_type),
    };
    Some(match right {
        Some(r) => format!("{what}, not the RoCE v2 GID of {ip}: use GID index {r}"),
        None => format!(
            "{what}, and no RoCE v2 GID carries {ip}: is the address on this device's netdev?"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn table() -> Vec<GidEntry> {
        let ll = Gid([
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0, 0xff, 0xfe, 0x12, 0x34, 0x56,
        ]);
        let ip = Ipv4Addr::new(10, 10, 0, 1);
        vec![
            GidEntry {
                index: 0,
                gid: ll,
                gid_type: GidType::RoceV2,
                netdev: None,
            },
            GidEntry {
                index: 1,
                gid: Gid::from_ipv4(ip),
                gid_type: GidType::RoceV2,
                netdev: None,
            },
            GidEntry {
                index: 2,
                gid: Gid::from_ipv4(ip),
                gid_type: GidType::RoceV1,
                netdev: None,
            },
        ]
    }

    #[test]
    fn picks_the_ipv4_mapped_roce_v2_entry() {
        let ip = IpAddr::V4(Ipv4Addr::new(10, 10, 0, 1));
        assert_eq!(roce_v2_index(&table(), ip).unwrap(), 1);
    }

    #[test]
    fn no_match_lists_the_table() {
        let ip = IpAddr::V4(Ipv4Addr::new(10, 10, 0, 9));
        let err = roce_v2_index(&table(), ip).unwrap_err().to_string();
        assert!(err.contains("no RoCE v2 GID matches 10.10.0.9"), "{err}");
        assert!(
            err.contains("index 1: 0000:0000:0000:0000:0000:ffff:0a0a:0001 (RoceV2, 10.10.0.1)"),
            "{err}"
        );
    }

    #[test]
    fn wrong_index_names_the_right_one() {
        let ip = IpAddr::V4(Ipv4Addr::new(10, 10, 0, 1));
        assert_eq!(check_index(&table(), 1, ip), None);
        let msg = check_index(&table(), 0, ip).unwrap();
        assert!(msg.contains("use GID index 1"), "{msg}");
        let msg = check_index(&table(), 7, ip).unwrap();
        assert!(msg.contains("GID index 7 is empty"), "{msg}");
    }

    #[test]
    fn ipv4_mapped_round_trip() {
        let ip = Ipv4Addr::new(192, 0, 2, 7);
        let gid = Gid::from_ipv4(ip);
        assert_eq!(gid.to_string(), "0000:0000:0000:0000:0000:ffff:c000:0207");
        assert_eq!(gid.to_ipv4(), Some(ip));
        assert_eq!(
            Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]).to_ipv4(),
            None
        );
    }
}

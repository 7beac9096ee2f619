//! GID tables: reading a port's populated GIDs with their types, and choosing the GID index
//! that carries a given IP address (the index RTR / the CM must source from).
//!
//! rdma-sys 0.3 does not expose `ibv_query_gid_ex` / `ibv_query_gid_table`, so GIDs come
//! from `ibv_query_gid` (at most `gid_tbl_len` of them, zero GIDs skipped) and their types
//! and network devices from sysfs (`gid_attrs/types/<i>`, `gid_attrs/ndevs/<i>`), read only
//! for populated entries.
//!
//! Choosing the index for an address is provider-neutral and lives in `crate::gid`
//! (`roce_v2_index`); [`parse_gid_type`] is pure too.

use rdma_sys::*;

use super::VerbsContext;
use super::context::IBV_LINK_LAYER_INFINIBAND;
use crate::error::{Result, TransportError};
use crate::types::{Gid, GidEntry, GidType};

/// A sysfs `gid_attrs/types/<i>` string: "RoCE v2", or "IB/RoCE v1" (which is IB on an
/// InfiniBand port and RoCE v1 on an Ethernet one). None for anything else.
pub fn parse_gid_type(s: &str, infiniband_port: bool) -> Option<GidType> {
    match s.trim() {
        "RoCE v2" => Some(GidType::RoceV2),
        "IB/RoCE v1" | "RoCE v1" | "IB" => Some(if infiniband_port {
            GidType::Ib
        } else {
            GidType::RoceV1
        }),
        _ => None,
    }
}

fn sysfs_attr(dev: &str, port: u8, what: &str, index: u32) -> Option<String> {
    let path = format!("/sys/class/infiniband/{dev}/ports/{port}/gid_attrs/{what}/{index}");
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The populated entries of `port`'s GID table.
pub(crate) fn read_gid_table(
    ctx: &VerbsContext,
    dev: &str,
    port: u8,
    attr: &ibv_port_attr,
) -> Result<Vec<GidEntry>> {
    let ib = attr.link_layer == IBV_LINK_LAYER_INFINIBAND;
    let len = attr.gid_tbl_len.max(0);
    let mut out = Vec::new();
    for index in 0..len {
        let Some(gid) = query_gid(ctx, port, index)? else {
            continue;
        };
        if gid.is_zero() {
            continue;
        }
        let index = index as u32;
        let gid_type = sysfs_attr(dev, port, "types", index)
            .and_then(|t| parse_gid_type(&t, ib))
            .unwrap_or(if ib { GidType::Ib } else { GidType::RoceV1 });
        let netdev = sysfs_attr(dev, port, "ndevs", index);
        out.push(GidEntry {
            index,
            gid,
            gid_type,
            netdev,
        });
    }
    Ok(out)
}

/// One GID; None when the entry cannot be read (EINVAL/ENODATA on a hole of the table).
pub(crate) fn query_gid(ctx: &VerbsContext, port: u8, index: i32) -> Result<Option<Gid>> {
    let mut gid = ibv_gid { raw: [0; 16] };
    // SAFETY: the context is live; `gid` is a writable 16-byte union.
    let rc = unsafe { ibv_query_gid(ctx.raw(), port, index, &mut gid) };
    if rc != 0 {
        let e = super::errno();
        if e == libc::EINVAL && index == 0 {
            // index 0 always exists: a bad port number
            return Err(TransportError::from_errno("ibv_query_gid", e));
        }
        return Ok(None);
    }
    // SAFETY: every bit pattern of the union is a valid byte array.
    Ok(Some(Gid(unsafe { gid.raw })))
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    use super::*;

    fn entry(index: u32, gid: Gid, gid_type: GidType) -> GidEntry {
        GidEntry {
            index,
            gid,
            gid_type,
            netdev: Some("dummy0".into()),
        }
    }

    fn link_local() -> Gid {
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[8..].copy_from_slice(&[0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55]);
        Gid(g)
    }

    /// What rxe on dummy0 with 10.10.0.1 shows: link-local v1 + v2, then IPv4-mapped v1 + v2.
    fn rxe_table() -> Vec<GidEntry> {
        let v4 = Gid::from_ipv4(Ipv4Addr::new(10, 10, 0, 1));
        vec![
            entry(0, link_local(), GidType::RoceV1),
            entry(1, link_local(), GidType::RoceV2),
            entry(2, v4, GidType::RoceV1),
            entry(3, v4, GidType::RoceV2),
        ]
    }

    #[test]
    fn selects_roce_v2_ipv4_mapped() {
        let t = rxe_table();
        assert_eq!(
            crate::gid::roce_v2_index(&t, Ipv4Addr::new(10, 10, 0, 1).into()).unwrap(),
            3
        );
        // the same address written as IPv4-mapped IPv6
        let mapped: IpAddr = Ipv4Addr::new(10, 10, 0, 1).to_ipv6_mapped().into();
        assert_eq!(crate::gid::roce_v2_index(&t, mapped).unwrap(), 3);
        // a RoCE v1 entry with the right address is not good enough
        let only_v1 = vec![entry(
            2,
            Gid::from_ipv4(Ipv4Addr::new(10, 10, 0, 1)),
            GidType::RoceV1,
        )];
        assert!(crate::gid::roce_v2_index(&only_v1, Ipv4Addr::new(10, 10, 0, 1).into()).is_err());
    }

    #[test]
    fn ipv6_gid() {
        let ll = link_local();
        let t = rxe_table();
        assert_eq!(
            crate::gid::roce_v2_index(&t, Ipv6Addr::from(ll.0).into()).unwrap(),
            1
        );
    }

    #[test]
    fn no_match_lists_the_table() {
        let t = rxe_table();
        let err = crate::gid::roce_v2_index(&t, Ipv4Addr::new(192, 168, 1, 7).into()).unwrap_err();
        match &err {
            TransportError::NoGidForAddress { ip, candidates } => {
                assert_eq!(*ip, IpAddr::from(Ipv4Addr::new(192, 168, 1, 7)));
                assert_eq!(candidates.len(), 4);
            }
            e => panic!("unexpected {e}"),
        }
        let msg = err.to_string();
        assert!(msg.contains("192.168.1.7"), "{msg}");
        assert!(msg.contains("index 3"), "{msg}");
        assert!(msg.contains("10.10.0.1"), "{msg}");
        assert!(msg.contains("RoceV2"), "{msg}");
        let empty = crate::gid::roce_v2_index(&[], Ipv4Addr::new(10, 0, 0, 1).into()).unwrap_err();
        assert!(empty.to_string().contains("nothing"));
    }

    #[test]
    fn gid_types() {
        assert_eq!(parse_gid_type("RoCE v2\n", false), Some(GidType::RoceV2));
        assert_eq!(parse_gid_type("IB/RoCE v1", false), Some(GidType::RoceV1));
        assert_eq!(parse_gid_type("IB/RoCE v1", true), Some(GidType::Ib));
        assert_eq!(parse_gid_type("bogus", false), None);
    }

    #[test]
    fn ipv4_mapped_decoding() {
        let g = Gid::from_ipv4(Ipv4Addr::new(10, 10, 0, 1));
        assert_eq!(g.to_string(), "0000:0000:0000:0000:0000:ffff:0a0a:0001");
        assert_eq!(g.to_ipv4(), Some(Ipv4Addr::new(10, 10, 0, 1)));
        assert_eq!(link_local().to_ipv4(), None);
    }
}

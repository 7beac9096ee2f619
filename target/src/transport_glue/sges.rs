//! Cutting a request's data buffers (one SGE per io unit, in transfer order) into the SGE
//! lists of the RDMA READs or WRITEs that move it: one work request per keyed descriptor, each
//! covering its descriptor's byte range of the transfer, split at io-unit boundaries.

use nvmf_transport::Sge;

/// The SGEs covering bytes `offset..offset + len` of the transfer laid out by `units`, written
/// to `out`; returns how many, or None when `out` is too small or `units` too short.
pub fn slice(units: &[Sge], offset: u32, len: u32, out: &mut [Sge]) -> Option<usize> {
    let mut skip = offset;
    let mut left = len;
    let mut n = 0;
    for unit in units {
        if left == 0 {
            break;
        }
        if skip >= unit.length {
            skip -= unit.length;
            continue;
        }
        let take = (unit.length - skip).min(left);
        *out.get_mut(n)? = Sge {
            addr: unit.addr + u64::from(skip),
            length: take,
            lkey: unit.lkey,
        };
        n += 1;
        left -= take;
        skip = 0;
    }
    (left == 0).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(addr: u64) -> Sge {
        Sge {
            addr,
            length: 4096,
            lkey: 7,
        }
    }

    #[test]
    fn descriptors_cut_across_units() {
        let units = [unit(0x10000), unit(0x20000), unit(0x30000)];
        let mut out = [Sge::default(); 4];
        // The second of two 6 KiB descriptors: 2 KiB from unit 1, 4 KiB of unit 2.
        assert_eq!(slice(&units, 6144, 6144, &mut out), Some(2));
        assert_eq!((out[0].addr, out[0].length), (0x20000 + 2048, 2048));
        assert_eq!((out[1].addr, out[1].length), (0x30000, 4096));
        assert_eq!(out[1].lkey, 7);
        // Within one unit.
        assert_eq!(slice(&units, 100, 10, &mut out), Some(1));
        assert_eq!((out[0].addr, out[0].length), (0x10000 + 100, 10));
        // Past the buffers, or more pieces than room.
        assert_eq!(slice(&units, 8192, 8192, &mut out), None);
        assert_eq!(slice(&units, 0, 12288, &mut out[..2]), None);
    }
}

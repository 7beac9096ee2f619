//! Cutting a request's data buffers (one SGE per io unit, in transfer order) into the RDMA
//! READs or WRITEs that move it: each keyed descriptor's byte range of the transfer is split
//! at io-unit boundaries, and into several work requests when it needs more SGEs than one
//! carries (the device's limit: `SgeLimits`). A transfer whose pieces do not fit one chain is cut into several chains, posted
//! one after the other ([`next_chain`] from where the last one stopped).

use arrayvec::ArrayVec;
use nvmf_transport::Sge;
use nvmf_transport::pollgroup::MAX_WR_SGES;

/// One work request of a chain: part of keyed descriptor `keyed`, starting `remote_offset`
/// bytes into it, `length` bytes, its SGEs at `sges` of the pieces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cut {
    pub keyed: usize,
    pub remote_offset: u32,
    pub length: u32,
    pub sges: (usize, usize),
}

/// Appends to `out` the SGEs covering bytes `offset..` of the transfer laid out by `units`, at
/// most `len` bytes and at most `room` pieces (and what `out` holds); returns the bytes covered.
fn slice<const P: usize>(
    units: &[Sge],
    offset: u32,
    len: u32,
    room: usize,
    out: &mut ArrayVec<Sge, P>,
) -> u32 {
    let mut skip = offset;
    let mut covered = 0;
    let mut n = 0;
    for unit in units {
        if covered == len || n == room || out.is_full() {
            break;
        }
        if skip >= unit.length {
            skip -= unit.length;
            continue;
        }
        let take = (unit.length - skip).min(len - covered);
        out.push(Sge {
            addr: unit.addr + u64::from(skip),
            length: take,
            lkey: unit.lkey,
        });
        n += 1;
        covered += take;
        skip = 0;
    }
    covered
}

/// The next chain of a transfer over `units` to or from the keyed descriptors of lengths
/// `keyed` (back to back in transfer order; an iterator, so the caller's descriptors are read
/// in place, not collected into a list per chain), starting at transfer byte `from`: appended to
/// `wrs` and `pieces` (their capacities bound the chain; nothing is initialised first), each
/// work request at most `wr_sges` (1..=MAX_WR_SGES: the device's limit for the WRs' kind).
/// Returns the transfer byte it stops at; None when `units`
/// do not cover the descriptors.
pub fn next_chain<const P: usize, const W: usize>(
    units: &[Sge],
    keyed: impl IntoIterator<Item = u32>,
    from: u32,
    wr_sges: usize,
    pieces: &mut ArrayVec<Sge, P>,
    wrs: &mut ArrayVec<Cut, W>,
) -> Option<u32> {
    let wr_sges = wr_sges.clamp(1, MAX_WR_SGES);
    let mut pos = from;
    let mut start = 0u32;
    for (k, len) in keyed.into_iter().enumerate() {
        let end = start + len;
        while pos < end {
            if wrs.is_full() || pieces.is_full() {
                return Some(pos);
            }
            let first = pieces.len();
            let room = pieces.remaining_capacity().min(wr_sges);
            let covered = slice(units, pos, end - pos, room, pieces);
            let n = pieces.len() - first;
            if n == 0 {
                return None;
            }
            wrs.push(Cut {
                keyed: k,
                remote_offset: pos - start,
                length: covered,
                sges: (first, first + n),
            });
            pos += covered;
        }
        start = end;
    }
    Some(pos)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvmf_transport::pollgroup::{MAX_CHAIN_SGES, MAX_CHAIN_WRS};

    fn units(n: usize) -> Vec<Sge> {
        (0..n)
            .map(|i| Sge {
                addr: 0x10000 * (i as u64 + 1),
                length: 4096,
                lkey: 7,
            })
            .collect()
    }

    /// `cut_all_with` at MAX_WR_SGES SGEs per work request.
    fn cut_all(units: &[Sge], keyed: &[u32]) -> usize {
        cut_all_with(units, keyed, MAX_WR_SGES)
    }

    /// Cuts a whole transfer into chains as the handler does, `wr_sges` SGEs per work request
    /// at most; checks every limit and that the WRs cover each descriptor exactly, in order,
    /// with the right buffer bytes. Returns the chains.
    fn cut_all_with(units: &[Sge], keyed: &[u32], wr_sges: usize) -> usize {
        let total: u32 = keyed.iter().sum();
        let mut from = 0;
        let mut chains = 0;
        let mut seen = vec![0u32; keyed.len()];
        while from < total {
            let mut pieces = ArrayVec::<Sge, { MAX_CHAIN_SGES - 1 }>::new();
            let mut wrs = ArrayVec::<Cut, { MAX_CHAIN_WRS - 1 }>::new();
            let end = next_chain(
                units,
                keyed.iter().copied(),
                from,
                wr_sges,
                &mut pieces,
                &mut wrs,
            )
            .unwrap();
            let (nw, ns) = (wrs.len(), pieces.len());
            assert!(end > from, "progress");
            assert!(
                ns < MAX_CHAIN_SGES && nw < MAX_CHAIN_WRS,
                "room kept for the SEND"
            );
            let mut at = from;
            for w in &wrs[..nw] {
                assert!(w.sges.1 - w.sges.0 <= wr_sges.clamp(1, MAX_WR_SGES));
                assert_eq!(
                    w.remote_offset, seen[w.keyed],
                    "descriptor {} in order",
                    w.keyed
                );
                let bytes: u32 = pieces[w.sges.0..w.sges.1].iter().map(|p| p.length).sum();
                assert_eq!(bytes, w.length);
                // The first piece is transfer byte `at` of the units.
                let unit = &units[(at / 4096) as usize];
                assert_eq!(pieces[w.sges.0].addr, unit.addr + u64::from(at % 4096));
                seen[w.keyed] += w.length;
                at += w.length;
            }
            assert_eq!(at, end);
            from = end;
            chains += 1;
        }
        assert_eq!(seen, keyed, "every descriptor covered exactly");
        chains
    }

    #[test]
    fn descriptors_cut_across_units() {
        let u = units(3);
        let mut pieces = ArrayVec::<Sge, 4>::new();
        let mut wrs = ArrayVec::<Cut, 4>::new();
        // Two 6 KiB descriptors: the second is 2 KiB of unit 1 and 4 KiB of unit 2.
        let end = next_chain(&u, [6144, 6144], 0, MAX_WR_SGES, &mut pieces, &mut wrs).unwrap();
        assert_eq!((wrs.len(), pieces.len(), end), (2, 4, 12288));
        assert_eq!(wrs[1].sges, (2, 4));
        assert_eq!((pieces[2].addr, pieces[2].length), (0x20000 + 2048, 2048));
        assert_eq!((pieces[3].addr, pieces[3].length), (0x30000, 4096));
        // Past the buffers.
        pieces.clear();
        wrs.clear();
        assert_eq!(
            next_chain(&u, [16384], 0, MAX_WR_SGES, &mut pieces, &mut wrs),
            None
        );
    }

    #[test]
    fn one_large_descriptor_takes_several_work_requests() {
        // 128 KiB in 4 KiB units: 32 SGEs, at most 16 per WR.
        let u = units(32);
        let mut pieces = ArrayVec::<Sge, { MAX_CHAIN_SGES - 1 }>::new();
        let mut wrs = ArrayVec::<Cut, { MAX_CHAIN_WRS - 1 }>::new();
        let end = next_chain(&u, [131072], 0, MAX_WR_SGES, &mut pieces, &mut wrs).unwrap();
        assert_eq!(wrs.len(), 2);
        assert_eq!(wrs[1].remote_offset, 16 * 4096);
        assert!(end < 131072, "31 SGEs leave one unit for the next chain");
        assert_eq!(cut_all(&u, &[131072]), 2);
    }

    #[test]
    fn many_misaligned_descriptors_take_several_chains() {
        // 16 descriptors, each ending mid-unit: 32 units + 15 splits = 47 pieces.
        let u = units(32);
        let mut keyed = vec![100u32; 15];
        keyed.push(131072 - 1500);
        assert!(cut_all(&u, &keyed) >= 2);
        let even = vec![8192u32; 16];
        assert_eq!(cut_all(&u, &even), 2);
        assert_eq!(cut_all(&units(2), &[4096, 4096]), 1);
    }

    #[test]
    fn a_narrow_device_takes_more_work_requests() {
        let u = units(32);
        // iWARP's one SGE per READ: 32 WRs of one unit each, 16 to a chain.
        assert_eq!(cut_all_with(&u, &[131072], 1), 2);
        let mut pieces = ArrayVec::<Sge, { MAX_CHAIN_SGES - 1 }>::new();
        let mut wrs = ArrayVec::<Cut, { MAX_CHAIN_WRS - 1 }>::new();
        let end = next_chain(&u, [131072], 0, 4, &mut pieces, &mut wrs).unwrap();
        assert_eq!(wrs.len(), 8, "four units to a WR");
        assert_eq!(wrs[1].remote_offset, 4 * 4096);
        assert_eq!(end, 31 * 4096, "the chain's 31 pieces");
        // 47 pieces, one to a WR: three chains.
        let mut keyed = vec![100u32; 15];
        keyed.push(131072 - 1500);
        assert_eq!(cut_all_with(&u, &keyed, 1), 3);
        // Out of range is taken as the nearest limit.
        assert_eq!(cut_all_with(&u, &[131072], 0), 2);
        assert_eq!(cut_all_with(&u, &[131072], 64), 2);
    }

    proptest::proptest! {
        /// Any descriptor lengths over the units and any SGE limit: every chain within its
        /// limits, every descriptor covered exactly once, in order.
        #[test]
        fn any_cut_covers_the_transfer(
            keyed in proptest::collection::vec(1u32..20000, 1..=16),
            wr_sges in 1usize..=MAX_WR_SGES,
        ) {
            let total: u32 = keyed.iter().sum();
            let u = units((total as usize).div_ceil(4096));
            proptest::prop_assert!(cut_all_with(&u, &keyed, wr_sges) >= 1);
        }
    }
}

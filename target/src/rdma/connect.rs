//! The decision on one NVMe-oF RDMA connect request: accept (with the queue depth and RDMA READ
//! depth to grant) or reject (with the NVMe-oF reject status). Pure: no I/O, so every rule is
//! unit-tested here, and bytes from the network never reach a panic.

use nvmf_protocol::cm::{RdmaAccept, RdmaConnectRequest, RejectStatus};
use nvmf_transport::ConnParam;

/// What this target allows, fixed when the transport starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectLimits {
    /// Most commands per queue (the poll groups' `max_queue_depth`).
    pub max_queue_depth: u16,
    /// Highest I/O queue id a host may connect (QID 0, the admin queue, is always allowed).
    pub max_qid: u16,
    /// Most RDMA READs the target issues at once on one queue: min(own limit, the device's
    /// `max_qp_init_rd_atom`).
    pub max_read_depth: u8,
}

/// A connect request that may be accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The host's request as decoded.
    pub request: RdmaConnectRequest,
    /// Queue depth: min(own max, HRQSIZE, HSQSIZE + 1); also the CRQSIZE sent back.
    pub depth: u16,
    /// RDMA READs the target may have outstanding: min(own max, device, host's IRD).
    pub read_depth: u8,
}

impl Grant {
    /// The accept parameters: CRQSIZE = depth, responder_resources 0 (the host never reads
    /// from the target), initiator_depth = read depth, RNR retry forever (an empty SRQ slows a
    /// host down instead of failing it).
    pub fn accept_param(&self) -> ConnParam {
        ConnParam {
            private_data: RdmaAccept {
                recfmt: 0,
                crqsize: self.depth,
            }
            .to_bytes()
            .to_vec(),
            responder_resources: 0,
            initiator_depth: self.read_depth,
            retry_count: 7,
            rnr_retry_count: 7,
        }
    }
}

/// Decides on a connect request. `private_data` is what the CM delivered (possibly padded);
/// `host_ird` is the host's offered responder_resources (the RDMA READs it serves at once).
pub fn decide(
    private_data: &[u8],
    host_ird: u8,
    limits: &ConnectLimits,
) -> Result<Grant, RejectStatus> {
    let request = RdmaConnectRequest::decode(private_data)
        .map_err(|_| RejectStatus::InvalidPrivateDataLength)?;
    request.check()?;
    if request.qid > limits.max_qid {
        return Err(RejectStatus::InvalidQid);
    }
    let depth = request.negotiated_depth(limits.max_queue_depth);
    if depth == 0 {
        // Only reachable with a zero own maximum: nothing could be queued.
        return Err(RejectStatus::NoResources);
    }
    let read_depth = limits.max_read_depth.min(host_ird);
    if read_depth == 0 {
        // The target could never fetch host write data (RDMA READ) on this queue.
        return Err(RejectStatus::InvalidIrd);
    }
    Ok(Grant {
        request,
        depth,
        read_depth,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: ConnectLimits = ConnectLimits {
        max_queue_depth: 128,
        max_qid: 64,
        max_read_depth: 16,
    };

    fn req(qid: u16, hrqsize: u16, hsqsize: u16) -> Vec<u8> {
        RdmaConnectRequest {
            recfmt: 0,
            qid,
            hrqsize,
            hsqsize,
            cntlid: 0xFFFF,
        }
        .to_bytes()
        .to_vec()
    }

    #[test]
    fn linux_admin_and_io_queues() {
        let g = decide(&req(0, 32, 31), 16, &LIMITS).unwrap();
        assert_eq!((g.depth, g.read_depth), (32, 16));
        let p = g.accept_param();
        assert_eq!(RdmaAccept::decode(&p.private_data).unwrap().crqsize, 32);
        assert_eq!(p.private_data.len(), 32);
        assert_eq!((p.responder_resources, p.rnr_retry_count), (0, 7));
        let g = decide(&req(4, 128, 127), 4, &LIMITS).unwrap();
        assert_eq!((g.depth, g.read_depth), (128, 4));
    }

    #[test]
    fn hsqsize_is_zeros_based() {
        // HSQSIZE 15 means 16 entries: the depth is 16, not 15.
        assert_eq!(decide(&req(1, 64, 15), 1, &LIMITS).unwrap().depth, 16);
        // HRQSIZE is 1's based.
        assert_eq!(decide(&req(1, 8, 127), 1, &LIMITS).unwrap().depth, 8);
        // Own maximum caps both.
        let small = ConnectLimits {
            max_queue_depth: 4,
            ..LIMITS
        };
        assert_eq!(decide(&req(1, 128, 127), 1, &small).unwrap().depth, 4);
    }

    #[test]
    fn rejects() {
        let mut bad_fmt = req(1, 32, 31);
        bad_fmt[0] = 1;
        assert_eq!(
            decide(&bad_fmt, 16, &LIMITS),
            Err(RejectStatus::InvalidRecfmt)
        );
        assert_eq!(
            decide(&req(65, 32, 31), 16, &LIMITS),
            Err(RejectStatus::InvalidQid)
        );
        assert!(decide(&req(64, 32, 31), 16, &LIMITS).is_ok());
        assert_eq!(
            decide(&req(1, 32, 0), 16, &LIMITS),
            Err(RejectStatus::InvalidHsqsize)
        );
        assert_eq!(
            decide(&req(1, 0, 31), 16, &LIMITS),
            Err(RejectStatus::InvalidHrqsize)
        );
        assert_eq!(
            decide(&req(1, 32, 31)[..20], 16, &LIMITS),
            Err(RejectStatus::InvalidPrivateDataLength)
        );
        assert_eq!(
            decide(&[], 16, &LIMITS),
            Err(RejectStatus::InvalidPrivateDataLength)
        );
        assert_eq!(
            decide(&req(1, 32, 31), 0, &LIMITS),
            Err(RejectStatus::InvalidIrd)
        );
        let none = ConnectLimits {
            max_queue_depth: 0,
            ..LIMITS
        };
        assert_eq!(
            decide(&req(1, 32, 31), 16, &none),
            Err(RejectStatus::NoResources)
        );
    }

    #[test]
    fn padded_private_data() {
        let mut pd = req(2, 32, 31);
        pd.resize(56, 0xAA);
        assert_eq!(decide(&pd, 16, &LIMITS).unwrap().request.qid, 2);
    }
}

//! An in-crate test host: builds SQEs with nvmf-protocol and drives `Queue`s with no
//! transport, the way the RDMA glue will.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use nvmf_protocol::fabrics::{
    CNTLID_DYNAMIC, ConnectCmd, ConnectData, ConnectInvalidParameter, PropertyGetCmd,
    PropertySetCmd, PropertySize,
};
use nvmf_protocol::identify::{IdentifyController, IdentifyNamespace, NsIdDescriptor, NsList};
use nvmf_protocol::log::{DiscoveryLog, SmartLog};
use nvmf_protocol::nvm::DsmRange;
use nvmf_protocol::properties::{
    Cap, Cc, Csts, PropertyOffset, ShutdownNotification, ShutdownStatus,
};
use nvmf_protocol::status::{CommandSpecificStatus, FabricsStatus, GenericStatus, MediaStatus};
use nvmf_protocol::{Cqe, FixedStr, SglDescriptor, Sqe, StatusCode};

use crate::bdev::{FileBdev, IoBuf, MallocBdev, NullBdev};

use super::*;

const SUBNQN: &str = "nqn.2016-06.io.nvmf-rs:test";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:2b4c8d1e-0f3a-4e5b-9c6d-7e8f9a0b1c2d";
const OTHER_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0f3a-4e5b-9c6d-7e8f9a0b1c2d";
const HOSTID: [u8; 16] = [7; 16];

fn listener() -> SocketAddr {
    "127.0.0.1:4420".parse().unwrap()
}

/// A target with one subsystem: nsid 1 malloc (512 B blocks, 1 MiB), nsid 2 null (4 KiB).
fn target(allow_any: bool) -> Arc<Target> {
    let mut t = Target::new(Limits::default(), vec![listener()]);
    let m = t.add_bdev("m0", Arc::new(MallocBdev::new("m0", 512, 1 << 20).unwrap()));
    let n = t.add_bdev("n0", Arc::new(NullBdev::new("n0", 4096, 1 << 30).unwrap()));
    t.add_bdev(
        "spare",
        Arc::new(MallocBdev::new("spare", 512, 1 << 16).unwrap()),
    );
    let hosts = if allow_any {
        vec![]
    } else {
        vec![HOST.to_owned()]
    };
    let sub = Arc::new(Subsystem::new(
        SUBNQN,
        "SN1",
        "MODEL",
        allow_any,
        hosts,
        16,
        vec![listener()],
    ));
    for (nsid, index) in [(1, m), (2, n)] {
        let bdev = t.bdev(index).unwrap();
        sub.add_namespace(Namespace {
            nsid,
            bdev_index: index,
            info: bdev.info().clone(),
            bdev,
            uuid: Some([nsid as u8; 16]),
            nguid: Some([0xA0 + nsid as u8; 16]),
        })
        .unwrap();
    }
    t.add_subsystem(sub);
    Arc::new(t)
}

/// A target whose one subsystem (any host) has `bdevs` as namespaces 1, 2, ...
fn target_with(bdevs: Vec<(&str, Arc<dyn crate::bdev::Bdev>)>) -> Arc<Target> {
    let mut t = Target::new(Limits::default(), vec![listener()]);
    let sub = Arc::new(Subsystem::new(
        SUBNQN,
        "SN1",
        "MODEL",
        true,
        vec![],
        16,
        vec![listener()],
    ));
    for (i, (name, bdev)) in bdevs.into_iter().enumerate() {
        let index = t.add_bdev(name, bdev);
        let bdev = t.bdev(index).unwrap();
        sub.add_namespace(Namespace {
            nsid: i as u32 + 1,
            bdev_index: index,
            info: bdev.info().clone(),
            bdev,
            uuid: None,
            nguid: None,
        })
        .unwrap();
    }
    t.add_subsystem(sub);
    Arc::new(t)
}

struct Host {
    target: Arc<Target>,
    io: ReactorIo,
    now: Instant,
    next_cid: u16,
}

impl Host {
    fn new(target: Arc<Target>) -> Host {
        Host {
            io: ReactorIo::new(target.clone()),
            target,
            now: Instant::now(),
            next_cid: 1,
        }
    }

    fn queue(&mut self) -> Queue {
        Queue::new(self.target.clone(), &mut self.io, listener(), 128)
    }

    /// Execute and wait: whether the command succeeded.
    fn succeeds(&mut self, q: &mut Queue, sqe: Sqe, data: &mut [u8]) -> bool {
        self.exec(q, sqe, data).status.is_success()
    }

    /// Execute and wait (polling the reactor I/O context and the queue's events).
    fn exec(&mut self, q: &mut Queue, mut sqe: Sqe, data: &mut [u8]) -> Cqe {
        sqe.cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1);
        let tag = u64::from(sqe.cid) + 1000;
        let cqe = super::fuzzing::execute_and_wait(q, &mut self.io, &sqe, data, tag, self.now);
        assert_eq!(cqe.cid, sqe.cid);
        cqe
    }

    fn connect(
        &mut self,
        q: &mut Queue,
        qid: u16,
        sqsize: u16,
        cntlid: u16,
        subnqn: &str,
        hostnqn: &str,
    ) -> Cqe {
        self.connect_kato(q, (qid, sqsize, cntlid), subnqn, hostnqn, 15_000)
    }

    /// Connect with a Keep Alive Timeout of `kato` ms; `at` is (QID, SQSIZE, CNTLID).
    fn connect_kato(
        &mut self,
        q: &mut Queue,
        at: (u16, u16, u16),
        subnqn: &str,
        hostnqn: &str,
        kato: u32,
    ) -> Cqe {
        let (qid, sqsize, cntlid) = at;
        let cmd = ConnectCmd {
            cid: 0,
            recfmt: 0,
            qid,
            sqsize,
            cattr: 0,
            kato,
            sgl: SglDescriptor::keyed(0x1000, 1024, 0x55, true).unwrap(),
        };
        let mut data = ConnectData {
            hostid: HOSTID,
            cntlid,
            subnqn: FixedStr::new(subnqn, "SUBNQN").unwrap(),
            hostnqn: FixedStr::new(hostnqn, "HOSTNQN").unwrap(),
        }
        .to_bytes();
        self.exec(q, cmd.to_sqe(), &mut data)
    }

    fn prop_set(&mut self, q: &mut Queue, offset: PropertyOffset, value: u64) -> Cqe {
        let size = if offset == PropertyOffset::Cap {
            PropertySize::Eight
        } else {
            PropertySize::Four
        };
        self.exec(
            q,
            PropertySetCmd {
                cid: 0,
                size,
                offset,
                value,
            }
            .to_sqe(),
            &mut [],
        )
    }

    fn prop_get(&mut self, q: &mut Queue, offset: PropertyOffset) -> Cqe {
        let size = if offset == PropertyOffset::Cap {
            PropertySize::Eight
        } else {
            PropertySize::Four
        };
        self.exec(
            q,
            PropertyGetCmd {
                cid: 0,
                size,
                offset,
            }
            .to_sqe(),
            &mut [],
        )
    }

    /// CSTS.SHST as Property Get reads it.
    fn shst(&mut self, aq: &mut Queue) -> ShutdownStatus {
        Csts::from_u32(self.prop_get(aq, PropertyOffset::Csts).dw0).shst
    }

    /// Property Set of CC.
    fn set_cc(&mut self, q: &mut Queue, cc: Cc) -> Cqe {
        self.prop_set(q, PropertyOffset::Cc, u64::from(cc.to_u32()))
    }

    /// Admin connect + CC.EN = 1; returns the queue and its controller id.
    fn admin(&mut self) -> (Queue, u16) {
        let mut q = self.queue();
        let c = self.connect(&mut q, 0, 31, CNTLID_DYNAMIC, SUBNQN, HOST);
        assert!(c.status.is_success(), "{c:?}");
        let cc = Cc::enabled_nvm();
        assert!(self.set_cc(&mut q, cc).status.is_success());
        (q, c.dw0 as u16)
    }

    /// A discovery controller's admin queue, connected and enabled.
    fn discovery(&mut self) -> Queue {
        let mut q = self.queue();
        let c = self.connect(
            &mut q,
            0,
            31,
            CNTLID_DYNAMIC,
            nvmf_protocol::DISCOVERY_NQN,
            HOST,
        );
        assert!(c.status.is_success(), "{c:?}");
        assert!(self.set_cc(&mut q, Cc::enabled_nvm()).status.is_success());
        q
    }

    fn io_queue(&mut self, qid: u16, cntlid: u16) -> Queue {
        let mut q = self.queue();
        let c = self.connect(&mut q, qid, 127, cntlid, SUBNQN, HOST);
        assert!(c.status.is_success(), "{c:?}");
        q
    }
}

/// CC of an enabled controller notified of a normal shutdown.
fn normal_shutdown() -> Cc {
    Cc {
        shn: ShutdownNotification::Normal,
        ..Cc::enabled_nvm()
    }
}

fn rw(opcode: u8, nsid: u32, lba: u64, blocks: u32) -> Sqe {
    let mut s = Sqe::new(opcode, 0, nsid);
    s.cdw10 = lba as u32;
    s.cdw11 = (lba >> 32) as u32;
    s.cdw12 = blocks - 1;
    s
}

fn admin_cmd(opcode: u8, nsid: u32, cdw10: u32, cdw11: u32) -> Sqe {
    let mut s = Sqe::new(opcode, 0, nsid);
    s.cdw10 = cdw10;
    s.cdw11 = cdw11;
    s
}

fn get_log(lid: u8, bytes: u32, lpo: u64) -> Sqe {
    let numd = bytes / 4 - 1;
    let mut s = admin_cmd(
        0x02,
        0xFFFF_FFFF,
        u32::from(lid) | ((numd & 0xFFFF) << 16),
        numd >> 16,
    );
    s.cdw12 = lpo as u32;
    s.cdw13 = (lpo >> 32) as u32;
    s
}

fn generic(c: &Cqe) -> Option<GenericStatus> {
    match c.status.code {
        StatusCode::Generic(g) => Some(g),
        _ => None,
    }
}

fn fabrics_status(c: &Cqe) -> FabricsStatus {
    match c
        .status
        .in_context(nvmf_protocol::StatusContext::Fabrics)
        .code
    {
        StatusCode::Fabrics(f) => f,
        other => panic!("not a fabrics status: {other:?}"),
    }
}

#[test]
fn bring_up_identify_features_and_io() {
    let mut h = Host::new(target(true));
    let (mut aq, cntlid) = h.admin();
    assert_ne!(cntlid, 0xFFFF);
    let cap = Cap::from_u64(h.prop_get(&mut aq, PropertyOffset::Cap).result64());
    assert_eq!(cap.mqes, 127);
    assert_eq!(cap.css & Cap::CSS_NVM, Cap::CSS_NVM);
    assert_eq!(cap.dstrd, 0);
    assert!(cap.to > 0);
    assert_eq!(h.prop_get(&mut aq, PropertyOffset::Vs).dw0, 0x0001_0300);
    assert!(Csts::from_u32(h.prop_get(&mut aq, PropertyOffset::Csts).dw0).rdy);

    // Identify Controller.
    let mut page = vec![0u8; 4096];
    assert!(
        h.exec(&mut aq, admin_cmd(0x06, 0, 1, 0), &mut page)
            .status
            .is_success()
    );
    let id = IdentifyController::decode(&page).unwrap();
    assert_eq!(id.cntlid, cntlid);
    assert_eq!(id.mdts, 5);
    assert_eq!(
        id.sgls & ((1 << 2) | (1 << 20) | 1),
        (1 << 2) | (1 << 20) | 1
    );
    assert_eq!(id.ioccsz, (64 + 4096) / 16);
    assert_eq!(id.iorcsz, 1);
    assert_eq!(id.icdoff, 0);
    assert_eq!(id.msdbd, 16);
    assert_eq!(id.kas, 5);
    assert_eq!(id.subnqn.as_str(), SUBNQN);
    assert_eq!(id.nn, 16);
    assert_eq!((id.sqes, id.cqes), (0x66, 0x44));
    assert_eq!(id.maxcmd, 128);
    assert_eq!(id.vwc & 1, 1);
    assert_eq!(id.oncs, 0b1_1101);
    assert_eq!(id.ctratt, 1);
    assert_eq!(id.sn.as_str(), "SN1");

    // Namespaces.
    assert!(
        h.exec(&mut aq, admin_cmd(0x06, 1, 0, 0), &mut page)
            .status
            .is_success()
    );
    let ns = IdentifyNamespace::decode(&page).unwrap();
    assert_eq!(ns.nsze, 2048);
    assert_eq!(ns.block_size(), Some(512));
    assert_eq!(ns.nguid, [0xA1; 16]);
    assert!(
        h.exec(&mut aq, admin_cmd(0x06, 0, 2, 0), &mut page)
            .status
            .is_success()
    );
    assert_eq!(NsList::decode(&page).unwrap().as_slice(), &[1, 2]);
    assert!(
        h.exec(&mut aq, admin_cmd(0x06, 1, 2, 0), &mut page)
            .status
            .is_success()
    );
    assert_eq!(NsList::decode(&page).unwrap().as_slice(), &[2]);
    assert!(
        h.exec(&mut aq, admin_cmd(0x06, 2, 3, 0), &mut page)
            .status
            .is_success()
    );
    let d = NsIdDescriptor::decode_list(&page).unwrap();
    assert!(
        d.contains(&NsIdDescriptor::Uuid([2; 16]))
            && d.contains(&NsIdDescriptor::Nguid([0xA2; 16]))
    );
    // Inactive NSID in range: zeroes; out of range: Invalid Namespace.
    page.fill(1);
    assert!(
        h.exec(&mut aq, admin_cmd(0x06, 9, 0, 0), &mut page)
            .status
            .is_success()
    );
    assert!(page.iter().all(|b| *b == 0));
    assert_eq!(
        generic(&h.exec(&mut aq, admin_cmd(0x06, 17, 0, 0), &mut page)),
        Some(GenericStatus::InvalidNamespaceOrFormat)
    );
    assert_eq!(
        generic(&h.exec(&mut aq, admin_cmd(0x06, 9, 3, 0), &mut page)),
        Some(GenericStatus::InvalidNamespaceOrFormat)
    );
    // NSID FFFFFFFFh (capabilities common to all namespaces) needs Namespace Management,
    // which this controller lacks (OACS bit 3 clear): Invalid Namespace or Format.
    assert_eq!(
        generic(&h.exec(&mut aq, admin_cmd(0x06, 0xFFFF_FFFF, 0, 0), &mut page)),
        Some(GenericStatus::InvalidNamespaceOrFormat)
    );
    let mut raw = vec![0u8; 4096];
    h.exec(&mut aq, admin_cmd(0x06, 0, 1, 0), &mut raw);
    let id = IdentifyController::decode(&raw).unwrap();
    assert_eq!(id.oacs & (1 << 3), 0, "no Namespace Management");
    assert_eq!(id.lpa & 1, 0, "no per-namespace SMART");

    // Features.
    let nq = h.exec(&mut aq, admin_cmd(0x09, 0, 0x07, (3 << 16) | 3), &mut []);
    assert_eq!(nq.dw0, (3 << 16) | 3);
    assert_eq!(
        h.exec(&mut aq, admin_cmd(0x0A, 0, 0x07, 0), &mut []).dw0,
        (3 << 16) | 3
    );
    assert!(
        h.exec(&mut aq, admin_cmd(0x09, 0, 0x0F, 20_000), &mut [])
            .status
            .is_success()
    );
    assert_eq!(
        h.exec(&mut aq, admin_cmd(0x0A, 0, 0x0F, 0), &mut []).dw0,
        20_000
    );
    for (fid, v) in [
        (0x01u32, 0x0302_0107u32),
        (0x06, 0),
        (0x0B, 1 << 8),
        (0x02, 0),
    ] {
        assert!(
            h.exec(&mut aq, admin_cmd(0x09, 0, fid, v), &mut [])
                .status
                .is_success(),
            "fid {fid}"
        );
        assert_eq!(
            h.exec(&mut aq, admin_cmd(0x0A, 0, fid, 0), &mut []).dw0,
            v,
            "fid {fid}"
        );
    }
    assert!(
        h.exec(&mut aq, admin_cmd(0x18, 0, 0, 0), &mut [])
            .status
            .is_success()
    );
    assert_eq!(
        h.exec(&mut aq, admin_cmd(0x08, 0, 0, 0), &mut []).dw0 & 1,
        1
    );

    // I/O queue 1..=4 allowed, 5 not.
    let mut q = h.io_queue(1, cntlid);
    let mut q5 = h.queue();
    let c = h.connect(&mut q5, 5, 127, cntlid, SUBNQN, HOST);
    assert_eq!(fabrics_status(&c), FabricsStatus::InvalidParameters);
    assert_eq!(
        ConnectInvalidParameter::from_dw0(c.dw0),
        ConnectInvalidParameter::QID
    );
    // Number of Queues is fixed once I/O queues exist.
    assert_eq!(
        generic(&h.exec(&mut aq, admin_cmd(0x09, 0, 0x07, 0), &mut [])),
        Some(GenericStatus::CommandSequenceError)
    );

    // Write, read back, compare, flush, write zeroes, deallocate.
    let pattern: Vec<u8> = (0..4096).map(|i| (i * 31 % 253) as u8).collect();
    let mut data = pattern.clone();
    assert!(
        h.exec(&mut q, rw(0x01, 1, 10, 8), &mut data)
            .status
            .is_success()
    );
    let mut back = vec![0u8; 4096];
    assert!(
        h.exec(&mut q, rw(0x02, 1, 10, 8), &mut back)
            .status
            .is_success()
    );
    assert_eq!(back, pattern);
    assert!(
        h.exec(&mut q, rw(0x05, 1, 10, 8), &mut back)
            .status
            .is_success()
    );
    back[100] ^= 0xFF;
    let c = h.exec(&mut q, rw(0x05, 1, 10, 8), &mut back);
    assert_eq!(
        c.status.code,
        StatusCode::Media(MediaStatus::CompareFailure)
    );
    assert!(
        h.exec(&mut q, rw(0x00, 1, 0, 1), &mut [])
            .status
            .is_success()
    );
    assert!(
        h.exec(&mut q, rw(0x08, 1, 11, 1), &mut [])
            .status
            .is_success()
    );
    assert!(
        h.exec(&mut q, rw(0x02, 1, 10, 8), &mut back)
            .status
            .is_success()
    );
    assert_eq!(back[..512], pattern[..512]);
    assert!(back[512..1024].iter().all(|b| *b == 0));
    assert_eq!(back[1024..], pattern[1024..]);
    let mut ranges = [0u8; 32];
    DsmRange {
        context_attributes: 0,
        length: 1,
        slba: 10,
    }
    .encode_into(&mut ranges)
    .unwrap();
    DsmRange {
        context_attributes: 0,
        length: 2,
        slba: 16,
    }
    .encode_into(&mut ranges[16..])
    .unwrap();
    let mut dsm = Sqe::new(0x09, 0, 1);
    dsm.cdw10 = 1;
    dsm.cdw11 = 1 << 2;
    assert!(h.exec(&mut q, dsm, &mut ranges).status.is_success());
    assert!(
        h.exec(&mut q, rw(0x02, 1, 10, 8), &mut back)
            .status
            .is_success()
    );
    assert!(back[..512].iter().all(|b| *b == 0));
    assert_eq!(back[1024..3072], pattern[1024..3072]);
    assert!(back[3072..].iter().all(|b| *b == 0));
    // Null namespace: reads zeroes.
    let mut z = vec![1u8; 4096];
    assert!(
        h.exec(&mut q, rw(0x02, 2, 5, 1), &mut z)
            .status
            .is_success()
    );
    assert!(z.iter().all(|b| *b == 0));

    // SMART counts what the host did.
    let mut smart = vec![0u8; 512];
    assert!(
        h.exec(&mut aq, get_log(0x02, 512, 0), &mut smart)
            .status
            .is_success()
    );
    let s = SmartLog::decode(&smart).unwrap();
    assert_eq!(s.host_write_commands, 1);
    assert_eq!(s.host_read_commands, 6);
    assert_eq!(s.data_units_written, 1);
    assert_eq!(s.data_units_read, 1);
    assert!(s.composite_temperature > 0);
    // The error log holds the compare failure.
    let mut errors = vec![0u8; 64];
    assert!(
        h.exec(&mut aq, get_log(0x01, 64, 0), &mut errors)
            .status
            .is_success()
    );
    let e = nvmf_protocol::log::ErrorLogEntry::decode(&errors).unwrap();
    assert_eq!(e.sqid, 1);
    assert_eq!(e.opcode, 0x05);

    // NSID 0 asks for the controller's log too; a namespace's NSID is Invalid Field (no
    // per-namespace SMART: LPA bit 0 clear), for an active namespace as for any other.
    let mut by_zero = vec![0u8; 512];
    let mut zero = get_log(0x02, 512, 0);
    zero.nsid = 0;
    assert!(h.exec(&mut aq, zero, &mut by_zero).status.is_success());
    assert!(by_zero == smart);
    for nsid in [1, 2, 9] {
        let mut per_ns = get_log(0x02, 512, 0);
        per_ns.nsid = nsid;
        assert_eq!(
            generic(&h.exec(&mut aq, per_ns, &mut vec![0u8; 512])),
            Some(GenericStatus::InvalidField),
            "SMART for NSID {nsid}"
        );
    }

    // Disconnect of the I/O queue; shutdown of the controller.
    let disc = Sqe::new_fabrics(nvmf_protocol::FabricsType::Disconnect, 0);
    assert!(h.exec(&mut q, disc, &mut []).status.is_success());
    assert!(q.should_disconnect());
    // The transport drops it; only then is it gone from the controller.
    drop(q);
    let cc = Cc {
        shn: ShutdownNotification::Normal,
        ..Cc::enabled_nvm()
    };
    assert!(h.set_cc(&mut aq, cc).status.is_success());
    assert_eq!(
        Csts::from_u32(h.prop_get(&mut aq, PropertyOffset::Csts).dw0).shst,
        ShutdownStatus::Complete
    );
}

/// qid, sqsize, cntlid, subnqn, hostnqn, expected status, expected IPO.
type ConnectCase = (
    u16,
    u16,
    u16,
    &'static str,
    &'static str,
    FabricsStatus,
    Option<ConnectInvalidParameter>,
);

#[test]
fn connect_errors_carry_status_and_ipo() {
    let mut h = Host::new(target(false));
    let (_aq, cntlid) = h.admin();
    let cases: Vec<ConnectCase> = vec![
        (
            0,
            31,
            CNTLID_DYNAMIC,
            "nqn.2016-06.io.nvmf-rs:nope",
            HOST,
            FabricsStatus::InvalidParameters,
            Some(ConnectInvalidParameter::SUBNQN),
        ),
        (
            0,
            31,
            CNTLID_DYNAMIC,
            SUBNQN,
            OTHER_HOST,
            FabricsStatus::InvalidHost,
            None,
        ),
        (
            0,
            0,
            CNTLID_DYNAMIC,
            SUBNQN,
            HOST,
            FabricsStatus::InvalidParameters,
            Some(ConnectInvalidParameter::SQSIZE),
        ),
        (
            0,
            128,
            CNTLID_DYNAMIC,
            SUBNQN,
            HOST,
            FabricsStatus::InvalidParameters,
            Some(ConnectInvalidParameter::SQSIZE),
        ),
        (
            0,
            31,
            3,
            SUBNQN,
            HOST,
            FabricsStatus::InvalidParameters,
            Some(ConnectInvalidParameter::CNTLID),
        ),
        (
            1,
            127,
            0x4321,
            SUBNQN,
            HOST,
            FabricsStatus::InvalidParameters,
            Some(ConnectInvalidParameter::CNTLID),
        ),
        (
            1,
            128,
            cntlid,
            SUBNQN,
            HOST,
            FabricsStatus::InvalidParameters,
            Some(ConnectInvalidParameter::SQSIZE),
        ),
        (
            65,
            127,
            cntlid,
            SUBNQN,
            HOST,
            FabricsStatus::InvalidParameters,
            Some(ConnectInvalidParameter::QID),
        ),
        (
            1,
            127,
            cntlid,
            nvmf_protocol::DISCOVERY_NQN,
            HOST,
            FabricsStatus::InvalidParameters,
            Some(ConnectInvalidParameter::QID),
        ),
    ];
    for (i, (qid, sqsize, cid, sub, host, want, ipo)) in cases.into_iter().enumerate() {
        let mut q = h.queue();
        let c = h.connect(&mut q, qid, sqsize, cid, sub, host);
        assert_eq!(fabrics_status(&c), want, "case {i}");
        assert!(c.status.dnr, "case {i}");
        if let Some(p) = ipo {
            assert_eq!(ConnectInvalidParameter::from_dw0(c.dw0), p, "case {i}");
        }
        assert!(matches!(q.state(), QueueState::Unbound), "case {i}");
    }
    // A controller id owned by another host (same NQN, other HOSTID).
    let mut q = h.queue();
    let cmd = ConnectCmd {
        cid: 0,
        recfmt: 0,
        qid: 1,
        sqsize: 31,
        cattr: 0,
        kato: 0,
        sgl: SglDescriptor::NULL,
    };
    let mut data = ConnectData {
        hostid: [9; 16],
        cntlid,
        subnqn: FixedStr::new(SUBNQN, "s").unwrap(),
        hostnqn: FixedStr::new(HOST, "h").unwrap(),
    }
    .to_bytes();
    let c = h.exec(&mut q, cmd.to_sqe(), &mut data);
    assert_eq!(fabrics_status(&c), FabricsStatus::InvalidParameters);
    // RECFMT other than 0.
    let mut bad = cmd.to_sqe();
    bad.cdw10 |= 1;
    assert_eq!(
        fabrics_status(&h.exec(&mut q, bad, &mut data)),
        FabricsStatus::IncompatibleFormat
    );
    // Connect data too short.
    assert_eq!(
        generic(&h.exec(&mut q, cmd.to_sqe(), &mut [0u8; 100])),
        Some(GenericStatus::DataSglLengthInvalid)
    );
    // Anything but Connect first.
    assert_eq!(
        generic(&h.exec(&mut q, admin_cmd(0x06, 0, 1, 0), &mut [0u8; 4096])),
        Some(GenericStatus::CommandSequenceError)
    );
}

#[test]
fn io_connect_before_enable_and_admin_before_ready() {
    let mut h = Host::new(target(true));
    let mut aq = h.queue();
    let c = h.connect(&mut aq, 0, 31, CNTLID_DYNAMIC, SUBNQN, HOST);
    let cntlid = c.dw0 as u16;
    assert_eq!(
        generic(&h.exec(&mut aq, admin_cmd(0x06, 0, 1, 0), &mut [0u8; 4096])),
        Some(GenericStatus::CommandSequenceError)
    );
    let mut q = h.queue();
    assert_eq!(
        generic(&h.connect(&mut q, 1, 31, cntlid, SUBNQN, HOST)),
        Some(GenericStatus::CommandSequenceError)
    );
    // Bad entry sizes: fatal status instead of ready.
    let cc = Cc {
        en: true,
        iosqes: 5,
        iocqes: 4,
        ..Cc::default()
    };
    h.set_cc(&mut aq, cc);
    let csts = Csts::from_u32(h.prop_get(&mut aq, PropertyOffset::Csts).dw0);
    assert!(csts.cfs && !csts.rdy);
    // A page size, arbitration or command set CAP does not offer: the same.
    let good = Cc::enabled_nvm();
    for bad in [
        Cc { mps: 1, ..good },
        Cc { ams: 1, ..good },
        Cc { css: 1, ..good },
    ] {
        let off = Cc { en: false, ..good };
        h.set_cc(&mut aq, off);
        h.set_cc(&mut aq, bad);
        let csts = Csts::from_u32(h.prop_get(&mut aq, PropertyOffset::Csts).dw0);
        assert!(csts.cfs && !csts.rdy, "{bad:?}");
    }
    // Read-only and unknown properties, wrong size.
    assert_eq!(
        generic(&h.prop_set(&mut aq, PropertyOffset::Csts, 1)),
        Some(GenericStatus::InvalidField)
    );
    assert_eq!(
        generic(&h.prop_get(&mut aq, PropertyOffset::Unknown(0x40))),
        Some(GenericStatus::InvalidField)
    );
    let wrong = PropertyGetCmd {
        cid: 0,
        size: PropertySize::Four,
        offset: PropertyOffset::Cap,
    }
    .to_sqe();
    assert_eq!(
        generic(&h.exec(&mut aq, wrong, &mut [])),
        Some(GenericStatus::InvalidField)
    );
}

#[test]
fn admin_error_paths() {
    let mut h = Host::new(target(true));
    let (mut aq, _) = h.admin();
    let mut page = vec![0u8; 4096];
    for op in [0x01u8, 0x05, 0x80, 0x7C, 0xC0] {
        let c = h.exec(&mut aq, admin_cmd(op, 0, 0, 0), &mut page);
        assert_eq!(
            generic(&c),
            Some(GenericStatus::InvalidOpcode),
            "opcode {op:#x}"
        );
        assert!(c.status.dnr);
    }
    assert_eq!(
        generic(&h.exec(&mut aq, admin_cmd(0x06, 0, 0x1F, 0), &mut page)),
        Some(GenericStatus::InvalidField)
    );
    assert_eq!(
        generic(&h.exec(&mut aq, admin_cmd(0x06, 0, 1, 0), &mut page[..100])),
        Some(GenericStatus::DataSglLengthInvalid)
    );
    assert_eq!(
        generic(&h.exec(&mut aq, admin_cmd(0x09, 0, 0x02, 1), &mut [])),
        Some(GenericStatus::InvalidField)
    );
    assert_eq!(
        generic(&h.exec(&mut aq, admin_cmd(0x09, 0, 0x07, 0xFFFF), &mut [])),
        Some(GenericStatus::InvalidField)
    );
    assert_eq!(
        generic(&h.exec(&mut aq, admin_cmd(0x09, 0, 0x04, 0), &mut [])),
        Some(GenericStatus::InvalidField)
    );
    assert_eq!(
        h.exec(&mut aq, admin_cmd(0x09, 0, 0x07 | (1 << 31), 0), &mut [])
            .status
            .code,
        StatusCode::CommandSpecific(CommandSpecificStatus::FeatureNotSaveable)
    );
    assert_eq!(
        h.exec(&mut aq, get_log(0x05, 512, 0), &mut page[..512])
            .status
            .code,
        StatusCode::CommandSpecific(CommandSpecificStatus::InvalidLogPage)
    );
    assert_eq!(
        generic(&h.exec(&mut aq, get_log(0x02, 512, 2), &mut page[..512])),
        Some(GenericStatus::InvalidField)
    );
    assert_eq!(
        generic(&h.exec(&mut aq, get_log(0x02, 512, 1024), &mut page[..512])),
        Some(GenericStatus::InvalidField)
    );
    // Set Features of an unknown feature asked to be saved: the feature is what is wrong.
    assert_eq!(
        generic(&h.exec(&mut aq, admin_cmd(0x09, 0, 0x7E | (1 << 31), 0), &mut [])),
        Some(GenericStatus::InvalidField)
    );
    // Get Features SEL: saved (nothing is saveable) is the default; 4..7 are reserved.
    assert!(
        h.exec(&mut aq, admin_cmd(0x09, 0, 0x0F, 5000), &mut [])
            .status
            .is_success()
    );
    assert_eq!(
        h.exec(&mut aq, admin_cmd(0x0A, 0, 0x0F, 0), &mut []).dw0,
        5000
    );
    for (sel, want) in [(1u32, Some(0)), (2, Some(0)), (4, None), (7, None)] {
        let c = h.exec(&mut aq, admin_cmd(0x0A, 0, 0x0F | (sel << 8), 0), &mut []);
        match want {
            Some(v) => assert_eq!((c.status.is_success(), c.dw0), (true, v), "sel {sel}"),
            None => assert_eq!(generic(&c), Some(GenericStatus::InvalidField), "sel {sel}"),
        }
    }
    // Property Get on an I/O queue.
    let cntlid = aq.controller().unwrap().cntlid;
    let mut q = h.io_queue(1, cntlid);
    assert_eq!(
        fabrics_status(&h.prop_get(&mut q, PropertyOffset::Vs)),
        FabricsStatus::InvalidQueueType
    );
}

#[test]
fn nvm_error_paths() {
    let mut h = Host::new(target(true));
    let (_aq, cntlid) = h.admin();
    let mut q = h.io_queue(1, cntlid);
    let mut data = vec![0u8; 256 * 1024];
    let cases = [
        (rw(0x02, 3, 0, 1), GenericStatus::InvalidNamespaceOrFormat),
        (rw(0x02, 0, 0, 1), GenericStatus::InvalidNamespaceOrFormat),
        (
            rw(0x00, 0xFFFF_FFFF, 0, 1),
            GenericStatus::InvalidNamespaceOrFormat,
        ),
        (rw(0x02, 1, 2047, 2), GenericStatus::LbaOutOfRange),
        (rw(0x01, 1, 2048, 1), GenericStatus::LbaOutOfRange),
        (rw(0x02, 1, u64::MAX, 1), GenericStatus::LbaOutOfRange),
        (rw(0x08, 1, 2040, 16), GenericStatus::LbaOutOfRange),
        // 257 blocks of 512 B > 128 KiB MDTS.
        (rw(0x02, 1, 0, 257), GenericStatus::InvalidField),
        (rw(0x0C, 1, 0, 1), GenericStatus::InvalidOpcode),
        (rw(0x04, 1, 0, 1), GenericStatus::InvalidOpcode),
    ];
    for (i, (sqe, want)) in cases.into_iter().enumerate() {
        let c = h.exec(&mut q, sqe, &mut data);
        assert_eq!(generic(&c), Some(want), "case {i}");
        assert!(c.status.dnr, "case {i}");
    }
    assert_eq!(
        generic(&h.exec(&mut q, rw(0x01, 1, 0, 8), &mut data[..1000])),
        Some(GenericStatus::DataSglLengthInvalid)
    );
    let mut dsm = Sqe::new(0x09, 0, 1);
    dsm.cdw11 = 1 << 2;
    let mut r = [0u8; 16];
    DsmRange {
        context_attributes: 0,
        length: 4,
        slba: 2046,
    }
    .encode_into(&mut r)
    .unwrap();
    assert_eq!(
        generic(&h.exec(&mut q, dsm, &mut r)),
        Some(GenericStatus::LbaOutOfRange)
    );
    assert_eq!(
        generic(&h.exec(&mut q, dsm, &mut r[..8])),
        Some(GenericStatus::DataSglLengthInvalid)
    );
    // A second Connect on a bound queue.
    assert_eq!(
        generic(&h.connect(&mut q, 1, 127, cntlid, SUBNQN, HOST)),
        Some(GenericStatus::CommandSequenceError)
    );
}

#[test]
fn async_event_on_namespace_change() {
    let mut h = Host::new(target(true));
    let (mut aq, _) = h.admin();
    // Enable namespace attribute notices.
    assert!(
        h.exec(&mut aq, admin_cmd(0x09, 0, 0x0B, 1 << 8), &mut [])
            .status
            .is_success()
    );
    let mut aer = Sqe::new(0x0C, 77, 0);
    let mut none: [&mut [u8]; 0] = [];
    let mut buf = IoBuf::new(&mut none);
    assert_eq!(
        aq.execute(&mut h.io, &aer, &mut buf, 4242, || h.now),
        Exec::Pending
    );
    assert_eq!(
        aq.poll_events(&mut h.io, &mut |_, _| panic!("no event yet")),
        0
    );
    h.target.add_namespace(SUBNQN, 5, "spare").unwrap();
    let mut got = vec![];
    assert_eq!(
        aq.poll_events(&mut h.io, &mut |tag, c| got.push((tag, c))),
        1
    );
    assert_eq!(got[0].0, 4242);
    assert_eq!(got[0].1.cid, 77);
    let ev = nvmf_protocol::admin::AsyncEvent::from_dw0(got[0].1.dw0);
    assert_eq!(ev.event_type, nvmf_protocol::admin::AsyncEventType::Notice);
    assert_eq!(ev.log_page, 0x04);
    let mut page = vec![0u8; 4096];
    // A read refused for its offset (past the page) reads nothing: the list stays.
    assert_eq!(
        generic(&h.exec(&mut aq, get_log(0x04, 4, 4100), &mut [0u8; 4])),
        Some(GenericStatus::InvalidField)
    );
    assert!(
        h.exec(&mut aq, get_log(0x04, 4096, 0), &mut page)
            .status
            .is_success()
    );
    assert_eq!(NsList::decode(&page).unwrap().as_slice(), &[5]);
    // Read clears it.
    assert!(
        h.exec(&mut aq, get_log(0x04, 4096, 0), &mut page)
            .status
            .is_success()
    );
    assert!(NsList::decode(&page).unwrap().as_slice().is_empty());
    // The new namespace is visible to I/O.
    let cntlid = aq.controller().unwrap().cntlid;
    let mut q = h.io_queue(1, cntlid);
    let mut d = vec![3u8; 512];
    assert!(
        h.exec(&mut q, rw(0x01, 5, 0, 1), &mut d)
            .status
            .is_success()
    );
    h.target.remove_namespace(SUBNQN, 5).unwrap();
    assert_eq!(
        generic(&h.exec(&mut q, rw(0x02, 5, 0, 1), &mut d)),
        Some(GenericStatus::InvalidNamespaceOrFormat)
    );
    // Reading log 0x04 re-armed the notice, so the removal's event waits and the next AER
    // completes at once with it.
    aer.cid = 99;
    match aq.execute(&mut h.io, &aer, &mut buf, 1, || h.now) {
        Exec::Done(c) => assert_eq!(
            nvmf_protocol::admin::AsyncEvent::from_dw0(c.dw0).log_page,
            0x04
        ),
        Exec::Pending => panic!("queued event not delivered"),
    }
    // AERL + 1 outstanding at most.
    for i in 0..=AERL {
        aer.cid = 100 + u16::from(i);
        assert_eq!(
            aq.execute(&mut h.io, &aer, &mut buf, 1, || h.now),
            Exec::Pending,
            "aer {i}"
        );
    }
    aer.cid = 200;
    match aq.execute(&mut h.io, &aer, &mut buf, 1, || h.now) {
        Exec::Done(c) => assert_eq!(
            c.status.code,
            StatusCode::CommandSpecific(CommandSpecificStatus::AsyncEventRequestLimitExceeded)
        ),
        Exec::Pending => panic!("limit not enforced"),
    }
}

#[test]
fn keep_alive_expiry_tears_the_controller_down() {
    let mut h = Host::new(target(true));
    let (mut aq, cntlid) = h.admin();
    let q = h.io_queue(1, cntlid);
    let t0 = h.now;
    assert!(
        h.target
            .reap_expired(t0 + Duration::from_millis(14_000))
            .is_empty()
    );
    h.now = t0 + Duration::from_millis(14_000);
    assert!(
        h.exec(&mut aq, admin_cmd(0x18, 0, 0, 0), &mut [])
            .status
            .is_success()
    );
    assert!(
        h.target
            .reap_expired(t0 + Duration::from_millis(28_000))
            .is_empty()
    );
    assert!(!q.should_disconnect());
    assert_eq!(
        h.target.reap_expired(t0 + Duration::from_millis(29_001)),
        vec![cntlid]
    );
    assert!(q.should_disconnect() && aq.should_disconnect());
    assert!(h.target.controller(cntlid).is_none());
    // Its id is free: an I/O connect to it fails.
    let mut q2 = h.queue();
    assert_eq!(
        fabrics_status(&h.connect(&mut q2, 2, 31, cntlid, SUBNQN, HOST)),
        FabricsStatus::InvalidParameters
    );
}

/// Once the controller is torn down, a command still reaching one of its I/O queues (before
/// the transport has disconnected that qpair) is answered Aborted - SQ Deletion and not
/// executed: the write leaves the blocks as they were.
#[test]
fn a_torn_down_controller_executes_nothing_more() {
    for teardown in ["keep-alive expiry", "admin queue disconnect"] {
        let mut h = Host::new(target(true));
        let (mut aq, cntlid) = h.admin();
        let mut q = h.io_queue(1, cntlid);
        match teardown {
            "keep-alive expiry" => {
                let late = h.now + Duration::from_secs(60);
                assert_eq!(h.target.reap_expired(late), vec![cntlid]);
            }
            _ => {
                let disconnect = Sqe::new_fabrics(nvmf_protocol::FabricsType::Disconnect, 0);
                assert!(h.exec(&mut aq, disconnect, &mut []).status.is_success());
            }
        }
        let mut data = vec![0x77u8; 512];
        let c = h.exec(&mut q, rw(0x01, 1, 0, 1), &mut data);
        assert_eq!(
            generic(&c),
            Some(GenericStatus::AbortedSqDeletion),
            "{teardown}"
        );
        let c = h.exec(&mut q, rw(0x02, 1, 0, 1), &mut data);
        assert_eq!(
            generic(&c),
            Some(GenericStatus::AbortedSqDeletion),
            "{teardown}"
        );
        // The blocks, through a new association: untouched.
        let (_admin, cntlid) = h.admin();
        let mut q = h.io_queue(1, cntlid);
        let mut back = vec![0xFFu8; 512];
        assert!(
            h.exec(&mut q, rw(0x02, 1, 0, 1), &mut back)
                .status
                .is_success()
        );
        assert_eq!(back, [0u8; 512], "{teardown}");
    }
}

#[test]
fn admin_disconnect_frees_the_controller() {
    let mut h = Host::new(target(true));
    let (aq, cntlid) = h.admin();
    let q = h.io_queue(1, cntlid);
    drop(aq);
    assert!(h.target.controller(cntlid).is_none());
    assert!(q.should_disconnect());
}

#[test]
fn discovery_lists_what_the_host_may_see() {
    let mut t = Target::new(Limits::default(), vec![listener()]);
    for (nqn, any, hosts) in [
        ("nqn.2016-06.io.nvmf-rs:open", true, vec![]),
        (
            "nqn.2016-06.io.nvmf-rs:closed",
            false,
            vec![OTHER_HOST.to_owned()],
        ),
    ] {
        t.add_subsystem(Arc::new(Subsystem::new(
            nqn,
            "S",
            "M",
            any,
            hosts,
            4,
            vec![listener()],
        )));
    }
    let mut h = Host::new(Arc::new(t));
    let mut q = h.discovery();
    let mut page = vec![0u8; 4096];
    assert!(
        h.exec(&mut q, admin_cmd(0x06, 0, 1, 0), &mut page)
            .status
            .is_success()
    );
    let id = IdentifyController::decode(&page).unwrap();
    assert_eq!(id.subnqn.as_str(), nvmf_protocol::DISCOVERY_NQN);
    assert_eq!(id.cntrltype, 2);
    assert!(
        h.exec(&mut q, admin_cmd(0x18, 0, 0, 0), &mut [])
            .status
            .is_success()
    );
    assert_eq!(
        generic(&h.exec(&mut q, rw(0x08, 0, 0, 1), &mut [])),
        Some(GenericStatus::InvalidOpcode)
    );
    let mut log = vec![0u8; 3072];
    assert!(
        h.exec(&mut q, get_log(0x70, 3072, 0), &mut log)
            .status
            .is_success()
    );
    let d = DiscoveryLog::decode(&log[..2048]).unwrap();
    assert_eq!(d.entries.len(), 1);
    let e = &d.entries[0];
    assert_eq!(e.subnqn.as_str(), "nqn.2016-06.io.nvmf-rs:open");
    assert_eq!(e.traddr.as_str(), "127.0.0.1");
    assert_eq!(e.trsvcid.as_str(), "4420");
    assert_eq!(e.trtype, nvmf_protocol::log::TransportType::Rdma);
    assert!(
        matches!(e.tsas, nvmf_protocol::log::Tsas::Rdma(r) if r.prtype == nvmf_protocol::log::RdmaProviderType::NotSpecified)
    );
    // Partial read at an offset: the entry only.
    let mut part = vec![0u8; 1024];
    assert!(
        h.exec(&mut q, get_log(0x70, 1024, 1024), &mut part)
            .status
            .is_success()
    );
    assert_eq!(part, log[1024..2048]);
}

/// A target whose namespace 1 is a file (a volatile cache: a shutdown flushes it) in a new
/// directory under build/, kept as long as the directory.
fn file_target() -> (Arc<Target>, tempfile::TempDir) {
    let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../build/test-files");
    std::fs::create_dir_all(&base).unwrap();
    let dir = tempfile::tempdir_in(base).unwrap();
    let f = FileBdev::open("f", &dir.path().join("ns"), 4096, Some(1 << 20), true).unwrap();
    (target_with(vec![("f", Arc::new(f))]), dir)
}

#[test]
fn file_namespace_completes_by_polling() {
    let (t, _dir) = file_target();
    let mut h = Host::new(t);
    let (mut aq, cntlid) = h.admin();
    let mut q = h.io_queue(1, cntlid);
    let mut data: Vec<u8> = (0..8192).map(|i| (i % 241) as u8).collect();
    let expect = data.clone();
    let mut segs = [&mut data[..]];
    let mut buf = IoBuf::new(&mut segs);
    let w = rw(0x01, 1, 3, 2);
    assert_eq!(
        q.execute(&mut h.io, &w, &mut buf, 99, || h.now),
        Exec::Pending
    );
    assert_eq!(h.io.in_flight(), 1);
    assert_eq!(q.counters().snapshot().in_flight, 1);
    let mut done = None;
    while done.is_none() {
        h.io.poll(&mut |tag, c| done = Some((tag, c)));
    }
    let (tag, c) = done.unwrap();
    assert_eq!(tag, 99);
    assert!(c.status.is_success());
    assert_eq!(c.sqid, 1);
    assert!(
        h.exec(&mut q, rw(0x00, 1, 0, 1), &mut [])
            .status
            .is_success()
    );
    let mut back = vec![0u8; 8192];
    assert!(
        h.exec(&mut q, rw(0x02, 1, 3, 2), &mut back)
            .status
            .is_success()
    );
    assert_eq!(back, expect);
    assert!(
        h.exec(&mut q, rw(0x08, 1, 3, 1), &mut [])
            .status
            .is_success()
    );
    assert!(
        h.exec(&mut q, rw(0x02, 1, 3, 1), &mut back[..4096])
            .status
            .is_success()
    );
    assert!(back[..4096].iter().all(|b| *b == 0));
    // FUA: a flag, not part of NLB; durable at completion (RWF_DSYNC on the file device).
    let mut fua = rw(0x01, 1, 6, 1);
    fua.cdw12 |= 1 << 30;
    let mut d = vec![0x5Au8; 4096];
    assert!(h.exec(&mut q, fua, &mut d).status.is_success());
    assert!(
        h.exec(&mut q, rw(0x02, 1, 6, 1), &mut back[..4096])
            .status
            .is_success()
    );
    assert!(back[..4096].iter().all(|b| *b == 0x5A));
    assert_eq!(h.io.counters().snapshot().writes, 2);
    assert_eq!(q.counters().snapshot().in_flight, 0);
    // The I/O queue goes first, as Linux tears it down; then the shutdown flushes the file
    // (volatile cache) at once: Occurring until the flush is reaped.
    drop(q);
    let cc = Cc {
        shn: ShutdownNotification::Normal,
        ..Cc::enabled_nvm()
    };
    assert!(h.set_cc(&mut aq, cc).status.is_success());
    assert_eq!(
        Csts::from_u32(h.prop_get(&mut aq, PropertyOffset::Csts).dw0).shst,
        ShutdownStatus::Occurring
    );
    assert_eq!(h.io.in_flight(), 1);
    while h.io.in_flight() > 0 {
        h.io.poll(&mut |_, c| panic!("a shutdown flush surfaced as a CQE: {c:?}"));
    }
    assert_eq!(
        Csts::from_u32(h.prop_get(&mut aq, PropertyOffset::Csts).dw0).shst,
        ShutdownStatus::Complete
    );
}

/// A shutdown notified with an I/O queue still connected (Linux tears its down first; another
/// host may not): the queue goes and executes nothing more, no I/O queue connects and only
/// Fabrics commands run on the admin queue; the flush starts once the queue has closed (so it
/// covers every write the queue completed), and a second notification meanwhile joins it.
#[test]
fn shutdown_ends_the_io_queues_then_flushes() {
    let (t, _dir) = file_target();
    let mut h = Host::new(t);
    let (mut aq, cntlid) = h.admin();
    let mut q = h.io_queue(1, cntlid);
    let mut block = vec![7u8; 4096];
    assert!(h.succeeds(&mut q, rw(0x01, 1, 0, 1), &mut block));
    let shutdown = normal_shutdown();
    assert!(h.set_cc(&mut aq, shutdown).status.is_success());
    assert_eq!(h.shst(&mut aq), ShutdownStatus::Occurring);
    assert!(q.should_disconnect());
    assert_eq!(
        generic(&h.exec(&mut q, rw(0x01, 1, 0, 1), &mut block)),
        Some(GenericStatus::AbortedSqDeletion)
    );
    let mut q2 = h.queue();
    assert_eq!(
        generic(&h.connect(&mut q2, 2, 127, cntlid, SUBNQN, HOST)),
        Some(GenericStatus::CommandSequenceError)
    );
    assert_eq!(
        generic(&h.exec(&mut aq, admin_cmd(0x0A, 0, 0x06, 0), &mut [])),
        Some(GenericStatus::CommandSequenceError)
    );
    // Nothing flushes while the queue is connected.
    assert_eq!(aq.poll_events(&mut h.io, &mut |_, c| panic!("{c:?}")), 0);
    assert_eq!(h.io.in_flight(), 0);
    // It closes (its in-flight I/O ended): the admin queue's next poll starts the flush.
    drop(q);
    assert_eq!(aq.poll_events(&mut h.io, &mut |_, c| panic!("{c:?}")), 0);
    assert_eq!(h.io.in_flight(), 1);
    // Withdrawn and notified again while the flush runs: no second flush.
    assert!(h.set_cc(&mut aq, Cc::enabled_nvm()).status.is_success());
    assert!(h.set_cc(&mut aq, shutdown).status.is_success());
    assert_eq!(h.io.in_flight(), 1);
    assert_eq!(h.shst(&mut aq), ShutdownStatus::Occurring);
    while h.io.in_flight() > 0 {
        h.io.poll(&mut |_, c| panic!("a shutdown flush surfaced as a CQE: {c:?}"));
    }
    assert_eq!(h.shst(&mut aq), ShutdownStatus::Complete);
}

#[test]
fn data_direction_from_opcode_and_fctype() {
    assert_eq!(
        data_direction(&Sqe::new(0x01, 0, 1)),
        Direction::HostToController
    );
    assert_eq!(
        data_direction(&Sqe::new(0x02, 0, 1)),
        Direction::ControllerToHost
    );
    assert_eq!(
        data_direction(&Sqe::new(0x06, 0, 0)),
        Direction::ControllerToHost
    );
    assert_eq!(data_direction(&Sqe::new(0x08, 0, 1)), Direction::None);
    assert_eq!(
        data_direction(&Sqe::new(0x09, 0, 1)),
        Direction::HostToController
    );
    let connect = Sqe::new_fabrics(nvmf_protocol::FabricsType::Connect, 0);
    assert_eq!(data_direction(&connect), Direction::HostToController);
    let get = Sqe::new_fabrics(nvmf_protocol::FabricsType::PropertyGet, 0);
    assert_eq!(data_direction(&get), Direction::None);
}

mod fuzz {
    use proptest::prelude::*;

    use super::*;

    fn opcode() -> impl Strategy<Value = Option<u8>> {
        prop_oneof![Just(None), (0u8..0x20).prop_map(Some), Just(Some(0x7F))]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// Whatever the network sends, execution answers (or goes pending) and never panics,
        /// on an unbound queue, the admin queue and an I/O queue; CQEs echo the CID.
        #[test]
        fn random_commands_never_panic(
            raw in prop::collection::vec(any::<u8>(), 64),
            data_len in 0usize..9000,
            fill in any::<u8>(),
            op in opcode(),
        ) {
            let mut sqe = Sqe::decode(&raw).unwrap();
            if let Some(op) = op {
                sqe.opcode = op;
            }
            let mut h = Host::new(target(true));
            let (mut aq, cntlid) = h.admin();
            let mut q = h.io_queue(1, cntlid);
            let mut unbound = h.queue();
            for queue in [&mut unbound, &mut aq, &mut q] {
                let mut data = vec![fill; data_len];
                let mut segs = [&mut data[..]];
                let mut buf = IoBuf::new(&mut segs);
                if let Exec::Done(c) = queue.execute(&mut h.io, &sqe, &mut buf, 1, || h.now) {
                    prop_assert_eq!(c.cid, sqe.cid);
                }
                while h.io.in_flight() > 0 {
                    h.io.poll(&mut |_, _| {});
                }
            }
        }
    }
}

/// SGLS bit 18 is not advertised: a host buffer longer (or shorter) than what the command
/// moves is Data SGL Length Invalid, before anything executes. A longer read buffer answered
/// with success would go back whole, its tail as the pool buffer last held it.
#[test]
fn buffers_must_be_exactly_the_transfer() {
    let mut h = Host::new(target(true));
    let (mut aq, cntlid) = h.admin();
    let mut q = h.io_queue(1, cntlid);
    let sgl_length = Some(GenericStatus::DataSglLengthInvalid);
    let mut block = vec![0x5Au8; 512];
    assert!(h.succeeds(&mut q, rw(0x01, 1, 0, 1), &mut block));
    // A read, a write and a compare of one 512 B block with 4 KiB buffers.
    let mut stale = vec![0xAAu8; 4096];
    for opcode in [0x02u8, 0x01, 0x05] {
        let c = h.exec(&mut q, rw(opcode, 1, 0, 1), &mut stale);
        assert_eq!(generic(&c), sgl_length, "opcode {opcode:#x}");
        assert!(c.status.dnr);
    }
    assert!(stale.iter().all(|b| *b == 0xAA));
    let mut back = vec![0u8; 512];
    assert!(h.succeeds(&mut q, rw(0x02, 1, 0, 1), &mut back));
    assert_eq!(back, vec![0x5A; 512], "the refused write changed the block");
    // Flush and Write Zeroes move nothing.
    assert_eq!(
        generic(&h.exec(&mut q, rw(0x00, 1, 0, 1), &mut [0; 8])),
        sgl_length
    );
    assert_eq!(
        generic(&h.exec(&mut q, rw(0x08, 1, 0, 1), &mut [0; 8])),
        sgl_length
    );
    // Admin: Identify is 4 KiB, a log page its NUMD, the rest move nothing.
    let mut big = vec![0u8; 8192];
    assert_eq!(
        generic(&h.exec(&mut aq, admin_cmd(0x06, 0, 1, 0), &mut big)),
        sgl_length
    );
    assert_eq!(
        generic(&h.exec(&mut aq, get_log(0x02, 512, 0), &mut big)),
        sgl_length
    );
    assert_eq!(
        generic(&h.exec(&mut aq, get_log(0x02, 512, 0), &mut big[..508])),
        sgl_length
    );
    for (what, sqe) in [
        ("get features", admin_cmd(0x0A, 0, 0x07, 0)),
        ("set features", admin_cmd(0x09, 0, 0x0F, 5000)),
        ("keep alive", admin_cmd(0x18, 0, 0, 0)),
        ("abort", admin_cmd(0x08, 0, 1, 0)),
        ("async event request", admin_cmd(0x0C, 0, 0, 0)),
    ] {
        assert_eq!(
            generic(&h.exec(&mut aq, sqe, &mut big[..64])),
            sgl_length,
            "{what}"
        );
    }
    // The same with no data succeed (the AER stays outstanding: not sent).
    assert!(h.succeeds(&mut aq, admin_cmd(0x0A, 0, 0x07, 0), &mut []));
    assert!(h.succeeds(&mut aq, get_log(0x02, 512, 0), &mut big[..512]));
    // Fabrics: a Property Get with data; a Connect with more than its 1024 bytes.
    let prop = PropertyGetCmd {
        cid: 0,
        size: PropertySize::Four,
        offset: PropertyOffset::Vs,
    };
    assert_eq!(
        generic(&h.exec(&mut aq, prop.to_sqe(), &mut big[..4])),
        sgl_length
    );
    let connect = ConnectCmd {
        cid: 0,
        recfmt: 0,
        qid: 2,
        sqsize: 31,
        cattr: 0,
        kato: 0,
        sgl: SglDescriptor::keyed(0x1000, 1100, 0x55, true).unwrap(),
    };
    let mut data = ConnectData {
        hostid: HOSTID,
        cntlid,
        subnqn: FixedStr::new(SUBNQN, "SUBNQN").unwrap(),
        hostnqn: FixedStr::new(HOST, "HOSTNQN").unwrap(),
    }
    .to_bytes()
    .to_vec();
    data.resize(1100, 0);
    let mut unbound = h.queue();
    assert_eq!(
        generic(&h.exec(&mut unbound, connect.to_sqe(), &mut data)),
        sgl_length
    );
}

/// Fused operations are not supported (FUSES = 0): either half of a pair is Invalid Field and
/// nothing executes (run apart, the write would land whatever the compare found). So is any
/// PSDT but 01b (SGLs, contiguous metadata), the one fabrics defines.
#[test]
fn fused_commands_and_other_data_pointers_are_refused() {
    let mut h = Host::new(target(true));
    let (mut aq, cntlid) = h.admin();
    let mut q = h.io_queue(1, cntlid);
    let mut block = vec![0x11u8; 512];
    assert!(h.succeeds(&mut q, rw(0x01, 1, 8, 1), &mut block));
    let mut other = vec![0x22u8; 512];
    // FUSE 1, 2 and 3; PSDT 00b (PRPs), 10b and 11b with FUSE 0.
    let cases = [
        (0x05u8, 0x41u8),
        (0x01, 0x42),
        (0x01, 0x43),
        (0x01, 0x00),
        (0x01, 0x80),
        (0x01, 0xC0),
    ];
    for (opcode, flags) in cases {
        let mut sqe = rw(opcode, 1, 8, 1);
        sqe.flags = flags;
        let c = h.exec(&mut q, sqe, &mut other);
        assert_eq!(
            generic(&c),
            Some(GenericStatus::InvalidField),
            "flags {flags:#x}"
        );
        assert!(c.status.dnr);
    }
    let mut back = vec![0u8; 512];
    assert!(h.succeeds(&mut q, rw(0x02, 1, 8, 1), &mut back));
    assert_eq!(back, block);
    let mut identify = admin_cmd(0x06, 0, 1, 0);
    identify.flags |= 1;
    assert_eq!(
        generic(&h.exec(&mut aq, identify, &mut vec![0u8; 4096])),
        Some(GenericStatus::InvalidField)
    );
    // Identify says so.
    let mut page = vec![0u8; 4096];
    assert!(h.succeeds(&mut aq, admin_cmd(0x06, 0, 1, 0), &mut page));
    assert_eq!(IdentifyController::decode(&page).unwrap().fuses, 0);
}

/// Volatile Write Cache off (Set Features 06h): every write asks the device for forced unit
/// access until it is on again.
#[test]
fn write_cache_off_makes_every_write_durable() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let gate = Arc::new(crate::bdev::gate::GateBdev::new(
        "g0",
        1 << 12,
        Arc::new(AtomicBool::new(true)),
    ));
    let fua = gate.fua_writes.clone();
    let t = target_with(vec![("g0", gate)]);
    let mut h = Host::new(t);
    let (mut aq, cntlid) = h.admin();
    let mut q = h.io_queue(1, cntlid);
    let mut block = vec![0u8; 512];
    let mut write = |h: &mut Host, q: &mut Queue, flags: u32| {
        let mut sqe = rw(0x01, 1, 0, 1);
        sqe.cdw12 |= flags;
        assert!(h.succeeds(q, sqe, &mut block));
        fua.load(Ordering::Acquire)
    };
    assert_eq!(write(&mut h, &mut q, 0), 0);
    let vwc = |h: &mut Host, aq: &mut Queue| h.exec(aq, admin_cmd(0x0A, 0, 0x06, 0), &mut []).dw0;
    assert_eq!(vwc(&mut h, &mut aq), 1);
    assert!(h.succeeds(&mut aq, admin_cmd(0x09, 0, 0x06, 0), &mut []));
    assert_eq!(vwc(&mut h, &mut aq), 0);
    assert_eq!(write(&mut h, &mut q, 0), 1);
    assert_eq!(write(&mut h, &mut q, 0), 2);
    assert!(h.succeeds(&mut aq, admin_cmd(0x09, 0, 0x06, 1), &mut []));
    assert_eq!(vwc(&mut h, &mut aq), 1);
    assert_eq!(write(&mut h, &mut q, 0), 2);
    // FUA asked by the host, cache on.
    assert_eq!(write(&mut h, &mut q, 1 << 30), 3);

    // Write Zeroes (with or without DEAC) asks for durability as a write does; Dataset
    // Management's deallocation too while the cache is off.
    let zeroes = |h: &mut Host, q: &mut Queue, flags: u32| {
        let mut sqe = rw(0x08, 1, 0, 1);
        sqe.cdw12 |= flags;
        assert!(h.succeeds(q, sqe, &mut []));
        fua.load(Ordering::Acquire)
    };
    assert_eq!(zeroes(&mut h, &mut q, 0), 3);
    assert_eq!(zeroes(&mut h, &mut q, 1 << 25), 3);
    assert_eq!(zeroes(&mut h, &mut q, 1 << 30), 4);
    assert_eq!(zeroes(&mut h, &mut q, 1 << 30 | 1 << 25), 5);
    let mut ranges = vec![0u8; 16];
    DsmRange {
        context_attributes: 0,
        length: 1,
        slba: 2,
    }
    .encode_into(&mut ranges)
    .unwrap();
    let mut deallocate = |h: &mut Host, q: &mut Queue| {
        let mut dsm = Sqe::new(0x09, 0, 1);
        dsm.cdw11 = 1 << 2;
        assert!(h.succeeds(q, dsm, &mut ranges));
        fua.load(Ordering::Acquire)
    };
    assert_eq!(deallocate(&mut h, &mut q), 5);
    assert!(h.succeeds(&mut aq, admin_cmd(0x09, 0, 0x06, 0), &mut []));
    assert_eq!(zeroes(&mut h, &mut q, 0), 6);
    assert_eq!(zeroes(&mut h, &mut q, 1 << 25), 7);
    assert_eq!(deallocate(&mut h, &mut q), 8);
}

/// The mandatory Firmware Slot Information log: slot 1 active, holding Identify's FR.
#[test]
fn firmware_slot_log() {
    let mut h = Host::new(target(true));
    let (mut aq, _) = h.admin();
    let mut page = vec![0u8; 4096];
    assert!(h.succeeds(&mut aq, admin_cmd(0x06, 0, 1, 0), &mut page));
    let id = IdentifyController::decode(&page).unwrap();
    assert_eq!(id.frmw, 0x03, "one slot, read only");
    let mut log = vec![0xEEu8; 512];
    assert!(h.succeeds(&mut aq, get_log(0x03, 512, 0), &mut log));
    assert_eq!(log[0], 1);
    let fr = id.fr.as_str();
    assert_eq!(std::str::from_utf8(&log[8..16]).unwrap().trim_end(), fr);
    assert!(log[16..].iter().all(|b| *b == 0) && log[1..8].iter().all(|b| *b == 0));
}

/// Once the host has notified a shutdown (CC.SHN) it sends no Keep Alive: the timer stops, so
/// a shutdown flush longer than what was left of KATO does not cost it the controller.
#[test]
fn keep_alive_stops_once_shutdown_is_notified() {
    let mut h = Host::new(target(true));
    let (mut aq, cntlid) = h.admin();
    let t0 = h.now;
    let shutdown = Cc {
        shn: ShutdownNotification::Normal,
        ..Cc::enabled_nvm()
    };
    assert!(h.set_cc(&mut aq, shutdown).status.is_success());
    assert!(
        h.target
            .reap_expired(t0 + Duration::from_secs(60))
            .is_empty()
    );
    assert!(h.target.controller(cntlid).is_some());
}

/// A discovery controller connected with KATO 0 (a non-persistent `nvme discover`) still
/// goes after two minutes without a Keep Alive, as nvmet's and SPDK's: a host that died
/// holding it would otherwise leak it for ever.
#[test]
fn a_discovery_controller_without_kato_goes_after_two_minutes() {
    let mut h = Host::new(target(true));
    let mut q = h.queue();
    let t0 = h.now;
    let c = h.connect_kato(
        &mut q,
        (0, 31, CNTLID_DYNAMIC),
        nvmf_protocol::DISCOVERY_NQN,
        HOST,
        0,
    );
    assert!(c.status.is_success(), "{c:?}");
    let cntlid = c.dw0 as u16;
    assert!(
        h.target
            .reap_expired(t0 + Duration::from_secs(119))
            .is_empty()
    );
    assert_eq!(
        h.target.reap_expired(t0 + Duration::from_secs(121)),
        vec![cntlid]
    );
    // An I/O controller with KATO 0 never expires.
    let mut q = h.queue();
    let c = h.connect_kato(&mut q, (0, 31, CNTLID_DYNAMIC), SUBNQN, HOST, 0);
    assert!(c.status.is_success(), "{c:?}");
    assert!(
        h.target
            .reap_expired(t0 + Duration::from_secs(100_000))
            .is_empty()
    );
}

/// A host connecting and closing I/O queues in a loop: the controller keeps the counters of its
/// open queues only, and its totals (SMART) still count what the closed ones did.
#[test]
fn closed_queues_leave_their_counts_not_their_counters() {
    let mut h = Host::new(target(true));
    let (aq, cntlid) = h.admin();
    let mut block = vec![9u8; 512];
    for lba in 0..50 {
        let mut q = h.io_queue(1, cntlid);
        assert!(h.succeeds(&mut q, rw(0x01, 1, lba, 1), &mut block));
        drop(q);
    }
    let c = aq.controller().unwrap();
    assert_eq!(c.state().counters.len(), 1, "the admin queue's only");
    let totals = c.io_totals();
    assert_eq!(
        (totals.writes, totals.bytes_written, totals.in_flight),
        (50, 50 * 512, 0)
    );
}

/// A controller reset drops the events queued for AERs and re-arms the namespace notice they
/// held back: the next namespace change is reported (it waited for a log 04h read that the
/// reset made moot).
#[test]
fn a_controller_reset_rearms_the_namespace_notice() {
    let mut h = Host::new(target(true));
    let (mut aq, _) = h.admin();
    let notices = admin_cmd(0x09, 0, 0x0B, 1 << 8);
    assert!(h.succeeds(&mut aq, notices, &mut []));
    let mut none: [&mut [u8]; 0] = [];
    let mut buf = IoBuf::new(&mut none);
    let aer = Sqe::new(0x0C, 77, 0);
    assert_eq!(
        aq.execute(&mut h.io, &aer, &mut buf, 1, || h.now),
        Exec::Pending
    );
    h.target.add_namespace(SUBNQN, 5, "spare").unwrap();
    assert_eq!(aq.poll_events(&mut h.io, &mut |_, _| {}), 1);
    // Reset: CC.EN 1 -> 0 -> 1 (no I/O queue, so ready again at once).
    for en in [false, true] {
        let cc = Cc {
            en,
            ..Cc::enabled_nvm()
        };
        h.set_cc(&mut aq, cc);
    }
    assert!(Csts::from_u32(h.prop_get(&mut aq, PropertyOffset::Csts).dw0).rdy);
    let aer = Sqe::new(0x0C, 78, 0);
    assert_eq!(
        aq.execute(&mut h.io, &aer, &mut buf, 2, || h.now),
        Exec::Pending
    );
    h.target.remove_namespace(SUBNQN, 5).unwrap();
    let mut got = vec![];
    assert_eq!(
        aq.poll_events(&mut h.io, &mut |tag, c| got.push((tag, c.cid))),
        1
    );
    assert_eq!(got, vec![(2, 78)]);
}

/// A gated namespace and an I/O queue holding a write at the gate (CID 500, tag 77), then a
/// Fabrics Disconnect on that queue: (host, admin queue, CNTLID, the I/O queue).
fn disconnected_with_a_write_held(open: Arc<AtomicBool>) -> (Host, Queue, u16, Queue) {
    let gate = Arc::new(crate::bdev::gate::GateBdev::new("g0", 1 << 12, open));
    let mut h = Host::new(target_with(vec![("g0", gate)]));
    let (aq, cntlid) = h.admin();
    let mut q = h.io_queue(1, cntlid);
    let mut block = vec![3u8; 512];
    let mut segments = [&mut block[..]];
    let mut buf = IoBuf::new(&mut segments);
    let mut write = rw(0x01, 1, 0, 1);
    write.cid = 500;
    assert_eq!(
        q.execute(&mut h.io, &write, &mut buf, 77, || h.now),
        Exec::Pending
    );
    let disconnect = Sqe::new_fabrics(nvmf_protocol::FabricsType::Disconnect, 0);
    assert!(h.succeeds(&mut q, disconnect, &mut []));
    (h, aq, cntlid, q)
}

/// A Disconnect on an I/O queue with a write in flight: the queue executes nothing more, and
/// its QID stays taken until the transport drops it (its I/O ended); a new queue of that QID
/// could otherwise run beside the old one's late write.
#[test]
fn a_disconnected_io_queue_keeps_its_qid_until_dropped() {
    use std::sync::atomic::Ordering;
    let open = Arc::new(AtomicBool::new(false));
    let (mut h, _aq, cntlid, mut q) = disconnected_with_a_write_held(open.clone());
    assert!(q.should_disconnect());
    assert_eq!(
        generic(&h.exec(&mut q, rw(0x02, 1, 0, 1), &mut [0u8; 512])),
        Some(GenericStatus::CommandSequenceError)
    );
    let mut again = h.queue();
    let c = h.connect(&mut again, 1, 127, cntlid, SUBNQN, HOST);
    assert_eq!(fabrics_status(&c), FabricsStatus::InvalidParameters);
    open.store(true, Ordering::Release);
    let mut answered = None;
    while answered.is_none() {
        h.io.poll(&mut |tag, cqe| answered = Some((tag, cqe.status.is_success())));
    }
    assert_eq!(answered, Some((77, true)));
    drop(q);
    let c = h.connect(&mut again, 1, 127, cntlid, SUBNQN, HOST);
    assert!(c.status.is_success(), "{c:?}");
}

/// CC.EN 1 -> 0 -> 1 while an I/O queue of before the reset is still closing: the host may
/// connect that QID again (and set the number of queues) at once, and the old queue closing
/// later frees only its own entry.
#[test]
fn a_reset_queue_still_closing_does_not_hold_its_qid() {
    let mut h = Host::new(target(true));
    let (mut aq, cntlid) = h.admin();
    let old = h.io_queue(1, cntlid);
    assert!(h.set_cc(&mut aq, Cc::default()).status.is_success());
    assert!(old.should_disconnect());
    assert!(h.set_cc(&mut aq, Cc::enabled_nvm()).status.is_success());
    // Number of Queues: 2 (0's based 1).
    assert!(h.succeeds(&mut aq, admin_cmd(0x09, 0, 0x07, 0x0001_0001), &mut []));
    let mut new = h.io_queue(1, cntlid);
    drop(old);
    let mut twin = h.queue();
    let c = h.connect(&mut twin, 1, 127, cntlid, SUBNQN, HOST);
    assert_eq!(fabrics_status(&c), FabricsStatus::InvalidParameters);
    assert!(h.succeeds(&mut new, rw(0x02, 1, 0, 1), &mut [0u8; 512]));
}

/// KAS states the keep-alive sweep's 500 ms, and KATO (Connect's, Set Features') is rounded up
/// to a multiple of it, as Get Features then reports.
#[test]
fn kato_is_rounded_up_to_the_stated_granularity() {
    let mut h = Host::new(target(true));
    let mut aq = h.queue();
    let c = h.connect_kato(&mut aq, (0, 31, CNTLID_DYNAMIC), SUBNQN, HOST, 1_200);
    assert!(c.status.is_success(), "{c:?}");
    assert!(h.set_cc(&mut aq, Cc::enabled_nvm()).status.is_success());
    let kato = |h: &mut Host, aq: &mut Queue| h.exec(aq, admin_cmd(0x0A, 0, 0x0F, 0), &mut []).dw0;
    assert_eq!(kato(&mut h, &mut aq), 1_500);
    for (asked, applied) in [(2_001, 2_500), (3_000, 3_000), (0, 0), (1, 500)] {
        assert!(h.succeeds(&mut aq, admin_cmd(0x09, 0, 0x0F, asked), &mut []));
        assert_eq!(kato(&mut h, &mut aq), applied, "asked {asked}");
    }
}

/// At most ACL + 1 Abort commands wait for their victims' queues; one more is Abort Command
/// Limit Exceeded, and room comes back as they are answered.
#[test]
fn aborts_beyond_the_stated_limit_are_refused() {
    let mut h = Host::new(target(true));
    let (mut aq, cntlid) = h.admin();
    let q = h.io_queue(1, cntlid);
    let mut none: [&mut [u8]; 0] = [];
    let mut abort = |h: &mut Host, aq: &mut Queue, cid: u16| {
        let mut sqe = admin_cmd(0x08, 0, 1 | (u32::from(cid) << 16), 0);
        sqe.cid = 900 + cid;
        let mut buf = IoBuf::new(&mut none);
        aq.execute(&mut h.io, &sqe, &mut buf, 5000 + u64::from(cid), || h.now)
    };
    for victim in 0..=u16::from(crate::nvme::controller::ACL) {
        assert_eq!(abort(&mut h, &mut aq, victim), Exec::Pending);
    }
    match abort(&mut h, &mut aq, 50) {
        Exec::Done(cqe) => assert_eq!(
            cqe.status,
            crate::nvme::status::ABORT_LIMIT_EXCEEDED,
            "{cqe:?}"
        ),
        Exec::Pending => panic!("a fifth Abort waits too"),
    }
    // The victims' queue declines them all (none is waiting there).
    let mut asked = vec![];
    q.take_aborts(&mut |_, abort_cid| asked.push(abort_cid));
    assert_eq!(asked.len(), usize::from(crate::nvme::controller::ACL) + 1);
    for abort_cid in asked {
        q.answer_abort(abort_cid, false);
    }
    let mut answered = 0;
    aq.poll_events(&mut h.io, &mut |_, cqe| {
        assert_eq!(cqe.dw0 & 1, 1, "not aborted");
        answered += 1;
    });
    assert_eq!(answered, 4);
    assert_eq!(abort(&mut h, &mut aq, 60), Exec::Pending);
}

/// Get Features Host Identifier returns Connect's 128-bit identifier as 16 bytes of data
/// (EXHID set), as nvmet serves it; Set Features of it is Connect's alone.
#[test]
fn host_identifier_feature() {
    let mut h = Host::new(target(true));
    let (mut aq, _) = h.admin();
    let mut id = [0u8; 16];
    let cqe = h.exec(&mut aq, admin_cmd(0x0A, 0, 0x81, 1), &mut id);
    assert!(cqe.status.is_success(), "{cqe:?}");
    assert_eq!(id, HOSTID);
    assert_eq!(
        generic(&h.exec(&mut aq, admin_cmd(0x0A, 0, 0x81, 0), &mut [0u8; 16])),
        Some(GenericStatus::InvalidField)
    );
    for wrong in [0usize, 8, 4096] {
        assert_eq!(
            generic(&h.exec(&mut aq, admin_cmd(0x0A, 0, 0x81, 1), &mut vec![0u8; wrong])),
            Some(GenericStatus::DataSglLengthInvalid),
            "{wrong} bytes"
        );
    }
    assert_eq!(
        generic(&h.exec(&mut aq, admin_cmd(0x09, 0, 0x81, 1), &mut [])),
        Some(GenericStatus::CommandSequenceError)
    );
    // Other features still move nothing.
    assert_eq!(
        generic(&h.exec(&mut aq, admin_cmd(0x0A, 0, 0x07, 0), &mut [0u8; 16])),
        Some(GenericStatus::DataSglLengthInvalid)
    );
}

/// A reset (CC.EN 1 -> 0 -> 1) in the middle of a shutdown abandons it: a shutdown notified
/// after re-enabling sends the new I/O queues away and completes on its own, after every flush
/// still in flight.
#[test]
fn a_reset_abandons_a_shutdown_under_way() {
    let (t, _dir) = file_target();
    let mut h = Host::new(t);
    let (mut aq, cntlid) = h.admin();
    let old = h.io_queue(1, cntlid);
    let shutdown = normal_shutdown();
    assert!(h.set_cc(&mut aq, shutdown).status.is_success());
    assert!(h.set_cc(&mut aq, Cc::default()).status.is_success());
    assert!(h.set_cc(&mut aq, Cc::enabled_nvm()).status.is_success());
    assert_eq!(h.shst(&mut aq), ShutdownStatus::Normal);
    // The old queue is still closing; a new one of the same QID works.
    let mut new = h.io_queue(1, cntlid);
    assert!(h.succeeds(&mut new, rw(0x01, 1, 0, 1), &mut vec![5u8; 4096]));
    assert!(h.set_cc(&mut aq, shutdown).status.is_success());
    assert_eq!(h.shst(&mut aq), ShutdownStatus::Occurring);
    assert!(new.should_disconnect());
    drop(old);
    drop(new);
    assert_eq!(aq.poll_events(&mut h.io, &mut |_, c| panic!("{c:?}")), 0);
    assert_eq!(h.io.in_flight(), 1);
    while h.io.in_flight() > 0 {
        h.io.poll(&mut |_, c| panic!("a shutdown flush surfaced as a CQE: {c:?}"));
    }
    assert_eq!(h.shst(&mut aq), ShutdownStatus::Complete);
}

/// A shutdown abandoned by a reset while its flush is in flight: the next shutdown completes
/// only after that flush and its own (each completion counts down once).
#[test]
fn a_later_shutdown_waits_for_an_abandoned_ones_flushes() {
    let c = Controller::new(1, None, HOST, HOSTID, 0, Instant::now());
    let cc = |c: &Controller, cc: Cc| c.property_set(PropertyOffset::Cc, 4, u64::from(cc.to_u32()));
    let shutdown = Cc {
        shn: ShutdownNotification::Normal,
        ..Cc::enabled_nvm()
    };
    let shst = |c: &Controller| c.state().csts.shst;
    assert_eq!(cc(&c, Cc::enabled_nvm()), Ok(false));
    assert_eq!(cc(&c, shutdown), Ok(true));
    c.shutdown_flushes(1);
    assert_eq!(cc(&c, Cc::default()), Ok(false));
    assert_eq!(cc(&c, Cc::enabled_nvm()), Ok(false));
    assert_eq!(shst(&c), ShutdownStatus::Normal);
    assert_eq!(cc(&c, shutdown), Ok(true));
    c.shutdown_flushes(1);
    c.shutdown_flushed();
    assert_eq!(shst(&c), ShutdownStatus::Occurring);
    c.shutdown_flushed();
    assert_eq!(shst(&c), ShutdownStatus::Complete);
}

/// An Abort aimed at an I/O queue the host has disconnected (its write still in flight) is
/// answered by that queue's reactor, not held until the queue is dropped; the queue's late
/// answers still name it as SQID.
#[test]
fn an_abort_for_a_disconnected_queue_is_answered() {
    let open = Arc::new(AtomicBool::new(false));
    let (mut h, mut aq, _, mut q) = disconnected_with_a_write_held(open);
    let late = h.exec(&mut q, rw(0x02, 1, 0, 1), &mut [0u8; 512]);
    assert_eq!(late.sqid, 1);
    let mut none: [&mut [u8]; 0] = [];
    let mut abort = admin_cmd(0x08, 0, 1 | (500 << 16), 0);
    abort.cid = 901;
    assert_eq!(
        aq.execute(&mut h.io, &abort, &mut IoBuf::new(&mut none), 6000, || h
            .now),
        Exec::Pending
    );
    let mut asked = vec![];
    q.take_aborts(&mut |victim, abort_cid| asked.push((victim, abort_cid)));
    assert_eq!(asked, vec![(500, 901)]);
    q.answer_abort(901, false);
    let mut got = vec![];
    aq.poll_events(&mut h.io, &mut |tag, cqe| got.push((tag, cqe.cid)));
    assert_eq!(got, vec![(6000, 901)]);
}

/// Identify CNS 06h, the NVM command set's controller structure (Linux asks for it from VS 1.3
/// on): zeroes, as nvmet returns; another command set's is Invalid Field. Identify Controller
/// states the 128-bit host identifier (CTRATT bit 0) and the Save and Select fields (ONCS bit
/// 4).
#[test]
fn identify_nvm_controller_and_attributes() {
    let mut h = Host::new(target(true));
    let (mut aq, _) = h.admin();
    let mut page = vec![0xEEu8; 4096];
    let mut nvm = admin_cmd(0x06, 0, 0x06, 0);
    assert!(h.succeeds(&mut aq, nvm, &mut page));
    assert!(page.iter().all(|b| *b == 0));
    nvm.cdw11 = 2 << 24;
    assert_eq!(
        generic(&h.exec(&mut aq, nvm, &mut page)),
        Some(GenericStatus::InvalidField)
    );
    assert!(h.succeeds(&mut aq, admin_cmd(0x06, 0, 1, 0), &mut page));
    let id = IdentifyController::decode(&page).unwrap();
    assert_eq!((id.ctratt & 1, id.oncs & (1 << 4)), (1, 1 << 4));
}

/// Features: a feature not served is Invalid Field whatever buffer comes with it (the spec's
/// answer; a served one must come without); Async Event Configuration takes only the
/// events this controller raises; Number of Queues keeps its first answer until a reset.
#[test]
fn features_refuse_what_they_do_not_serve() {
    let mut h = Host::new(target(true));
    let (mut aq, _) = h.admin();
    let mut timestamp = vec![0u8; 8];
    let mut range_type = vec![0u8; 4096];
    for (sqe, data) in [
        (admin_cmd(0x09, 0, 0x0E, 0), &mut timestamp),
        (admin_cmd(0x0A, 0, 0x03, 0), &mut range_type),
    ] {
        assert_eq!(
            generic(&h.exec(&mut aq, sqe, data)),
            Some(GenericStatus::InvalidField),
            "{sqe:?}"
        );
    }
    assert_eq!(
        generic(&h.exec(&mut aq, admin_cmd(0x09, 0, 0x0F, 10_000), &mut timestamp)),
        Some(GenericStatus::DataSglLengthInvalid)
    );

    assert!(h.succeeds(&mut aq, admin_cmd(0x09, 0, 0x0B, 0x11F), &mut []));
    for unsupported in [1 << 5, 1 << 9, 1 << 11, 1 << 31] {
        assert_eq!(
            generic(&h.exec(&mut aq, admin_cmd(0x09, 0, 0x0B, unsupported), &mut [])),
            Some(GenericStatus::InvalidField),
            "AEC {unsupported:#x}"
        );
    }
    assert_eq!(
        h.exec(&mut aq, admin_cmd(0x0A, 0, 0x0B, 0), &mut []).dw0,
        0x11F
    );

    let queues = |h: &mut Host, aq: &mut Queue, n: u32| {
        let c = h.exec(
            aq,
            admin_cmd(0x09, 0, 0x07, (n - 1) | ((n - 1) << 16)),
            &mut [],
        );
        assert!(c.status.is_success(), "{c:?}");
        (c.dw0 & 0xFFFF) + 1
    };
    assert_eq!(queues(&mut h, &mut aq, 2), 2);
    assert_eq!(queues(&mut h, &mut aq, 8), 2, "the first allocation stands");
    assert!(h.set_cc(&mut aq, Cc::default()).status.is_success());
    assert!(h.set_cc(&mut aq, Cc::enabled_nvm()).status.is_success());
    assert_eq!(queues(&mut h, &mut aq, 8), 8, "asked again after a reset");
}

/// A discovery controller serves the keep-alive timer and event configuration only: Get
/// Features of anything else is Invalid Field, its supported capabilities (SEL 3) too; its
/// event configuration takes no event (it raises none).
#[test]
fn discovery_features() {
    let mut h = Host::new(target(true));
    let mut q = h.discovery();
    for (fid, sel) in [(0x01, 0), (0x01, 3), (0x07, 3), (0x06, 0)] {
        assert_eq!(
            generic(&h.exec(&mut q, admin_cmd(0x0A, 0, fid | (sel << 8), 0), &mut [])),
            Some(GenericStatus::InvalidField),
            "fid {fid:#x} sel {sel}"
        );
    }
    for fid in [0x0F, 0x0B] {
        let c = h.exec(&mut q, admin_cmd(0x0A, 0, fid | (3 << 8), 0), &mut []);
        assert!(c.status.is_success(), "fid {fid:#x}: {c:?}");
    }
    assert_eq!(
        generic(&h.exec(&mut q, admin_cmd(0x09, 0, 0x0B, 1 << 8), &mut [])),
        Some(GenericStatus::InvalidField)
    );
    assert!(h.succeeds(&mut q, admin_cmd(0x09, 0, 0x0B, 0), &mut []));
}

/// An I/O queue's Connect that finds its controller torn down between the lookup and joining
/// (its admin queue went on another reactor) is refused, naming the CNTLID.
#[test]
fn io_connect_to_a_controller_being_torn_down() {
    let mut h = Host::new(target(true));
    let (aq, cntlid) = h.admin();
    aq.controller().unwrap().set_defunct();
    let mut q = h.queue();
    let c = h.connect(&mut q, 1, 127, cntlid, SUBNQN, HOST);
    assert_eq!(fabrics_status(&c), FabricsStatus::InvalidParameters);
    assert_eq!(
        ConnectInvalidParameter::from_dw0(c.dw0),
        ConnectInvalidParameter::CNTLID
    );
    assert!(matches!(q.state(), QueueState::Unbound));
}

//! Property tests: every structure round-trips (decode(encode(x)) == x), and byte images keep
//! their meaningful bytes (encode(decode(b)) reproduces them; reserved bytes come back zero).

use nvmf_protocol::admin::*;
use nvmf_protocol::cm::*;
use nvmf_protocol::fabrics::*;
use nvmf_protocol::features::*;
use nvmf_protocol::identify::*;
use nvmf_protocol::log::*;
use nvmf_protocol::nvm::*;
use nvmf_protocol::properties::*;
use nvmf_protocol::status::*;
use nvmf_protocol::*;
use proptest::prelude::*;

// ---------- strategies ----------

fn sgl() -> impl Strategy<Value = SglDescriptor> {
    prop_oneof![
        (any::<u64>(), any::<u32>())
            .prop_map(|(address, length)| SglDescriptor::DataBlock { address, length }),
        (any::<u64>(), any::<u32>())
            .prop_map(|(offset, length)| SglDescriptor::DataBlockOffset { offset, length }),
        any::<u32>().prop_map(|length| SglDescriptor::BitBucket { length }),
        (any::<u64>(), any::<u32>())
            .prop_map(|(address, length)| SglDescriptor::Segment { address, length }),
        (any::<u64>(), any::<u32>())
            .prop_map(|(offset, length)| SglDescriptor::SegmentOffset { offset, length }),
        (any::<u64>(), any::<u32>())
            .prop_map(|(address, length)| SglDescriptor::LastSegment { address, length }),
        (any::<u64>(), any::<u32>())
            .prop_map(|(offset, length)| SglDescriptor::LastSegmentOffset { offset, length }),
        (any::<u64>(), 0u32..=U24::MAX, any::<u32>(), any::<bool>())
            .prop_map(|(a, l, k, i)| SglDescriptor::keyed(a, l, k, i).unwrap()),
    ]
}

fn ctx() -> impl Strategy<Value = StatusContext> {
    prop_oneof![Just(StatusContext::Nvm), Just(StatusContext::Fabrics)]
}

fn status() -> impl Strategy<Value = Status> {
    (any::<u16>(), ctx()).prop_map(|(raw, c)| Status::from_field(raw & !1, c))
}

fn named_status() -> impl Strategy<Value = Status> {
    let code = prop_oneof![
        prop::sample::select(GenericStatus::NAMED).prop_map(StatusCode::Generic),
        prop::sample::select(CommandSpecificStatus::NAMED).prop_map(StatusCode::CommandSpecific),
        prop::sample::select(FabricsStatus::NAMED).prop_map(StatusCode::Fabrics),
        prop::sample::select(MediaStatus::NAMED).prop_map(StatusCode::Media),
        prop::sample::select(PathStatus::NAMED).prop_map(StatusCode::Path),
        any::<u8>().prop_map(StatusCode::Vendor),
        (4u8..=6, any::<u8>()).prop_map(|(sct, sc)| StatusCode::Reserved { sct, sc }),
    ];
    (code, 0u8..4, any::<bool>(), any::<bool>()).prop_map(|(code, crd, more, dnr)| Status {
        code,
        crd,
        more,
        dnr,
    })
}

fn rw_control() -> impl Strategy<Value = RwControl> {
    (
        any::<bool>(),
        any::<bool>(),
        0u8..16,
        any::<u32>(),
        any::<u16>(),
        any::<u16>(),
    )
        .prop_map(
            |(limited_retry, fua, prinfo, ilbrt, lbat, lbatm)| RwControl {
                limited_retry,
                fua,
                prinfo,
                ilbrt,
                lbat,
                lbatm,
            },
        )
}

fn fixed<const N: usize>(max: usize) -> impl Strategy<Value = FixedStr<N>> {
    // Printable ASCII, no trailing space (wire strings are padded, so trailing spaces vanish).
    proptest::string::string_regex(&format!(
        "([!-~][ -~]{{0,{}}})?[!-~]?",
        max.saturating_sub(2)
    ))
    .unwrap()
    .prop_filter("fits", move |s| s.len() <= max && !s.ends_with(' '))
    .prop_map(|s| FixedStr::new(&s, "t").unwrap())
}

fn byte_array<const N: usize>() -> impl Strategy<Value = [u8; N]> {
    prop::collection::vec(any::<u8>(), N).prop_map(|v| {
        let mut a = [0u8; N];
        a.copy_from_slice(&v);
        a
    })
}

// ---------- fast-path types ----------

proptest! {
    #[test]
    fn sqe_bytes_are_lossless(b in byte_array::<64>()) {
        let s = Sqe::decode(&b).unwrap();
        prop_assert_eq!(s.to_bytes(), b);
        prop_assert_eq!(Sqe::decode(&s.to_bytes()).unwrap(), s);
    }

    #[test]
    fn cqe_roundtrip(dw0: u32, dw1: u32, sqhd: u16, sqid: u16, cid: u16, st in status(), phase: bool, c in ctx()) {
        let st = st.in_context(c);
        let q = Cqe { dw0, dw1, sqhd, sqid, cid, status: st, phase };
        prop_assert_eq!(Cqe::decode_in(&q.to_bytes(), c).unwrap(), q);
    }

    #[test]
    fn cqe_bytes_are_lossless(b in byte_array::<16>(), c in ctx()) {
        prop_assert_eq!(Cqe::decode_in(&b, c).unwrap().to_bytes(), b);
    }

    #[test]
    fn status_roundtrip(s in named_status()) {
        prop_assert_eq!(Status::from_field(s.to_field(), s.code.context()), s);
        prop_assert_eq!(s.to_field() & 1, 0);
    }

    #[test]
    fn sgl_roundtrip(d in sgl()) {
        prop_assert_eq!(SglDescriptor::decode(&d.to_bytes()).unwrap(), d);
    }

    #[test]
    fn sgl_bytes_keep_meaningful_bytes(b in byte_array::<16>()) {
        if let Ok(d) = SglDescriptor::decode(&b) {
            let e = d.to_bytes();
            prop_assert_eq!(e[15], b[15]);
            match d {
                SglDescriptor::KeyedDataBlock { .. } => prop_assert_eq!(&e[..15], &b[..15]),
                SglDescriptor::BitBucket { .. } => prop_assert_eq!(&e[8..12], &b[8..12]),
                _ => prop_assert_eq!(&e[..12], &b[..12]),
            }
        }
    }
}

// ---------- NVM command views ----------

proptest! {
    #[test]
    fn read_roundtrip(cid: u16, nsid: u32, slba: u64, nlb: u16, control in rw_control(), dsm: u8, sgl in sgl()) {
        let r = ReadCmd { cid, nsid, slba, nlb, control, dsm, sgl };
        prop_assert_eq!(Sqe::decode(&r.to_sqe().to_bytes()).unwrap().as_read().unwrap(), r);
    }

    #[test]
    fn write_roundtrip(cid: u16, nsid: u32, slba: u64, nlb: u16, control in rw_control(), dtype in 0u8..16, dsm: u8, dspec: u16, sgl in sgl()) {
        let w = WriteCmd { cid, nsid, slba, nlb, control, dtype, dsm, dspec, sgl };
        prop_assert_eq!(Sqe::decode(&w.to_sqe().to_bytes()).unwrap().as_write().unwrap(), w);
    }

    #[test]
    fn flush_write_zeroes_roundtrip(cid: u16, nsid: u32, slba: u64, nlb: u16, deac: bool, control in rw_control()) {
        let f = FlushCmd { cid, nsid };
        prop_assert_eq!(f.to_sqe().as_flush().unwrap(), f);
        let z = WriteZeroesCmd { cid, nsid, slba, nlb, deac, control };
        prop_assert_eq!(Sqe::decode(&z.to_sqe().to_bytes()).unwrap().as_write_zeroes().unwrap(), z);
    }

    #[test]
    fn dsm_roundtrip(cid: u16, nsid: u32, nr: u8, idr: bool, idw: bool, ad: bool, sgl in sgl(), ca: u32, len: u32, slba: u64) {
        let d = DatasetManagementCmd { cid, nsid, nr, idr, idw, ad, sgl };
        prop_assert_eq!(Sqe::decode(&d.to_sqe().to_bytes()).unwrap().as_dataset_management().unwrap(), d);
        let r = DsmRange { context_attributes: ca, length: len, slba };
        prop_assert_eq!(DsmRange::decode(&r.to_bytes()).unwrap(), r);
    }

    #[test]
    fn dsm_range_bytes_are_lossless(b in byte_array::<16>()) {
        prop_assert_eq!(DsmRange::decode(&b).unwrap().to_bytes(), b);
    }

    /// A view built from arbitrary bytes rebuilds an SQE whose meaningful bytes match.
    #[test]
    fn read_view_of_bytes_keeps_fields(mut b in byte_array::<64>()) {
        b[0] = 0x02;
        b[24..40].copy_from_slice(&SglDescriptor::keyed(1, 2, 3, true).unwrap().to_bytes());
        let s = Sqe::decode(&b).unwrap();
        let r = s.as_read().unwrap();
        let e = r.to_sqe().to_bytes();
        prop_assert_eq!(&e[0..1], &b[0..1]);
        prop_assert_eq!(&e[2..8], &b[2..8]);
        prop_assert_eq!(&e[24..50], &b[24..50]); // DPTR, SLBA, NLB
        prop_assert_eq!(e[51] & 0xFC, b[51] & 0xFC); // PRINFO, FUA, LR
        prop_assert_eq!(e[52], b[52]); // DSM
        prop_assert_eq!(&e[56..64], &b[56..64]);
    }
}

// ---------- admin command views ----------

proptest! {
    #[test]
    fn identify_roundtrip(cid: u16, nsid: u32, cns: u8, cntid: u16, cns_specific_id: u16, csi: u8, uuid_index in 0u8..128, sgl in sgl()) {
        let i = IdentifyCmd { cid, nsid, cns: Cns::from_raw(cns), cntid, cns_specific_id, csi, uuid_index, sgl };
        prop_assert_eq!(Sqe::decode(&i.to_sqe().to_bytes()).unwrap().as_identify().unwrap(), i);
    }

    #[test]
    fn get_log_page_roundtrip(cid: u16, nsid: u32, lid: u8, lsp in 0u8..128, rae: bool, numd: u32, lsi: u16, lpo: u64, uuid_index in 0u8..128, ot: bool, csi: u8, sgl in sgl()) {
        let g = GetLogPageCmd { cid, nsid, lid: LogId::from_raw(lid), lsp, rae, numd, lsi, lpo, uuid_index, ot, csi, sgl };
        prop_assert_eq!(Sqe::decode(&g.to_sqe().to_bytes()).unwrap().as_get_log_page().unwrap(), g);
    }

    #[test]
    fn features_cmd_roundtrip(cid: u16, nsid: u32, fid: u8, save: bool, c11: u32, c12: u32, c13: u32, c15: u32, uuid_index in 0u8..128, sel in 0u8..8, sgl in sgl()) {
        let s = SetFeaturesCmd { cid, nsid, fid: FeatureId::from_raw(fid), save, cdw11: c11, cdw12: c12, cdw13: c13, uuid_index, cdw15: c15, sgl };
        prop_assert_eq!(Sqe::decode(&s.to_sqe().to_bytes()).unwrap().as_set_features().unwrap(), s);
        let g = GetFeaturesCmd { cid, nsid, fid: FeatureId::from_raw(fid), sel: FeatureSelect::from_raw(sel), cdw11: c11, uuid_index, sgl };
        prop_assert_eq!(Sqe::decode(&g.to_sqe().to_bytes()).unwrap().as_get_features().unwrap(), g);
    }

    #[test]
    fn small_admin_roundtrip(cid: u16, sqid: u16, abort_cid: u16, ty in 0u8..8, info: u8, lp: u8) {
        let k = KeepAliveCmd { cid };
        prop_assert_eq!(k.to_sqe().as_keep_alive().unwrap(), k);
        let a = AsyncEventRequestCmd { cid };
        prop_assert_eq!(a.to_sqe().as_async_event_request().unwrap(), a);
        let ab = AbortCmd { cid, sqid, abort_cid };
        prop_assert_eq!(Sqe::decode(&ab.to_sqe().to_bytes()).unwrap().as_abort().unwrap(), ab);
        let e = AsyncEvent { event_type: AsyncEventType::from_raw(ty), info, log_page: lp };
        prop_assert_eq!(AsyncEvent::from_dw0(e.to_dw0()), e);
    }

    #[test]
    fn feature_values_roundtrip(v: u32) {
        for fid in [FeatureId::Arbitration, FeatureId::PowerManagement, FeatureId::VolatileWriteCache,
                    FeatureId::NumberOfQueues, FeatureId::AsyncEventConfig, FeatureId::KeepAliveTimer] {
            let f = Feature::decode(fid, v).unwrap();
            prop_assert_eq!(f.fid(), fid);
            // Decode of the re-encoded value is stable; unnamed bits drop.
            prop_assert_eq!(Feature::decode(fid, f.to_dword()).unwrap(), f);
        }
        prop_assert_eq!(NumberOfQueues::from_dword(v).to_dword(), v);
        prop_assert_eq!(KeepAliveTimer::from_dword(v).to_dword(), v);
        prop_assert_eq!(Arbitration::from_dword(v).to_dword(), v & 0xFFFF_FF07);
        prop_assert_eq!(AsyncEventConfig::from_dword(v).to_dword(), v & 0x8000_FFFF);
    }
}

// ---------- fabrics ----------

proptest! {
    #[test]
    fn connect_roundtrip(cid: u16, recfmt: u16, qid: u16, sqsize: u16, cattr: u8, kato: u32, sgl in sgl()) {
        let c = ConnectCmd { cid, recfmt, qid, sqsize, cattr, kato, sgl };
        prop_assert_eq!(Sqe::decode(&c.to_sqe().to_bytes()).unwrap().as_connect().unwrap(), c);
    }

    #[test]
    fn property_cmds_roundtrip(cid: u16, size in 0u8..8, off: u32, value: u64, recfmt: u16) {
        let g = PropertyGetCmd { cid, size: PropertySize::from_raw(size), offset: PropertyOffset::from_raw(off) };
        prop_assert_eq!(Sqe::decode(&g.to_sqe().to_bytes()).unwrap().as_property_get().unwrap(), g);
        let s = PropertySetCmd { cid, size: PropertySize::from_raw(size), offset: PropertyOffset::from_raw(off), value };
        prop_assert_eq!(Sqe::decode(&s.to_sqe().to_bytes()).unwrap().as_property_set().unwrap(), s);
        let d = DisconnectCmd { cid, recfmt };
        prop_assert_eq!(Sqe::decode(&d.to_sqe().to_bytes()).unwrap().as_disconnect().unwrap(), d);
    }

    #[test]
    fn connect_data_roundtrip(hostid in byte_array::<16>(), cntlid: u16, subnqn in fixed::<223>(223), hostnqn in fixed::<223>(223)) {
        let d = ConnectData { hostid, cntlid, subnqn, hostnqn };
        let b = d.to_bytes();
        prop_assert_eq!(ConnectData::decode(&b).unwrap(), d);
        // Exact image: fields, NUL padding, zero reserved.
        prop_assert_eq!(&b[..16], &hostid[..]);
        prop_assert!(b[18..256].iter().all(|&x| x == 0));
        prop_assert!(b[256 + subnqn.len()..512].iter().all(|&x| x == 0));
        prop_assert!(b[768..].iter().all(|&x| x == 0));
    }

    #[test]
    fn connect_data_bytes_keep_fields(b in prop::collection::vec(any::<u8>(), 1024)) {
        if let Ok(d) = ConnectData::decode(&b) {
            let e = d.to_bytes();
            prop_assert_eq!(&e[..18], &b[..18]);
            let n = d.subnqn.len();
            prop_assert_eq!(&e[256..256 + n], &b[256..256 + n]);
        }
    }

    #[test]
    fn connect_dw0_roundtrip(cntlid: u16, authreq: u16, offset: u16, in_data: bool) {
        let r = ConnectResponse { cntlid, authreq };
        prop_assert_eq!(ConnectResponse::from_dw0(r.to_dw0()), r);
        let p = ConnectInvalidParameter { offset, in_data };
        prop_assert_eq!(ConnectInvalidParameter::from_dw0(p.to_dw0()), p);
    }
}

// ---------- properties ----------

proptest! {
    #[test]
    fn properties_roundtrip(v64: u64, v32: u32) {
        let cap = Cap::from_u64(v64);
        prop_assert_eq!(Cap::from_u64(cap.to_u64()), cap);
        prop_assert_eq!(cap.to_u64(), v64 & 0x1FFF_FFFF_FF07_FFFF);
        prop_assert_eq!(Vs::from_u32(v32).to_u32(), v32);
        let cc = Cc::from_u32(v32);
        prop_assert_eq!(Cc::from_u32(cc.to_u32()), cc);
        prop_assert_eq!(cc.to_u32(), v32 & 0x01FF_FFF1);
        let cs = Csts::from_u32(v32);
        prop_assert_eq!(Csts::from_u32(cs.to_u32()), cs);
        prop_assert_eq!(cs.to_u32(), v32 & 0x7F);
    }
}

// ---------- identify ----------

/// Byte ranges of Identify Controller that are modelled (outside strings and power states).
const IDCTRL_FIELDS: &[(usize, usize)] = &[
    (0, 2),
    (2, 4),
    (72, 102),
    (111, 134),
    (256, 332),
    (342, 356),
    (512, 534),
    (536, 544),
    (1792, 1806),
];

fn idctrl_image() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(any::<u8>(), 4096),
        fixed::<20>(20),
        fixed::<40>(40),
        fixed::<8>(8),
        fixed::<223>(223),
    )
        .prop_map(|(mut b, sn, mn, fr, nqn)| {
            sn.as_bytes()
                .iter()
                .chain(std::iter::repeat(&b' '))
                .take(20)
                .enumerate()
                .for_each(|(i, c)| b[4 + i] = *c);
            mn.as_bytes()
                .iter()
                .chain(std::iter::repeat(&b' '))
                .take(40)
                .enumerate()
                .for_each(|(i, c)| b[24 + i] = *c);
            fr.as_bytes()
                .iter()
                .chain(std::iter::repeat(&b' '))
                .take(8)
                .enumerate()
                .for_each(|(i, c)| b[64 + i] = *c);
            b[768..1024].fill(0);
            b[768..768 + nqn.len()].copy_from_slice(nqn.as_bytes());
            b
        })
}

proptest! {
    #[test]
    fn identify_controller_image(b in idctrl_image()) {
        let c = IdentifyController::decode(&b).unwrap();
        let mut e = vec![0u8; 4096];
        c.encode_into(&mut e).unwrap();
        prop_assert_eq!(IdentifyController::decode(&e).unwrap(), c);
        for &(s, t) in IDCTRL_FIELDS {
            prop_assert_eq!(&e[s..t], &b[s..t], "bytes {}..{}", s, t);
        }
        prop_assert_eq!(&e[4..72], &b[4..72]);
        prop_assert_eq!(&e[768..1024], &b[768..1024]);
        prop_assert!(e[3072..].iter().all(|&x| x == 0));
    }

    #[test]
    fn identify_namespace_image(b in prop::collection::vec(any::<u8>(), 4096)) {
        let n = IdentifyNamespace::decode(&b).unwrap();
        let mut e = vec![0u8; 4096];
        n.encode_into(&mut e).unwrap();
        prop_assert_eq!(IdentifyNamespace::decode(&e).unwrap(), n);
        prop_assert_eq!(&e[..82], &b[..82]);
        prop_assert_eq!(&e[92..96], &b[92..96]);
        prop_assert_eq!(&e[99..128], &b[99..128]);
        for i in 0..64 {
            let o = 128 + 4 * i;
            prop_assert_eq!(&e[o..o + 3], &b[o..o + 3]);
            prop_assert_eq!(e[o + 3], b[o + 3] & 3);
        }
        prop_assert!(e[384..].iter().all(|&x| x == 0));
    }

    #[test]
    fn identify_namespace_fields(nsze: u64, ncap: u64, flbas: u8, nguid in byte_array::<16>(), eui in byte_array::<8>(), lbads in 9u8..16, ms: u16) {
        let mut n = IdentifyNamespace::simple(nsze, lbads);
        n.ncap = ncap;
        n.flbas = flbas;
        n.nguid = nguid;
        n.eui64 = eui;
        n.lbaf[5] = LbaFormat { ms, lbads, rp: 1 };
        let mut e = vec![0u8; 4096];
        n.encode_into(&mut e).unwrap();
        prop_assert_eq!(IdentifyNamespace::decode(&e).unwrap(), n);
    }

    #[test]
    fn ns_list_roundtrip(mut ids in prop::collection::vec(1u32.., 0..=1024)) {
        ids.sort_unstable();
        let l = NsList::new(&ids).unwrap();
        let mut e = vec![0u8; 4096];
        l.encode_into(&mut e).unwrap();
        let d = NsList::decode(&e).unwrap();
        prop_assert_eq!(d.as_slice(), &ids[..]);
        let mut e2 = vec![0u8; 4096];
        d.encode_into(&mut e2).unwrap();
        prop_assert_eq!(e, e2);
    }

    #[test]
    fn ns_id_descriptors_roundtrip(items in prop::collection::vec(prop_oneof![
        byte_array::<8>().prop_map(NsIdDescriptor::Eui64),
        byte_array::<16>().prop_map(NsIdDescriptor::Nguid),
        byte_array::<16>().prop_map(NsIdDescriptor::Uuid),
        any::<u8>().prop_map(NsIdDescriptor::Csi),
    ], 0..8)) {
        let mut e = vec![0u8; 4096];
        NsIdDescriptor::encode_list(&items, &mut e).unwrap();
        prop_assert_eq!(NsIdDescriptor::decode_list(&e).unwrap(), items);
    }
}

// ---------- logs ----------

proptest! {
    #[test]
    fn error_log_image(b in byte_array::<64>()) {
        let e = ErrorLogEntry::decode(&b).unwrap();
        let r = e.to_bytes();
        prop_assert_eq!(&r[..42], &b[..42]);
        prop_assert_eq!(r[63], b[63]);
        prop_assert!(r[42..63].iter().all(|&x| x == 0));
        prop_assert_eq!(ErrorLogEntry::decode(&r).unwrap(), e);
    }

    #[test]
    fn smart_log_image(b in prop::collection::vec(any::<u8>(), 512)) {
        let s = SmartLog::decode(&b).unwrap();
        let mut r = vec![0u8; 512];
        s.encode_into(&mut r).unwrap();
        prop_assert_eq!(&r[..7], &b[..7]);
        prop_assert_eq!(&r[32..232], &b[32..232]);
        prop_assert!(r[7..32].iter().chain(&r[232..]).all(|&x| x == 0));
        prop_assert_eq!(SmartLog::decode(&r).unwrap(), s);
    }
}

fn tsas_for(tr: TransportType) -> BoxedStrategy<Tsas> {
    if tr == TransportType::Rdma {
        (any::<u8>(), any::<u8>(), any::<u8>(), any::<u16>())
            .prop_map(|(q, p, c, pkey)| {
                Tsas::Rdma(RdmaTsas {
                    qptype: RdmaQpType::from_raw(q),
                    prtype: RdmaProviderType::from_raw(p),
                    cms: RdmaCms::from_raw(c),
                    pkey,
                })
            })
            .boxed()
    } else {
        byte_array::<256>().prop_map(Tsas::Raw).boxed()
    }
}

fn discovery_entry() -> impl Strategy<Value = DiscoveryLogEntry> {
    any::<u8>()
        .prop_map(TransportType::from_raw)
        .prop_flat_map(|tr| {
            (
                Just(tr),
                (
                    any::<u8>(),
                    any::<u8>(),
                    any::<u8>(),
                    any::<u16>(),
                    any::<u16>(),
                    any::<u16>(),
                    any::<u16>(),
                ),
                (fixed::<32>(32), fixed::<223>(223), fixed::<256>(256)),
                tsas_for(tr),
            )
        })
        .prop_map(
            |(
                trtype,
                (a, s, treq, portid, cntlid, asqsz, eflags),
                (trsvcid, subnqn, traddr),
                tsas,
            )| {
                DiscoveryLogEntry {
                    trtype,
                    adrfam: AddressFamily::from_raw(a),
                    subtype: SubsystemType::from_raw(s),
                    treq,
                    portid,
                    cntlid,
                    asqsz,
                    eflags,
                    trsvcid,
                    subnqn,
                    traddr,
                    tsas,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn discovery_log_roundtrip(genctr: u64, recfmt: u16, entries in prop::collection::vec(discovery_entry(), 0..4)) {
        let log = DiscoveryLog { genctr, recfmt, entries };
        let mut b = vec![0u8; log.encoded_len()];
        prop_assert_eq!(log.encode_into(&mut b).unwrap(), b.len());
        prop_assert_eq!(&b[8..16], &(log.entries.len() as u64).to_le_bytes()[..]);
        prop_assert_eq!(DiscoveryLog::decode(&b).unwrap(), log);
    }

    #[test]
    fn discovery_entry_image(b in prop::collection::vec(any::<u8>(), 1024)) {
        if let Ok(e) = DiscoveryLogEntry::decode(&b) {
            let mut r = vec![0u8; 1024];
            e.encode_into(&mut r).unwrap();
            prop_assert_eq!(&r[..12], &b[..12]);
            prop_assert_eq!(DiscoveryLogEntry::decode(&r).unwrap(), e);
        }
    }

    #[test]
    fn discovery_header_roundtrip(genctr: u64, numrec: u64, recfmt: u16) {
        let h = DiscoveryLogHeader { genctr, numrec, recfmt };
        let mut b = vec![0u8; 1024];
        h.encode_into(&mut b).unwrap();
        prop_assert_eq!(DiscoveryLogHeader::decode(&b).unwrap(), h);
        prop_assert!(b[18..].iter().all(|&x| x == 0));
    }
}

// ---------- RDMA CM private data ----------

proptest! {
    #[test]
    fn cm_roundtrip(recfmt: u16, qid: u16, hrqsize: u16, hsqsize: u16, cntlid: u16, sts: u16) {
        let r = RdmaConnectRequest { recfmt, qid, hrqsize, hsqsize, cntlid };
        prop_assert_eq!(RdmaConnectRequest::decode(&r.to_bytes()).unwrap(), r);
        let a = RdmaAccept { recfmt, crqsize: hrqsize };
        prop_assert_eq!(RdmaAccept::decode(&a.to_bytes()).unwrap(), a);
        let j = RdmaReject { recfmt, status: RejectStatus::from_raw(sts) };
        prop_assert_eq!(RdmaReject::decode(&j.to_bytes()).unwrap(), j);
        let d = r.negotiated_depth(128);
        prop_assert!(d <= 128 && d <= hrqsize && u32::from(d) <= u32::from(hsqsize) + 1);
    }

    #[test]
    fn cm_images(b in byte_array::<32>()) {
        let r = RdmaConnectRequest::decode(&b).unwrap().to_bytes();
        prop_assert_eq!(&r[..10], &b[..10]);
        prop_assert!(r[10..].iter().all(|&x| x == 0));
        prop_assert_eq!(&RdmaAccept::decode(&b).unwrap().to_bytes()[..4], &b[..4]);
        prop_assert_eq!(&RdmaReject::decode(&b).unwrap().to_bytes()[..], &b[..4]);
    }
}

// ---------- NQN ----------

proptest! {
    #[test]
    fn nqn_uuid_form_always_valid(u in byte_array::<16>()) {
        let n = Nqn::from_uuid(u);
        prop_assert_eq!(validate_nqn(n.as_str()), Ok(()));
        prop_assert_eq!(n.as_str().len(), 68);
    }

    #[test]
    fn nqn_domain_form(year in 1000u32..10000, month in 1u32..13, dom in "[a-z0-9]{1,20}(\\.[a-z0-9-]{1,10}){0,3}", tail in "[ -~]{0,100}") {
        let s = format!("nqn.{year:04}-{month:02}.{dom}:{tail}");
        let n = Nqn::parse(&s).unwrap();
        prop_assert_eq!(n.as_str(), s.as_str());
    }

    #[test]
    fn nqn_validation_never_panics(s in "\\PC{0,300}") {
        if validate_nqn(&s).is_ok() {
            prop_assert!(s.len() <= 223);
        }
    }
}

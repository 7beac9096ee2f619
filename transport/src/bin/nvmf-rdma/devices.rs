//! `nvmf-rdma devices`: device and port attributes and GID tables, like `ibv_devinfo -v`.

use std::net::IpAddr;

use anyhow::{Context as _, Result};
use nvmf_transport::{Context, DeviceSpec, ProviderKind, devices, gid};

pub fn run(spec: &DeviceSpec, ip: Option<IpAddr>) -> Result<()> {
    let list = devices().context("listing RDMA devices")?;
    let verbs: Vec<_> = list
        .iter()
        .filter(|d| d.provider == ProviderKind::Verbs)
        .collect();
    if verbs.is_empty() {
        println!(
            "no verbs devices (no RDMA NIC, or the kernel lacks RDMA); soft provider available"
        );
    }
    // Show every verbs device, or the soft device the flags describe.
    let specs: Vec<DeviceSpec> = match spec {
        DeviceSpec::Soft(_) => vec![spec.clone()],
        DeviceSpec::Verbs(Some(name)) => vec![DeviceSpec::Verbs(Some(name.clone()))],
        _ => verbs
            .iter()
            .map(|d| DeviceSpec::Verbs(Some(d.name.clone())))
            .collect(),
    };
    for spec in specs {
        let ctx = Context::open(&spec).with_context(|| format!("opening {spec:?}"))?;
        print_device(&ctx, ip)?;
    }
    Ok(())
}

fn print_device(ctx: &Context, ip: Option<IpAddr>) -> Result<()> {
    let a = ctx.query_device().context("query_device")?;
    println!("hca_id: {}  (provider: {})", ctx.name(), ctx.kind());
    println!("\tfw_ver:\t\t\t\t{}", a.fw_ver);
    println!("\tnode_guid:\t\t\t{}", guid(a.node_guid));
    println!("\tsys_image_guid:\t\t\t{}", guid(a.sys_image_guid));
    println!("\tvendor_id:\t\t\t{:#06x}", a.vendor_id);
    println!("\tvendor_part_id:\t\t\t{}", a.vendor_part_id);
    println!("\thw_ver:\t\t\t\t{:#x}", a.hw_ver);
    println!("\tphys_port_cnt:\t\t\t{}", a.phys_port_cnt);
    println!("\tmax_mr_size:\t\t\t{:#x}", a.max_mr_size);
    println!("\tmax_qp:\t\t\t\t{}", a.max_qp);
    println!("\tmax_qp_wr:\t\t\t{}", a.max_qp_wr);
    println!("\tmax_sge:\t\t\t{}", a.max_sge);
    println!("\tmax_cq:\t\t\t\t{}", a.max_cq);
    println!("\tmax_cqe:\t\t\t{}", a.max_cqe);
    println!("\tmax_mr:\t\t\t\t{}", a.max_mr);
    println!("\tmax_pd:\t\t\t\t{}", a.max_pd);
    println!("\tmax_qp_rd_atom:\t\t\t{}", a.max_qp_rd_atom);
    println!("\tmax_qp_init_rd_atom:\t\t{}", a.max_qp_init_rd_atom);
    println!("\tmax_srq:\t\t\t{}", a.max_srq);
    println!("\tmax_srq_wr:\t\t\t{}", a.max_srq_wr);
    println!("\tmax_srq_sge:\t\t\t{}", a.max_srq_sge);
    println!("\tdevice_cap_flags:\t\t{:?}", a.cap_flags);
    println!(
        "\traises LAST_WQE_REACHED:\t{}",
        if a.raises_last_wqe_reached {
            "yes"
        } else {
            "no (teardown uses flush accounting)"
        }
    );
    for port in 1..=a.phys_port_cnt {
        let p = ctx
            .query_port(port)
            .with_context(|| format!("query_port {port}"))?;
        println!("\t\tport:\t{port}");
        println!("\t\t\tstate:\t\t\t{:?}", p.state);
        println!("\t\t\tmax_mtu:\t\t{} ({:?})", p.max_mtu.bytes(), p.max_mtu);
        println!(
            "\t\t\tactive_mtu:\t\t{} ({:?})",
            p.active_mtu.bytes(),
            p.active_mtu
        );
        println!("\t\t\tlid:\t\t\t{}", p.lid);
        println!("\t\t\tlink_layer:\t\t{:?}", p.link_layer);
        let table = ctx
            .gid_table(port)
            .with_context(|| format!("GID table of port {port}"))?;
        for e in &table {
            let v4 = e
                .gid
                .to_ipv4()
                .map(|ip| format!(", {ip}"))
                .unwrap_or_default();
            let dev = e
                .netdev
                .as_deref()
                .map(|d| format!(", {d}"))
                .unwrap_or_default();
            println!(
                "\t\t\tGID[{:>3}]:\t\t{}, {:?}{v4}{dev}",
                e.index, e.gid, e.gid_type
            );
        }
        if let Some(ip) = ip {
            match gid::roce_v2_index(&table, ip) {
                Ok(i) => println!("\t\t\tGID index for {ip}:\t{i} (RoCE v2)"),
                Err(e) => println!("\t\t\tGID index for {ip}:\tnone: {e}"),
            }
        }
    }
    Ok(())
}

fn guid(g: u64) -> String {
    let b = g.to_be_bytes();
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

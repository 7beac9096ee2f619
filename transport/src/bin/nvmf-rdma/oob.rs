//! The out-of-band TCP channel pingpong uses to exchange QP endpoints and pace its phases,
//! like ibv_rc_pingpong's: one text line per message.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, TcpStream};

use anyhow::{Context as _, Result, anyhow, bail};
use nvmf_transport::{Gid, QpEndpoint};

pub struct Oob {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    /// Bytes of a line not yet complete when a non-blocking read stopped.
    partial: Vec<u8>,
}

/// What each side tells the other: its QP endpoint and the buffer the peer may READ/WRITE.
#[derive(Clone, Copy, Debug)]
pub struct PeerInfo {
    pub ep: QpEndpoint,
    pub addr: u64,
    pub rkey: u32,
    pub len: u64,
}

impl Oob {
    pub fn new(stream: TcpStream) -> Result<Oob> {
        stream.set_nodelay(true).ok();
        Ok(Oob {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
            partial: Vec::new(),
        })
    }

    pub fn local_ip(&self) -> Result<IpAddr> {
        Ok(self.writer.local_addr()?.ip())
    }

    pub fn send(&mut self, line: &str) -> Result<()> {
        self.writer.write_all(line.as_bytes())?;
        self.writer.write_all(b"\n")?;
        Ok(())
    }

    /// Blocks for the next line.
    pub fn recv(&mut self) -> Result<String> {
        self.reader.get_ref().set_nonblocking(false)?;
        let n = self
            .reader
            .read_until(b'\n', &mut self.partial)
            .context("reading from the peer")?;
        if n == 0 && self.partial.is_empty() {
            bail!("the peer closed the out-of-band connection");
        }
        Ok(self.take_line())
    }

    /// The next line if a whole one is there now, else None. Never blocks, so a server can
    /// keep polling its CQ (the soft TCP fabric progresses only when polled).
    pub fn try_recv(&mut self) -> Result<Option<String>> {
        self.reader.get_ref().set_nonblocking(true)?;
        let r = self.reader.read_until(b'\n', &mut self.partial);
        self.reader.get_ref().set_nonblocking(false)?;
        match r {
            Ok(0) if self.partial.is_empty() => bail!("the peer closed the out-of-band connection"),
            Ok(_) if self.partial.ends_with(b"\n") => Ok(Some(self.take_line())),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn take_line(&mut self) -> String {
        let line = String::from_utf8_lossy(&self.partial)
            .trim_end()
            .to_string();
        self.partial.clear();
        line
    }

    pub fn expect(&mut self, want: &str) -> Result<()> {
        let got = self.recv()?;
        if got != want {
            bail!("protocol: expected {want:?} from the peer, got {got:?}");
        }
        Ok(())
    }

    pub fn send_info(&mut self, i: &PeerInfo) -> Result<()> {
        let gid: String = i.ep.gid.0.iter().map(|b| format!("{b:02x}")).collect();
        self.send(&format!(
            "QP {} {} {} {gid} MR {:#x} {:#x} {}",
            i.ep.qp_num, i.ep.psn, i.ep.lid, i.addr, i.rkey, i.len
        ))
    }

    pub fn recv_info(&mut self) -> Result<PeerInfo> {
        let line = self.recv()?;
        parse_info(&line).with_context(|| format!("bad QP info from the peer: {line:?}"))
    }
}

fn parse_info(line: &str) -> Result<PeerInfo> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() != 9 || f[0] != "QP" || f[5] != "MR" {
        bail!("wrong shape");
    }
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16);
    let gid_hex = f[4];
    if gid_hex.len() != 32 {
        bail!("GID must be 32 hex digits");
    }
    let mut gid = [0u8; 16];
    for (i, b) in gid.iter_mut().enumerate() {
        *b = u8::from_str_radix(&gid_hex[2 * i..2 * i + 2], 16).map_err(|e| anyhow!("GID: {e}"))?;
    }
    Ok(PeerInfo {
        ep: QpEndpoint {
            qp_num: f[1].parse()?,
            psn: f[2].parse()?,
            lid: f[3].parse()?,
            gid: Gid(gid),
        },
        addr: hex(f[6])?,
        rkey: hex(f[7])? as u32,
        len: f[8].parse()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_line_round_trips() {
        let gid = Gid::from_ipv4("10.10.0.1".parse().unwrap());
        let line = format!(
            "QP 17 100 4791 {} MR 0x7f00 0x1234 65536",
            gid.0.iter().map(|b| format!("{b:02x}")).collect::<String>()
        );
        let i = parse_info(&line).unwrap();
        assert_eq!(
            (i.ep.qp_num, i.ep.psn, i.ep.lid, i.ep.gid),
            (17, 100, 4791, gid)
        );
        assert_eq!((i.addr, i.rkey, i.len), (0x7f00, 0x1234, 65536));
        assert!(parse_info("QP 1 2").is_err());
        assert!(parse_info("QP x 2 3 00 MR 0 0 0").is_err());
    }
}

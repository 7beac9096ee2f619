//! [`IoBuf`]: the data of one command, in memory the transport owns.
//!
//! The transport (poll-group data buffers, or the in-capsule part of a receive slot) lends the
//! target a list of byte segments for one command. Synchronous block devices (null, malloc) and
//! the command logic use them through the borrow. The io_uring block device hands the
//! segments' addresses to the kernel, which reads or writes them after `submit` returns.
//!
//! # Contract for the lender (the transport glue)
//! When a command completes asynchronously (`Exec::Pending` / `Submitted::Queued`), the memory
//! behind every segment must stay allocated and must not be read or written by anyone else
//! until that command's completion has been reaped (the tag comes back from `poll`). Poll-group
//! buffers satisfy this naturally: a request keeps its buffers until its response is sent; an
//! in-capsule write's receive slot stays off the SRQ until its block I/O is done (see
//! `transport_glue::handler`). The memory is then treated like registered memory a NIC DMAs
//! into.

/// Most segments one command's data may span: the data buffers a poll-group request holds
/// (a 128 KiB transfer in 4 KiB io units is 32). It was 16 while a request held 32, and a file
/// namespace failed every transfer of more than 16 buffers.
pub const MAX_SEGMENTS: usize = nvmf_transport::pollgroup::MAX_REQUEST_BUFFERS;

/// The data segments of one command. See the module documentation for the lending contract.
pub struct IoBuf<'a, 'b> {
    segs: &'a mut [&'b mut [u8]],
    /// Every visible byte is known to be zero: set by the lender ([`IoBuf::set_zeroed`]) or by
    /// [`IoBuf::zero`] over all of them, cleared by every other way to write. Lets a device
    /// that reads zeroes skip filling a buffer that holds them already.
    zeroed: bool,
}

impl<'a, 'b> IoBuf<'a, 'b> {
    /// Segments in transfer order.
    pub fn new(segs: &'a mut [&'b mut [u8]]) -> Self {
        IoBuf {
            segs,
            zeroed: false,
        }
    }

    /// The lender's word that every visible byte is zero (see [`IoBuf::is_zeroed`]); call
    /// after [`IoBuf::truncate`], for the bytes the command sees.
    pub fn set_zeroed(&mut self, zeroed: bool) {
        self.zeroed = zeroed;
    }

    /// No data.
    pub fn empty() -> IoBuf<'static, 'static> {
        IoBuf {
            segs: &mut [],
            zeroed: false,
        }
    }

    /// True when every visible byte is known to be zero: the lender said so and nothing wrote
    /// them since, or [`IoBuf::zero`] covered them all.
    pub fn is_zeroed(&self) -> bool {
        self.zeroed
    }

    /// Total bytes.
    pub fn len(&self) -> usize {
        self.segs.iter().map(|s| s.len()).sum()
    }

    /// True when there is no data.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The segments.
    pub fn segments(&self) -> impl Iterator<Item = &[u8]> {
        self.segs.iter().map(|s| &**s)
    }

    /// The segments, writable.
    pub fn segments_mut(&mut self) -> impl Iterator<Item = &mut [u8]> {
        self.zeroed = false;
        self.segs.iter_mut().map(|s| &mut **s)
    }

    /// Copy `src` into the buffer at `offset`; returns bytes copied (short at the end).
    pub fn write_at(&mut self, mut offset: usize, mut src: &[u8]) -> usize {
        self.zeroed = false;
        let mut copied = 0;
        for seg in self.segs.iter_mut() {
            if src.is_empty() {
                break;
            }
            if offset >= seg.len() {
                offset -= seg.len();
                continue;
            }
            let n = (seg.len() - offset).min(src.len());
            seg[offset..offset + n].copy_from_slice(&src[..n]);
            src = &src[n..];
            copied += n;
            offset = 0;
        }
        copied
    }

    /// Copy from the buffer at `offset` into `dst`; returns bytes copied.
    pub fn read_at(&self, mut offset: usize, mut dst: &mut [u8]) -> usize {
        let mut copied = 0;
        for seg in self.segs.iter() {
            if dst.is_empty() {
                break;
            }
            if offset >= seg.len() {
                offset -= seg.len();
                continue;
            }
            let n = (seg.len() - offset).min(dst.len());
            dst[..n].copy_from_slice(&seg[offset..offset + n]);
            dst = &mut dst[n..];
            copied += n;
            offset = 0;
        }
        copied
    }

    /// Copy `src` to the start (as much as fits) and zero everything after it: how a command
    /// returning a data structure fills the host's buffer.
    pub fn fill_from(&mut self, src: &[u8]) {
        self.zeroed = false;
        let mut src = src;
        for seg in self.segs.iter_mut() {
            let n = seg.len().min(src.len());
            seg[..n].copy_from_slice(&src[..n]);
            seg[n..].fill(0);
            src = &src[n..];
        }
    }

    /// Zero the first `len` bytes (nothing to do when they are known to be zero already).
    pub fn zero(&mut self, len: usize) {
        if self.zeroed {
            return;
        }
        let mut left = len;
        for seg in self.segs.iter_mut() {
            let n = seg.len().min(left);
            seg[..n].fill(0);
            left -= n;
        }
        self.zeroed = len >= self.len();
    }

    /// Keep only the first `len` bytes visible (the command's transfer may be shorter than the
    /// buffers the transport gave).
    pub fn truncate(&mut self, mut len: usize) {
        let mut keep = 0;
        for seg in self.segs.iter_mut() {
            if len == 0 {
                break;
            }
            let n = seg.len().min(len);
            let taken = std::mem::take(seg);
            *seg = &mut taken[..n];
            len -= n;
            keep += 1;
        }
        let segs = std::mem::take(&mut self.segs);
        self.segs = &mut segs[..keep];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scatter_copies() {
        let mut a = [0u8; 3];
        let mut b = [0u8; 5];
        {
            let mut segs = [&mut a[..], &mut b[..]];
            let mut buf = IoBuf::new(&mut segs);
            assert_eq!(buf.len(), 8);
            assert_eq!(buf.write_at(2, &[1, 2, 3, 4, 5, 6, 7]), 6);
            let mut out = [0u8; 8];
            assert_eq!(buf.read_at(0, &mut out), 8);
            assert_eq!(out, [0, 0, 1, 2, 3, 4, 5, 6]);
            buf.truncate(4);
            assert_eq!(buf.len(), 4);
            buf.zero(4);
            assert_eq!(buf.read_at(0, &mut out[..4]), 4);
            assert_eq!(out[..4], [0, 0, 0, 0]);
        }
        assert_eq!(b, [0, 3, 4, 5, 6]);
    }

    #[test]
    fn zeroed_is_known_only_until_written() {
        let mut a = [7u8; 4];
        let mut b = [7u8; 4];
        {
            let mut segs = [&mut a[..], &mut b[..]];
            let mut buf = IoBuf::new(&mut segs);
            assert!(!buf.is_zeroed());
            buf.zero(6);
            assert!(!buf.is_zeroed(), "two bytes were not zeroed");
            buf.zero(8);
            assert!(buf.is_zeroed());
            buf.write_at(7, &[1]);
            assert!(!buf.is_zeroed());
            buf.zero(8);
            buf.fill_from(&[]);
            assert!(!buf.is_zeroed(), "fill_from writes");
            buf.zero(8);
            let _ = buf.segments_mut();
            assert!(!buf.is_zeroed(), "a writable view may write");
        }
        // The lender's word skips the fill: the bytes stay as they are.
        let mut c = [9u8; 4];
        let mut segs = [&mut c[..]];
        let mut buf = IoBuf::new(&mut segs);
        buf.set_zeroed(true);
        buf.zero(4);
        assert!(buf.is_zeroed());
        assert_eq!(c, [9; 4]);
    }
}

//! The malloc device: blocks in memory, shared by every reactor's channel without a lock.
//!
//! The store is an array of `AtomicU64` words accessed with relaxed loads and stores: reactors
//! read and write it concurrently with no lock and no `unsafe`. Blocks are at least 512 bytes and
//! aligned, so a word never straddles two blocks; two hosts writing the same block at once get
//! some mix of the two, which NVMe allows for overlapping unordered writes. Every I/O completes
//! during `submit`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::{
    Bdev, BdevChannel, BdevError, BdevInfo, BdevOp, IoBuf, IoStatus, Submitted, check_io, geometry,
};

/// A memory device.
pub struct MallocBdev {
    info: BdevInfo,
    store: Arc<Store>,
}

struct Store {
    words: Box<[AtomicU64]>,
}

impl Store {
    fn byte(&self, pos: usize) -> u8 {
        self.words[pos / 8].load(Relaxed).to_ne_bytes()[pos % 8]
    }
    fn set_byte(&self, pos: usize, v: u8) {
        let w = &self.words[pos / 8];
        let mut b = w.load(Relaxed).to_ne_bytes();
        b[pos % 8] = v;
        w.store(u64::from_ne_bytes(b), Relaxed);
    }

    /// Copy `src` to byte `pos`.
    fn write(&self, mut pos: usize, mut src: &[u8]) {
        while !src.is_empty() && pos % 8 != 0 {
            self.set_byte(pos, src[0]);
            pos += 1;
            src = &src[1..];
        }
        let mut words = src.chunks_exact(8);
        for (w, chunk) in self.words[pos / 8..].iter().zip(&mut words) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            w.store(u64::from_ne_bytes(b), Relaxed);
        }
        let tail = words.remainder();
        pos += src.len() - tail.len();
        for (i, v) in tail.iter().enumerate() {
            self.set_byte(pos + i, *v);
        }
    }

    /// Visit the bytes from `pos` on in word-sized pieces: `f(chunk_of_dst, bytes)`.
    fn read(&self, mut pos: usize, mut dst: &mut [u8]) {
        while !dst.is_empty() && pos % 8 != 0 {
            dst[0] = self.byte(pos);
            pos += 1;
            dst = &mut dst[1..];
        }
        let whole = dst.len() / 8 * 8;
        let (body, tail) = dst.split_at_mut(whole);
        for (w, chunk) in self.words[pos / 8..].iter().zip(body.chunks_exact_mut(8)) {
            chunk.copy_from_slice(&w.load(Relaxed).to_ne_bytes());
        }
        pos += whole;
        for (i, v) in tail.iter_mut().enumerate() {
            *v = self.byte(pos + i);
        }
    }

    /// True when the bytes at `pos` equal `src`.
    fn equals(&self, pos: usize, src: &[u8]) -> bool {
        let mut scratch = [0u8; 512];
        src.chunks(scratch.len()).enumerate().all(|(i, chunk)| {
            let s = &mut scratch[..chunk.len()];
            self.read(pos + i * 512, s);
            s == chunk
        })
    }

    fn zero(&self, pos: usize, len: usize) {
        // Block-aligned: whole words.
        for w in &self.words[pos / 8..(pos + len) / 8] {
            w.store(0, Relaxed);
        }
    }
}

impl MallocBdev {
    /// `size` zeroed bytes of `block_size` blocks.
    pub fn new(name: &str, block_size: u32, size: u64) -> Result<MallocBdev, BdevError> {
        let info = geometry(name, block_size, size)?;
        let words = usize::try_from(size / 8).map_err(|_| BdevError::Config {
            name: name.to_owned(),
            message: "too large for this machine".into(),
        })?;
        let store = Arc::new(Store {
            words: (0..words).map(|_| AtomicU64::new(0)).collect(),
        });
        Ok(MallocBdev { info, store })
    }
}

impl Bdev for MallocBdev {
    fn info(&self) -> &BdevInfo {
        &self.info
    }
    fn open_channel(&self) -> Result<Box<dyn BdevChannel>, BdevError> {
        Ok(Box::new(MallocChannel {
            info: self.info.clone(),
            store: self.store.clone(),
        }))
    }
}

struct MallocChannel {
    info: BdevInfo,
    store: Arc<Store>,
}

impl MallocChannel {
    fn offset(&self, lba: u64) -> usize {
        // In range (checked), so it fits the store's usize length.
        (lba * u64::from(self.info.block_size)) as usize
    }

    fn run(&self, op: BdevOp<'_>, data: &mut IoBuf<'_, '_>) -> Result<(), IoStatus> {
        match op {
            BdevOp::Read { lba, blocks } => {
                let mut left = check_io(&self.info, lba, blocks, data.len())?;
                let mut pos = self.offset(lba);
                for seg in data.segments_mut() {
                    let n = seg.len().min(left);
                    self.store.read(pos, &mut seg[..n]);
                    pos += n;
                    left -= n;
                }
            }
            BdevOp::Write { lba, blocks } | BdevOp::WriteFua { lba, blocks } => {
                let mut left = check_io(&self.info, lba, blocks, data.len())?;
                let mut pos = self.offset(lba);
                for seg in data.segments() {
                    let n = seg.len().min(left);
                    self.store.write(pos, &seg[..n]);
                    pos += n;
                    left -= n;
                }
            }
            BdevOp::Compare { lba, blocks } => {
                let mut left = check_io(&self.info, lba, blocks, data.len())?;
                let mut pos = self.offset(lba);
                for seg in data.segments() {
                    let n = seg.len().min(left);
                    if !self.store.equals(pos, &seg[..n]) {
                        return Err(IoStatus::CompareMismatch);
                    }
                    pos += n;
                    left -= n;
                }
            }
            BdevOp::WriteZeroes { lba, blocks, .. } => {
                let n = check_io(&self.info, lba, blocks, usize::MAX)?;
                self.store.zero(self.offset(lba), n);
            }
            BdevOp::Deallocate { ranges, .. } => {
                // All checked first: a bad range changes nothing.
                for r in ranges {
                    check_io(&self.info, r.lba, r.blocks, usize::MAX)?;
                }
                for r in ranges {
                    let n = r.blocks as usize * self.info.block_size as usize;
                    self.store.zero(self.offset(r.lba), n);
                }
            }
            BdevOp::Flush => {}
        }
        Ok(())
    }
}

impl BdevChannel for MallocChannel {
    fn submit(&mut self, op: BdevOp<'_>, data: &mut IoBuf<'_, '_>, _tag: u64) -> Submitted {
        Submitted::Done(self.run(op, data).err().unwrap_or(IoStatus::Success))
    }
    fn poll(&mut self, _done: &mut dyn FnMut(u64, IoStatus)) -> usize {
        0
    }
    fn in_flight(&self) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{exercise_storage, run};
    use super::*;

    #[test]
    fn malloc_storage_semantics() {
        exercise_storage(&MallocBdev::new("m", 512, 64 * 512).unwrap());
        exercise_storage(&MallocBdev::new("m", 4096, 16 * 4096).unwrap());
    }

    #[test]
    fn unaligned_segments_and_channels_share_data() {
        let b = MallocBdev::new("m", 512, 8 * 512).unwrap();
        let mut writer = b.open_channel().unwrap();
        let mut reader = b.open_channel().unwrap();
        let pattern: Vec<u8> = (0..1024).map(|i| (i % 251) as u8).collect();
        let (mut x, mut y) = (pattern[..3].to_vec(), pattern[3..].to_vec());
        let mut segs = [&mut x[..], &mut y[..]];
        let mut buf = IoBuf::new(&mut segs);
        assert_eq!(
            writer.submit(BdevOp::Write { lba: 1, blocks: 2 }, &mut buf, 1),
            Submitted::Done(IoStatus::Success)
        );
        let mut back = vec![0u8; 1024];
        assert_eq!(
            run(
                reader.as_mut(),
                BdevOp::Read { lba: 1, blocks: 2 },
                &mut back
            ),
            IoStatus::Success
        );
        assert_eq!(back, pattern);
    }
}

//! Anonymous memory mappings that a memory region can own (`Pd::reg_mr_owned`): page-aligned
//! and zero-filled, optionally backed by huge pages. The verbs provider's `alloc_mr` uses one.

use crate::error::{Result, TransportError};
use crate::provider::OwnedMemory;

/// A private anonymous mapping, unmapped on drop.
pub struct MappedMemory {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; nothing in it is thread-bound.
unsafe impl Send for MappedMemory {}

impl MappedMemory {
    /// `len` bytes of page-aligned, zeroed memory.
    pub fn new(len: usize) -> Result<MappedMemory> {
        Self::map(len, 0)
    }

    /// `len` bytes on huge pages (`MAP_HUGETLB`, the system's default huge page size; `len`
    /// a multiple of it). Fails where no huge pages are reserved (`vm.nr_hugepages`).
    pub fn new_huge(len: usize) -> Result<MappedMemory> {
        Self::map(len, libc::MAP_HUGETLB)
    }

    fn map(len: usize, extra: libc::c_int) -> Result<MappedMemory> {
        if len == 0 {
            return Err(TransportError::InvalidArgument(
                "a mapping of 0 bytes".into(),
            ));
        }
        // SAFETY: a fresh anonymous mapping; no existing memory is touched.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(TransportError::last_os("mmap"));
        }
        Ok(MappedMemory {
            ptr: ptr.cast(),
            len,
        })
    }
}

impl Drop for MappedMemory {
    fn drop(&mut self) {
        // SAFETY: mapped by `map` with this length, unmapped once; a region owning this value
        // deregisters before its fields drop.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

// SAFETY: the mapping does not move with the value and stays mapped until it drops.
unsafe impl OwnedMemory for MappedMemory {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_aligned_and_zeroed() {
        let mut m = MappedMemory::new(10_000).unwrap();
        assert_eq!(m.as_mut_ptr() as usize % 4096, 0);
        // SAFETY: the mapping is live, 10_000 bytes, and nothing else uses it.
        let s = unsafe { std::slice::from_raw_parts(m.as_mut_ptr(), m.len()) };
        assert!(s.iter().all(|&b| b == 0));
        assert!(MappedMemory::new(0).is_err());
    }
}

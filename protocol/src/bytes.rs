//! Little-endian field access over fixed-size byte images, the `wire_enum!` helper, and the
//! fixed-capacity string type used for NUL-terminated or padded wire strings.
//!
//! Decoders first turn the untrusted slice into a `&[u8; N]` with [`take`] (a length check that
//! returns [`ProtocolError::Truncated`]); afterwards every offset is a constant inside `N`, so
//! the readers below cannot go out of bounds.

use crate::error::{ProtocolError, Result};

/// Borrow the first `N` bytes of `buf` as an array, or report truncation.
#[inline]
pub(crate) fn take<'a, const N: usize>(buf: &'a [u8], what: &'static str) -> Result<&'a [u8; N]> {
    match buf.get(..N) {
        Some(s) => s.try_into().map_err(|_| ProtocolError::Truncated {
            what,
            need: N,
            got: buf.len(),
        }),
        None => Err(ProtocolError::Truncated {
            what,
            need: N,
            got: buf.len(),
        }),
    }
}

/// Borrow the first `N` bytes of `out` mutably, or report that the output is too small.
#[inline]
pub(crate) fn take_mut<'a, const N: usize>(
    out: &'a mut [u8],
    what: &'static str,
) -> Result<&'a mut [u8; N]> {
    let got = out.len();
    match out.get_mut(..N) {
        Some(s) => s
            .try_into()
            .map_err(|_| ProtocolError::BufferTooSmall { what, need: N, got }),
        None => Err(ProtocolError::BufferTooSmall { what, need: N, got }),
    }
}

#[inline]
pub(crate) fn rd8<const N: usize>(b: &[u8; N], off: usize) -> u8 {
    b[off]
}
#[inline]
pub(crate) fn rd16<const N: usize>(b: &[u8; N], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
#[inline]
pub(crate) fn rd32<const N: usize>(b: &[u8; N], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}
#[inline]
pub(crate) fn rd64<const N: usize>(b: &[u8; N], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}
#[inline]
pub(crate) fn rd128<const N: usize>(b: &[u8; N], off: usize) -> u128 {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[off..off + 16]);
    u128::from_le_bytes(a)
}
#[inline]
pub(crate) fn rdarr<const N: usize, const M: usize>(b: &[u8; N], off: usize) -> [u8; M] {
    let mut a = [0u8; M];
    a.copy_from_slice(&b[off..off + M]);
    a
}

#[inline]
pub(crate) fn wr8<const N: usize>(b: &mut [u8; N], off: usize, v: u8) {
    b[off] = v;
}
#[inline]
pub(crate) fn wr16<const N: usize>(b: &mut [u8; N], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}
#[inline]
pub(crate) fn wr32<const N: usize>(b: &mut [u8; N], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
#[inline]
pub(crate) fn wr64<const N: usize>(b: &mut [u8; N], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}
#[inline]
pub(crate) fn wr128<const N: usize>(b: &mut [u8; N], off: usize, v: u128) {
    b[off..off + 16].copy_from_slice(&v.to_le_bytes());
}
#[inline]
pub(crate) fn wrarr<const N: usize>(b: &mut [u8; N], off: usize, v: &[u8]) {
    b[off..off + v.len()].copy_from_slice(v);
}

/// Extract `width` bits starting at `shift`.
#[inline]
pub(crate) const fn bits32(v: u32, shift: u32, width: u32) -> u32 {
    (v >> shift) & ((1u32 << width) - 1)
}
/// Place the low `width` bits of `field` at `shift`.
#[inline]
pub(crate) const fn put32(field: u32, shift: u32, width: u32) -> u32 {
    (field & ((1u32 << width) - 1)) << shift
}
#[inline]
pub(crate) const fn bit32(v: u32, n: u32) -> bool {
    (v >> n) & 1 == 1
}
#[inline]
pub(crate) const fn flag32(b: bool, n: u32) -> u32 {
    (b as u32) << n
}

/// Declare a `u8`/`u16` code enum: named values plus `Unknown(raw)` for everything else, with
/// lossless `from_raw`/`raw` conversions. `Unknown` only ever holds an unnamed value when built
/// by `from_raw`.
macro_rules! wire_enum {
    (
        $(#[$m:meta])*
        $vis:vis enum $name:ident : $ty:ty {
            $( $(#[$vm:meta])* $var:ident = $val:literal ),+ $(,)?
        }
    ) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $name {
            $( $(#[$vm])* $var, )+
            /// A value this crate does not name.
            Unknown($ty),
        }
        impl $name {
            /// Decode a raw value; never fails.
            #[inline]
            pub const fn from_raw(v: $ty) -> Self {
                match v {
                    $( $val => Self::$var, )+
                    other => Self::Unknown(other),
                }
            }
            /// The raw wire value.
            #[inline]
            pub const fn raw(self) -> $ty {
                match self {
                    $( Self::$var => $val, )+
                    Self::Unknown(v) => v,
                }
            }
            /// Every named value (for tests and tables).
            pub const NAMED: &'static [Self] = &[ $( Self::$var, )+ ];
        }
        impl From<$ty> for $name {
            #[inline]
            fn from(v: $ty) -> Self { Self::from_raw(v) }
        }
        impl From<$name> for $ty {
            #[inline]
            fn from(v: $name) -> $ty { v.raw() }
        }
    };
}
pub(crate) use wire_enum;

/// A UTF-8 string of at most `N` bytes with no NUL inside, stored inline (`Copy`, no heap).
///
/// Wire strings are either NUL terminated/padded (NQNs, TRADDR, TRSVCID) or space padded
/// (serial and model numbers); decoding strips the terminator and trailing padding.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct FixedStr<const N: usize> {
    len: u16,
    buf: [u8; N],
}

impl<const N: usize> FixedStr<N> {
    /// The empty string.
    pub const EMPTY: Self = Self {
        len: 0,
        buf: [0; N],
    };

    /// Copy `s`, which must fit in `N` bytes and contain no NUL.
    pub fn new(s: &str, field: &'static str) -> Result<Self> {
        let b = s.as_bytes();
        if b.len() > N {
            return Err(ProtocolError::StringTooLong {
                field,
                len: b.len(),
                max: N,
            });
        }
        if b.contains(&0) {
            return Err(ProtocolError::EmbeddedNul { field });
        }
        let mut buf = [0u8; N];
        buf[..b.len()].copy_from_slice(b);
        Ok(Self {
            len: b.len() as u16,
            buf,
        })
    }

    /// Decode an ASCII wire field (Identify's SN, MN, FR) as [`FixedStr::from_field`] does,
    /// but a byte outside printable ASCII reads as `?` instead of failing the decode: one odd
    /// byte in a serial number must not make a controller unusable (the Linux host copies
    /// these fields as they are).
    pub fn from_ascii_field_lossy(field_bytes: &[u8], field: &'static str) -> Result<Self> {
        let ascii: Vec<u8> = field_bytes
            .iter()
            .map(|&c| match c {
                0 | 0x20..=0x7E => c,
                _ => b'?',
            })
            .collect();
        Self::from_field(&ascii, field)
    }

    /// Decode a wire field: the string ends at the first NUL (or the field's end), then trailing
    /// spaces are dropped (some peers space-pad).
    pub fn from_field(field_bytes: &[u8], field: &'static str) -> Result<Self> {
        let end = field_bytes
            .iter()
            .position(|&c| c == 0)
            .unwrap_or(field_bytes.len());
        let mut s = &field_bytes[..end];
        while let [rest @ .., b' '] = s {
            s = rest;
        }
        if s.len() > N {
            return Err(ProtocolError::StringTooLong {
                field,
                len: s.len(),
                max: N,
            });
        }
        let st = core::str::from_utf8(s).map_err(|_| ProtocolError::NotUtf8 { field })?;
        Self::new(st, field)
    }

    /// Write the string into `out`, padding the rest of `out` with `pad` (0 or b' ').
    /// `out` must be at least `len()` bytes; extra string bytes are never truncated silently.
    pub(crate) fn write_field(&self, out: &mut [u8], pad: u8) {
        let n = self.len();
        out[..n].copy_from_slice(self.as_bytes());
        out[n..].fill(pad);
    }

    /// The string.
    pub fn as_str(&self) -> &str {
        // Only built from &str (UTF-8) via `new`, so this cannot fail; fall back to "" anyway.
        core::str::from_utf8(self.as_bytes()).unwrap_or("")
    }
    /// The string's bytes (no terminator).
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len()]
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }
    /// True for the empty string.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<const N: usize> Default for FixedStr<N> {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl<const N: usize> core::fmt::Debug for FixedStr<N> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl<const N: usize> core::fmt::Display for FixedStr<N> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_reports_truncation() {
        let b = [1u8, 2, 3];
        assert_eq!(
            take::<4>(&b, "x"),
            Err(ProtocolError::Truncated {
                what: "x",
                need: 4,
                got: 3
            })
        );
        assert_eq!(take::<2>(&b, "x").unwrap(), &[1, 2]);
    }

    #[test]
    fn le_readers_and_writers() {
        let mut b = [0u8; 16];
        wr16(&mut b, 0, 0x0201);
        wr32(&mut b, 2, 0x0605_0403);
        wr64(&mut b, 6, 0x0e0d_0c0b_0a09_0807);
        assert_eq!(&b[..14], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]);
        assert_eq!(rd16(&b, 0), 0x0201);
        assert_eq!(rd32(&b, 2), 0x0605_0403);
        assert_eq!(rd64(&b, 6), 0x0e0d_0c0b_0a09_0807);
    }

    #[test]
    fn fixed_str_field_handling() {
        let s = FixedStr::<8>::from_field(b"abc\0zzzz", "f").unwrap();
        assert_eq!(s.as_str(), "abc");
        let s = FixedStr::<8>::from_field(b"abc     ", "f").unwrap();
        assert_eq!(s.as_str(), "abc");
        assert!(matches!(
            FixedStr::<2>::from_field(b"abc", "f"),
            Err(ProtocolError::StringTooLong { len: 3, max: 2, .. })
        ));
        assert!(matches!(
            FixedStr::<4>::from_field(&[0xff, 0xfe], "f"),
            Err(ProtocolError::NotUtf8 { .. })
        ));
        assert!(FixedStr::<4>::new("a\0", "f").is_err());
        // Identify's ASCII fields: an odd byte reads as '?', padding still goes.
        let s = FixedStr::<8>::from_ascii_field_lossy(&[b'S', 0xff, b'N', 0x07, b' ', b' '], "f")
            .unwrap();
        assert_eq!(s.as_str(), "S?N?");
        let s = FixedStr::<4>::from_ascii_field_lossy(b"ab\0\xfe", "f").unwrap();
        assert_eq!(s.as_str(), "ab");
        let mut out = [9u8; 6];
        FixedStr::<4>::new("ab", "f")
            .unwrap()
            .write_field(&mut out, b' ');
        assert_eq!(&out, b"ab    ");
    }
}

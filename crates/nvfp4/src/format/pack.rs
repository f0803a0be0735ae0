//! Two E2M1 codes per byte: the even-k element in the low nibble, the odd-k one in the high nibble
//! (torch `float4_e2m1fn_x2`, CUTLASS, cuBLAS).

/// Packs a slice of 4-bit codes (even length) into bytes.
pub fn pack_nibbles(codes: &[u8]) -> Vec<u8> {
    debug_assert!(codes.len().is_multiple_of(2));
    codes.chunks_exact(2).map(|p| (p[0] & 0xF) | ((p[1] & 0xF) << 4)).collect()
}

/// Unpacks bytes into 4-bit codes, two per byte, low nibble first.
pub fn unpack_nibbles(bytes: &[u8]) -> Vec<u8> {
    bytes.iter().flat_map(|&b| [b & 0xF, b >> 4]).collect()
}

/// The code of element `k` in a packed K-major row.
#[inline]
pub fn nibble(row: &[u8], k: usize) -> u8 {
    let byte = row[k / 2];
    if k.is_multiple_of(2) {
        byte & 0xF
    } else {
        byte >> 4
    }
}

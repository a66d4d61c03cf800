//! Header and data digests: CRC32C (Castagnoli) from the `crc32c` crate, sent little-endian.

/// CRC32C of `data`.
#[inline]
pub fn crc(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// Continue a CRC32C over more bytes (start from 0).
#[inline]
pub fn crc_append(crc: u32, data: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CRC32C check value ("123456789" -> 0xE3069283, RFC 3720 B.4) and the iSCSI test
    /// vector of 32 zero bytes (0x8A9136AA), the same digest iSCSI and NVMe/TCP use.
    #[test]
    fn crc32c_known_vectors() {
        assert_eq!(crc(b"123456789"), 0xe306_9283);
        assert_eq!(crc(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc_append(crc(b"1234"), b"56789"), 0xe306_9283);
    }
}

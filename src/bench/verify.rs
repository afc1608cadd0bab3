//! Self-describing blocks for `--verify`.
//!
//! Every block written carries a header (magic, its own offset, a generation
//! number) and a body generated from those, so a read can be checked byte for
//! byte: the header proves the block landed where it was meant to and is the
//! version expected, the body proves no byte was lost or torn.

/// Bytes of header at the start of a block.
pub const HEADER_BYTES: usize = 24;
const MAGIC: u64 = u64::from_le_bytes(*b"IOPATHv1");

fn body_seed(offset: u64, generation: u64) -> u64 {
    MAGIC ^ offset.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ generation.wrapping_mul(0xc2b2_ae3d_27d4_eb4f)
}

/// Fills `block` (at device `offset`) with version `generation`.
pub fn fill(block: &mut [u8], offset: u64, generation: u64) {
    debug_assert!(block.len() >= HEADER_BYTES);
    block[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    block[8..16].copy_from_slice(&offset.to_le_bytes());
    block[16..24].copy_from_slice(&generation.to_le_bytes());
    let mut rng = fastrand::Rng::with_seed(body_seed(offset, generation));
    for chunk in block[HEADER_BYTES..].chunks_mut(8) {
        let word = rng.u64(..).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
}

/// Checks that `block`, read at `offset`, is version `generation`; says what differs if not.
pub fn check(block: &[u8], offset: u64, generation: u64) -> Result<(), String> {
    let word = |i: usize| u64::from_le_bytes(block[i..i + 8].try_into().expect("8 bytes"));
    if block.len() < HEADER_BYTES || word(0) != MAGIC {
        return Err("no iopath header: the block was never written by iopath or was overwritten".into());
    }
    if word(8) != offset {
        return Err(format!("block belongs at offset {} (misdirected write or read)", word(8)));
    }
    if word(16) != generation {
        return Err(format!(
            "holds version {} but version {generation} was written last (lost or stale write)",
            word(16)
        ));
    }
    let mut rng = fastrand::Rng::with_seed(body_seed(offset, generation));
    for (n, chunk) in block[HEADER_BYTES..].chunks(8).enumerate() {
        let word = rng.u64(..).to_le_bytes();
        if let Some(i) = chunk.iter().zip(&word).position(|(a, b)| a != b) {
            let at = HEADER_BYTES + n * 8 + i;
            return Err(format!(
                "byte {at} of the block is {:#04x}, expected {:#04x} (torn or corrupt data)",
                block[at], word[i]
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filled_block_checks_and_any_change_is_caught() {
        let mut b = vec![0u8; 4096];
        fill(&mut b, 8192, 3);
        assert!(check(&b, 8192, 3).is_ok());
        assert!(check(&b, 4096, 3).unwrap_err().contains("offset 8192"));
        assert!(check(&b, 8192, 4).unwrap_err().contains("version 3"));
        b[4000] ^= 1;
        assert!(check(&b, 8192, 3).unwrap_err().contains("byte 4000"));
        assert!(check(&[0u8; 4096], 0, 1).unwrap_err().contains("never written"));
    }

    #[test]
    fn odd_sizes_work() {
        let mut b = vec![0u8; 512 + 4];
        fill(&mut b, 0, 1);
        assert!(check(&b, 0, 1).is_ok());
    }
}

//! Self-describing sectors: the data `--verify` writes and checks, and what
//! iopath lays out in a file it creates.
//!
//! Every 512-byte sector carries a header (magic, its own device offset, a
//! generation number) and a body generated from those, so a read can be
//! checked byte for byte: the header proves the sector landed where it was
//! meant to and is the version expected, the body proves no byte was lost or
//! torn. Because every sector describes itself, a read-only run can check a
//! target laid out earlier with any block size ([`check_any`]), without
//! knowing what was written last.
//!
//! A block is a run of sectors starting at its own offset; a block whose
//! length is not a multiple of 512 (possible on the emulated device, which
//! needs no alignment) ends in the prefix of a sector.

/// Bytes per self-describing unit.
pub const SECTOR: usize = 512;
/// Bytes of header at the start of every sector.
pub const HEADER_BYTES: usize = 24;
const MAGIC: u64 = u64::from_le_bytes(*b"IOPATHv2");

fn body_seed(offset: u64, generation: u64) -> u64 {
    MAGIC ^ offset.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ generation.wrapping_mul(0xc2b2_ae3d_27d4_eb4f)
}

/// Writes the sector image for device `offset` and `generation` into `out`
/// (a whole sector, or the prefix of one).
fn fill_sector(out: &mut [u8], offset: u64, generation: u64) {
    let mut image = [0u8; SECTOR];
    image[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    image[8..16].copy_from_slice(&offset.to_le_bytes());
    image[16..24].copy_from_slice(&generation.to_le_bytes());
    let mut rng = fastrand::Rng::with_seed(body_seed(offset, generation));
    for chunk in image[HEADER_BYTES..].chunks_mut(8) {
        let word = rng.u64(..).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
    out.copy_from_slice(&image[..out.len()]);
}

/// Fills `block` (at device `offset`) with version `generation`.
pub fn fill(block: &mut [u8], offset: u64, generation: u64) {
    for (i, sector) in block.chunks_mut(SECTOR).enumerate() {
        fill_sector(sector, offset + (i * SECTOR) as u64, generation);
    }
}

fn word(bytes: &[u8], at: usize) -> Option<u64> {
    bytes.get(at..at + 8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

/// Checks one sector (or sector prefix) against the image of `generation`.
fn check_sector(got: &[u8], offset: u64, generation: u64, block_offset: u64) -> Result<(), String> {
    let mut want = [0u8; SECTOR];
    fill_sector(&mut want[..got.len()], offset, generation);
    match got.iter().zip(&want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(format!(
            "byte {} of the block is {:#04x}, expected {:#04x} (torn or corrupt data)",
            (offset - block_offset) as usize + i,
            got[i],
            want[i]
        )),
    }
}

/// The header of a sector read at `offset`: its generation, or why it has none.
fn header(sector: &[u8], offset: u64) -> Result<u64, String> {
    if sector.len() < HEADER_BYTES || word(sector, 0) != Some(MAGIC) {
        return Err(format!(
            "no iopath pattern in the sector at offset {offset}: it was never written by iopath, or was \
             overwritten by something else"
        ));
    }
    let at = word(sector, 8).expect("header present");
    if at != offset {
        return Err(format!("the sector at offset {offset} belongs at offset {at} (misdirected write or read)"));
    }
    Ok(word(sector, 16).expect("header present"))
}

/// Checks that `block`, read at `offset`, is version `generation`; says what differs if not.
pub fn check(block: &[u8], offset: u64, generation: u64) -> Result<(), String> {
    for (i, sector) in block.chunks(SECTOR).enumerate() {
        let at = offset + (i * SECTOR) as u64;
        if sector.len() >= HEADER_BYTES {
            let found = header(sector, at)?;
            if found != generation {
                return Err(format!(
                    "holds version {found} but version {generation} was written last (lost or stale write)"
                ));
            }
        }
        check_sector(sector, at, generation, offset)?;
    }
    Ok(())
}

/// Checks that every sector of `block`, read at `offset`, is an intact iopath
/// sector of whatever version it says it is (a read-only check of a target
/// laid out earlier). The block must be made of whole sectors.
pub fn check_any(block: &[u8], offset: u64) -> Result<(), String> {
    for (i, sector) in block.chunks(SECTOR).enumerate() {
        let at = offset + (i * SECTOR) as u64;
        let generation = header(sector, at)?;
        check_sector(sector, at, generation, offset)?;
    }
    Ok(())
}

/// Whether `bytes`, read at device `offset`, start with an iopath sector.
pub fn is_pattern(bytes: &[u8], offset: u64) -> bool {
    header(bytes, offset).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filled_block_checks_and_any_change_is_caught() {
        let mut b = vec![0u8; 4096];
        fill(&mut b, 8192, 3);
        assert!(check(&b, 8192, 3).is_ok());
        assert!(check_any(&b, 8192).is_ok());
        assert!(check(&b, 4096, 3).unwrap_err().contains("belongs at offset 8192"));
        assert!(check(&b, 8192, 4).unwrap_err().contains("version 3"));
        b[4000] ^= 1;
        assert!(check(&b, 8192, 3).unwrap_err().contains("byte 4000"));
        assert!(check_any(&b, 8192).unwrap_err().contains("byte 4000"));
        assert!(check(&[0u8; 4096], 0, 1).unwrap_err().contains("never written"));
    }

    #[test]
    fn sectors_describe_themselves_whatever_the_block_size() {
        // Laid out as 16 KiB blocks of version 2 and 5, read back as 4 KiB blocks.
        let mut region = vec![0u8; 32768];
        fill(&mut region[..16384], 0, 2);
        fill(&mut region[16384..], 16384, 5);
        for (i, block) in region.chunks(4096).enumerate() {
            assert!(check_any(block, (i * 4096) as u64).is_ok(), "block {i}");
        }
        assert!(check(&region[4096..8192], 4096, 2).is_ok());
        assert!(check(&region[20480..24576], 20480, 5).is_ok());
    }

    #[test]
    fn odd_sizes_work() {
        let mut b = vec![0u8; 512 + 4];
        fill(&mut b, 0, 1);
        assert!(check(&b, 0, 1).is_ok());
        let mut b = vec![0u8; 3000];
        fill(&mut b, 3000, 7);
        assert!(check(&b, 3000, 7).is_ok());
        b[2999] ^= 0x10;
        assert!(check(&b, 3000, 7).is_err());
    }
}

//! Reading back-to-back Kafka v2 record batches, as a Raftline fetch answers them: each data
//! record's offset and value, without copying (the consumer reads only a value's stamp).

const HEADER_SIZE: usize = 61; // base offset .. records count
const CODEC_MASK: i16 = 0x07;
const CONTROL_MASK: i16 = 0x20;

fn be_i64(data: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(data[at..at + 8].try_into().unwrap())
}

fn be_i32(data: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(data[at..at + 4].try_into().unwrap())
}

/// A zigzag varint at `*at`, which moves past it.
fn varint(data: &[u8], at: &mut usize) -> Result<i64, String> {
    let mut value: u64 = 0;
    for shift in (0..64).step_by(7) {
        let byte = *data.get(*at).ok_or("record cut short inside a varint")?;
        *at += 1;
        value |= ((byte & 0x7F) as u64) << shift;
        if byte & 0x80 == 0 {
            return Ok((value >> 1) as i64 ^ -((value & 1) as i64));
        }
    }
    Err("varint longer than 10 bytes".into())
}

/// Calls `on_value(offset, value)` for each data record at `start` or later, in order (a
/// null value is an empty slice); control batches are skipped. Returns how many records it
/// passed on. A trailing partial batch ends the walk; a compressed batch is an error (the
/// generator never compresses, so one means another producer wrote the topic).
pub fn each_value(
    data: &[u8],
    start: i64,
    mut on_value: impl FnMut(i64, &[u8]),
) -> Result<u64, String> {
    let (mut at, mut passed) = (0usize, 0u64);
    while data.len() - at >= HEADER_SIZE {
        let batch = &data[at..];
        let size = 12 + be_i32(batch, 8) as usize;
        if size < HEADER_SIZE || size > batch.len() {
            break;
        }
        at += size;
        if batch[16] != 2 {
            return Err(format!("record batch magic {} (want 2)", batch[16]));
        }
        let attributes = i16::from_be_bytes([batch[21], batch[22]]);
        if attributes & CONTROL_MASK != 0 {
            continue;
        }
        if attributes & CODEC_MASK != 0 {
            return Err(format!(
                "compressed record batch (codec {})",
                attributes & CODEC_MASK
            ));
        }
        let base_offset = be_i64(batch, 0);
        let records = &batch[..size];
        let mut next = HEADER_SIZE;
        for _ in 0..be_i32(batch, 57) {
            let length = varint(records, &mut next)? as usize;
            let end = next + length;
            if end > records.len() {
                return Err("record runs past its batch".into());
            }
            let mut field = next + 1; // attributes
            varint(records, &mut field)?; // timestamp delta
            let offset = base_offset + varint(records, &mut field)?;
            let key_length = varint(records, &mut field)?;
            field += key_length.max(0) as usize;
            let value_length = varint(records, &mut field)?;
            let value_end = field + value_length.max(0) as usize;
            if value_end > end {
                return Err("record value runs past its record".into());
            }
            if offset >= start {
                on_value(offset, &records[field..value_end]);
                passed += 1;
            }
            next = end;
        }
    }
    Ok(passed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raftline::record_batch_with_offsets;

    /// A batch of `count` 16-byte values at `base`, value i's first 8 bytes i (little-endian).
    fn batch(base: i64, count: usize) -> Vec<u8> {
        let (mut bytes, offsets) = record_batch_with_offsets(count, &[0u8; 16]);
        bytes[..8].copy_from_slice(&base.to_be_bytes());
        for (i, at) in offsets.iter().enumerate() {
            bytes[*at..*at + 8].copy_from_slice(&(i as i64).to_le_bytes());
        }
        bytes
    }

    fn values(data: &[u8], start: i64) -> Vec<(i64, i64)> {
        let mut seen = Vec::new();
        each_value(data, start, |offset, value| {
            seen.push((offset, i64::from_le_bytes(value[..8].try_into().unwrap())))
        })
        .unwrap();
        seen
    }

    #[test]
    fn reads_every_records_offset_and_value_across_batches() {
        let data = [batch(10, 200), batch(210, 3)].concat();
        let seen = values(&data, 0);
        assert_eq!(seen.len(), 203);
        assert_eq!(seen[0], (10, 0));
        assert_eq!(seen[199], (209, 199));
        assert_eq!(seen[200..], [(210, 0), (211, 1), (212, 2)]);
    }

    #[test]
    fn skips_records_before_the_fetched_offset() {
        let seen = values(&batch(10, 5), 13);
        assert_eq!(seen, [(13, 3), (14, 4)]);
    }

    #[test]
    fn skips_control_batches_and_ends_at_a_partial_batch() {
        let mut control = batch(0, 1);
        control[22] |= CONTROL_MASK as u8;
        let whole = batch(1, 2);
        let data = [control, whole.clone(), whole[..40].to_vec()].concat();
        assert_eq!(values(&data, 0), [(1, 0), (2, 1)]);
    }

    #[test]
    fn refuses_a_compressed_batch() {
        let mut compressed = batch(0, 1);
        compressed[22] |= 1;
        assert!(each_value(&compressed, 0, |_, _| {}).is_err());
    }

    #[test]
    fn decodes_zigzag_varints() {
        let mut at = 0;
        let data = [0x01, 0x02, 0xAC, 0x02];
        assert_eq!(varint(&data, &mut at).unwrap(), -1);
        assert_eq!(varint(&data, &mut at).unwrap(), 1);
        assert_eq!(varint(&data, &mut at).unwrap(), 150);
        assert_eq!(at, 4);
    }
}
